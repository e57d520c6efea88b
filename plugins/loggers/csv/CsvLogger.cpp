// Logger `csv`: one wide CSV file, a header line and one row per optimizer
// step with the columns of metrics.jsonl, flushed per row. Doubles carry 17
// significant digits (non-finite ones are written nan / inf; a memory
// figure that does not apply to the device is left empty), so a
// spreadsheet or pandas sees exactly what the jsonl file holds.
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "trainer/Logger.h"
#include "trainer/util/StepFile.h"

namespace {

using namespace trainer;

// The header: the names of metric_fields, in order.
std::string header() {
  std::string names;
  for (const MetricField& f : metric_fields(StepRecord{})) names += (names.empty() ? "" : ",") + std::string(f.name);
  return names;
}

// A row's step is its first column; the header and a torn last row have none.
std::optional<int64_t> step_of_row(const std::string& line) {
  const size_t comma = line.find(',');
  if (comma == std::string::npos) return std::nullopt;
  try {
    return std::stoll(line.substr(0, comma));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

class CsvLogger final : public Logger {
 public:
  CsvLogger(const Options& options, const Context& context) : path_(claim_run_path(options, "path", context)) {}

  // A resumed run continues the file: the header and the rows up to the
  // checkpoint's step are kept, later ones (written before a crash) dropped.
  void start(const RunInfo& info) override { file_.open_lines(path_, info.first_step, header() + "\n", step_of_row); }

  void log(const StepRecord& r) override {
    std::string row;
    for (const MetricField& f : metric_fields(r)) {
      if (!row.empty()) row += ",";
      if (f.kind == MetricField::Kind::Real)
        row += fmt::format("{:.17g}", f.value);
      else if (std::isfinite(f.value))
        row += fmt::format("{:.0f}", f.value);  // unknown: empty
    }
    file_.write(row + "\n");
  }

  void finish() override { file_.finish(); }

 private:
  std::filesystem::path path_;
  StepFile file_;
};

constexpr KeySpec kKeys[] = {
    {"path", ValueType::String, "'metrics.csv'", "output file, relative to the run's output directory"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Logger, CsvLogger, "csv", "0.1.0", "one CSV row per optimizer step", kKeys)
