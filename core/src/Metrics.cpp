// A small reader for the flat JSON objects the jsonl logger writes.
#include "Metrics.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/Json.h"

namespace trainer {

std::vector<MetricsRow> read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open metrics file", path));
  std::vector<MetricsRow> rows;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json record;
    try {
      record = Json::parse(line);
    } catch (const std::exception& error) {
      throw InputError(fmt::format("{}:{}: malformed metrics record at {}", path, number, error.what()));
    }
    if (!record.is_object()) throw InputError(fmt::format("{}:{}: malformed metrics record: not an object", path, number));
    MetricsRow row;
    for (const auto& [key, value] : record.members()) {
      if (value.is_number()) row[key] = value.as_double();
      else if (value.is_bool()) row[key] = value.as_bool() ? 1.0 : 0.0;
      else if (value.is_null()) row[key] = std::numeric_limits<double>::quiet_NaN();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace trainer
