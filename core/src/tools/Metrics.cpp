// A small reader for the flat JSON objects the jsonl logger writes.
#include "tools/Metrics.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/util/JsonSupport.h"
#include "util/Files.h"

namespace trainer {

std::vector<MetricsRow> read_metrics(const std::string& path, std::string* left_out) {
  const std::optional<std::string> text = read_file(path);
  if (!text) throw InputError(fmt::format("{}: cannot open metrics file", path));
  std::vector<MetricsRow> rows;
  for (size_t at = 0, number = 1; at < text->size(); ++number) {
    const size_t end = text->find('\n', at);
    const bool unterminated = end == std::string::npos;  // the last line, without its newline
    const std::string line = text->substr(at, unterminated ? std::string::npos : end - at);
    at = unterminated ? text->size() : end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json record;
    try {
      record = json_parse(line);
    } catch (const std::exception& error) {
      if (unterminated) {  // a run still writing it, or one stopped while writing it
        if (left_out != nullptr) {
          *left_out = fmt::format(
              "{}:{}: an incomplete last record (a run still writing it, or stopped while writing it); left out", path,
              number);
        }
        break;
      }
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
