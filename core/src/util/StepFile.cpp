// The file loggers' output files (see trainer/util/StepFile.h).
#include "trainer/util/StepFile.h"

#include <mutex>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "util/Files.h"
#include "util/OutputClaims.h"

namespace trainer {

namespace fs = std::filesystem;

fs::path run_path(const std::string& path, const Context& context) {
  fs::path out(path);
  return out.is_relative() ? fs::path(context.output_dir) / out : out;
}

namespace {

struct Claims {
  std::mutex mutex;
  std::filesystem::path output_dir;
  std::vector<OutputClaim> claims;
};

Claims& claims() {
  static Claims instance;
  return instance;
}

// Absolute, with symbolic links of the existing part resolved and "." and
// ".." gone, so that two spellings of one file compare equal.
fs::path normal(const fs::path& path) {
  std::error_code error;
  fs::path out = fs::weakly_canonical(fs::absolute(path), error);
  return error ? fs::absolute(path).lexically_normal() : out;
}

// `inner` is `outer` or lies below it.
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

bool path_within(const fs::path& inner, const fs::path& outer) { return within(normal(inner), normal(outer)); }

void begin_output_claims(const fs::path& output_dir, const std::vector<OutputClaim>& own) {
  Claims& c = claims();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.output_dir = normal(output_dir);
  c.claims.clear();
  for (OutputClaim claim : own) {
    claim.path = normal(claim.path);
    c.claims.push_back(claim);
  }
}

void end_output_claims() {
  Claims& c = claims();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.output_dir.clear();
  c.claims.clear();
}

std::string add_output_claim(const OutputClaim& wanted) {
  Claims& c = claims();
  std::lock_guard<std::mutex> lock(c.mutex);
  OutputClaim claim = wanted;
  claim.path = normal(claim.path);
  if (!c.output_dir.empty() && claim.path == c.output_dir) return "the run's output directory";
  for (const OutputClaim& held : c.claims) {
    if (within(claim.path, held.path) || within(held.path, claim.path)) return held.owner;
  }
  c.claims.push_back(claim);
  return "";
}

fs::path claim_run_path(const Options& options, const std::string& key, const Context& context, bool directory) {
  const fs::path path = run_path(options.text(key), context);
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::exists(status) && fs::is_directory(status) != directory) {
    options.fail(key, fmt::format("a {} to write; {} is {}", directory ? "directory" : "file", path.string(),
                                  fs::is_directory(status) ? "a directory" : "a file"));
  }
  const std::string taken =
      add_output_claim(OutputClaim{path, fmt::format("[{}] {}", options.section(), key), directory});
  if (!taken.empty()) {
    options.fail(key, fmt::format("an output of its own; {} is, contains or lies inside {}", path.string(), taken));
  }
  return path;
}

void keep_steps_until(const std::string& path, int64_t last_step, const std::string& prefix,
                      const StepOfLine& step_of) {
  keep_steps_until(path, last_step, prefix, step_of, nullptr);
}

void keep_steps_until(const std::string& path, int64_t last_step, const std::string& prefix, const StepOfLine& step_of,
                      const ConvertLine& convert) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept = prefix, line;
  while (std::getline(in, line)) {
    const std::optional<int64_t> step = step_of(line);
    if (step && *step <= last_step) kept += (convert ? convert(line) : line) + "\n";
  }
  write_file_atomically(path, kept);
}

void StepFile::open_lines(const fs::path& path, int64_t first_step, const std::string& header,
                          const StepOfLine& step_of) {
  open_lines(path, first_step, header, step_of, nullptr);
}

void StepFile::open_lines(const fs::path& path, int64_t first_step, const std::string& header,
                          const StepOfLine& step_of, const ConvertLine& convert) {
  path_ = path;
  // Left by a run killed while keep_steps_until rewrote this file (a logger's file has one writer: the run
  // that claimed its path).
  remove_files_left_beside(path_, "a run");
  if (first_step > 0 && fs::exists(path_)) {
    keep_steps_until(path_.string(), first_step, header, step_of, convert);
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
