// The file loggers' output files (see trainer/util/StepFile.h).
#include "trainer/util/StepFile.h"

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "util/Files.h"

namespace trainer {

namespace fs = std::filesystem;

fs::path run_path(const std::string& path, const Context& context) {
  fs::path out(path);
  return out.is_relative() ? fs::path(context.output_dir) / out : out;
}

void keep_steps_until(const std::string& path, int64_t last_step, const std::string& prefix,
                      const StepOfLine& step_of) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept = prefix, line;
  while (std::getline(in, line)) {
    const std::optional<int64_t> step = step_of(line);
    if (step && *step <= last_step) kept += line + "\n";
  }
  write_file_atomically(path, kept);
}

void StepFile::open_lines(const fs::path& path, int64_t first_step, const std::string& header,
                          const StepOfLine& step_of) {
  path_ = path;
  if (first_step > 0 && fs::exists(path_)) {
    keep_steps_until(path_.string(), first_step, header, step_of);
    out_.open(path_, std::ios::app);
  } else {
    out_.open(path_, std::ios::trunc);
    out_ << header;
  }
  if (!out_) throw InputError(fmt::format("{}: cannot open for writing", path_.string()));
}

void StepFile::open_binary(const fs::path& path) {
  path_ = path;
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw InputError(fmt::format("{}: cannot open for writing", path_.string()));
}

void StepFile::write(const std::string& bytes) {
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out_.flush();
  if (!out_) throw TrainingError(fmt::format("{}: write failed", path_.string()));
}

void StepFile::finish() {
  if (out_.is_open()) out_.flush();
}

}  // namespace trainer
