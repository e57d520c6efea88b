// A small reader for the flat JSON objects the jsonl logger writes.
#include "tools/Metrics.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/util/JsonSupport.h"

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
      record = json_parse(line);
    } catch (const std::exception& error) {
      throw InputError(fmt::format("{}:{}: malformed metrics record: {}", path, number, error.what()));
    }
    if (!record.is_object())
      throw InputError(fmt::format("{}:{}: malformed metrics record: not an object", path, number));
    MetricsRow row;
    for (const auto& item : record.items()) {
      const Json& value = item.value();
      if (value.is_number())
        row[item.key()] = value.get<double>();
      else if (value.is_boolean())
        row[item.key()] = value.get<bool>() ? 1.0 : 0.0;
      else if (value.is_null())
        row[item.key()] = std::numeric_limits<double>::quiet_NaN();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace trainer
