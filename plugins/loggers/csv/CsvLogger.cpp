// Logger `csv`: one wide CSV file, a header line and one row per optimizer
// step with the columns of metrics.jsonl, flushed per row. Doubles carry 17
// significant digits (non-finite ones are written nan / inf; a memory
// figure that does not apply to the device is left empty), so a
// spreadsheet or pandas sees exactly what the jsonl file holds.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

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

std::vector<std::string> split_commas(const std::string& line) {
  std::vector<std::string> fields;
  std::istringstream in(line);
  std::string field;
  while (std::getline(in, field, ',')) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  return fields;
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
  // A file written by a version with other columns (a metric added or
  // removed since) keeps every value under its name: its rows move into
  // this version's columns (empty where they had none), and a column this
  // version no longer writes stays at the end, empty in the new rows.
  void start(const RunInfo& info) override {
    std::string names = header();
    ConvertLine convert;
    std::ifstream earlier(path_);
    std::string first;
    if (info.first_step > 0 && earlier && std::getline(earlier, first) && first != names) {
      const std::vector<std::string> old_names = split_commas(first);
      std::vector<std::string> now = split_commas(names);
      for (const std::string& name : old_names) {
        if (std::find(now.begin(), now.end(), name) == now.end()) {
          now.push_back(name);
          names += "," + name;
          ++kept_columns_;
        }
      }
      std::vector<int> source;  // per column now, its index in the old rows (-1: none)
      for (const std::string& name : now) {
        const auto at = std::find(old_names.begin(), old_names.end(), name);
        source.push_back(at == old_names.end() ? -1 : static_cast<int>(at - old_names.begin()));
      }
      convert = [source](const std::string& line) {
        const std::vector<std::string> fields = split_commas(line);
        std::string row;
        for (size_t i = 0; i < source.size(); ++i) {
          if (i > 0) row += ",";
          if (source[i] >= 0 && static_cast<size_t>(source[i]) < fields.size()) row += fields[source[i]];
        }
        return row;
      };
    }
    earlier.close();
    file_.open_lines(path_, info.first_step, names + "\n", step_of_row, convert);
  }

  void log(const StepRecord& r) override {
    std::string row;
    for (const MetricField& f : metric_fields(r)) {
      if (!row.empty()) row += ",";
      if (f.kind == MetricField::Kind::Real)
        row += fmt::format("{:.17g}", f.value);
      else if (std::isfinite(f.value))
        row += fmt::format("{:.0f}", f.value);  // unknown: empty
    }
    file_.write(row + std::string(kept_columns_, ',') + "\n");
  }

  void finish() override { file_.finish(); }

 private:
  std::filesystem::path path_;
  StepFile file_;
  size_t kept_columns_ = 0;  ///< columns of an earlier version's file that this one does not write
};

constexpr KeySpec kKeys[] = {
    {"path", ValueType::String, "'metrics.csv'", "output file, relative to the run's output directory"},
};

}  // namespace

TRAINER_DEFINE_PLUGIN(Logger, CsvLogger, "csv", "0.1.0", "one CSV row per optimizer step", kKeys)
