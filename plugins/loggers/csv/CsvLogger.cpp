// Logger `csv`: one wide CSV file, a header line and one row per optimizer
// step with the columns of metrics.jsonl, flushed per row. Doubles carry 17
// significant digits (non-finite ones are written nan / inf; a memory
// figure that does not apply to the device is left empty), so a
// spreadsheet or pandas sees exactly what the jsonl file holds.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/Logger.h"

namespace {

using namespace trainer;

// The header: the names of metric_fields, in order.
std::string header() {
  std::string names;
  for (const MetricField& f : metric_fields(StepRecord{})) names += (names.empty() ? "" : ",") + std::string(f.name);
  return names;
}

class CsvLogger final : public Logger {
 public:
  CsvLogger(const Options& options, const Context& context) {
    path_ = std::filesystem::path(options.text("path"));
    if (path_.is_relative()) path_ = std::filesystem::path(context.output_dir) / path_;
  }

  void start(const RunInfo& info) override {
    if (info.first_step > 0 && std::filesystem::exists(path_)) {
      keep_until(info.first_step);
      out_.open(path_, std::ios::app);
    } else {
      out_.open(path_, std::ios::trunc);
      out_ << header() << "\n";
    }
    if (!out_) throw InputError(fmt::format("{}: cannot open for writing", path_.string()));
  }

  void log(const StepRecord& r) override {
    std::string row;
    for (const MetricField& f : metric_fields(r)) {
      if (!row.empty()) row += ",";
      if (f.kind == MetricField::Kind::Real) row += fmt::format("{:.17g}", f.value);
      else if (std::isfinite(f.value)) row += fmt::format("{:.0f}", f.value);  // unknown: empty
    }
    out_ << row << "\n";
    out_.flush();
    if (!out_) throw TrainingError(fmt::format("{}: write failed", path_.string()));
  }

  void finish() override {
    if (out_.is_open()) out_.flush();
  }

 private:
  // A resumed run continues the file: the header and the rows up to the
  // checkpoint's step are kept, later ones (written before a crash) dropped.
  void keep_until(int64_t last_step) {
    keep_steps_until(path_.string(), last_step, header() + "\n", [](const std::string& line) -> std::optional<int64_t> {
      const size_t comma = line.find(',');
      if (comma == std::string::npos) return std::nullopt;  // a torn last row of a crashed run
      try {
        return std::stoll(line.substr(0, comma));
      } catch (const std::exception&) {
        return std::nullopt;  // the header, or a torn last row
      }
    });
  }

  std::filesystem::path path_;
  std::ofstream out_;
};

constexpr KeySpec kKeys[] = {
    {"path", ValueType::String, "'metrics.csv'", "output file, relative to the run's output directory"},
};

Component* create(const Options& options, const Context& context) { return new CsvLogger(options, context); }

const PluginDescriptor* describe() {
  static const PluginDescriptor descriptor{kAbiVersion, PluginKind::Logger, "csv", "0.1.0",
                                           "one CSV row per optimizer step", TRAINER_TORCH_VERSION, kKeys,
                                           std::size(kKeys), &create};
  return &descriptor;
}

}  // namespace

TRAINER_PLUGIN(describe)
