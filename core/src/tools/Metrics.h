// Reads metrics.jsonl files (one flat JSON object per optimizer step), for
// `trainer compare` and the tests.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace trainer {

/// Numeric fields of one record; booleans read as 0/1, null as NaN, and
/// strings are dropped.
using MetricsRow = std::map<std::string, double>;

/// Throws InputError naming the file and line of a malformed record. A
/// last line without its newline that does not parse (a run still writing
/// it, or one stopped while writing it) is left out; when `left_out` is
/// given it receives a sentence naming file:line, else it stays empty.
std::vector<MetricsRow> read_metrics(const std::string& path, std::string* left_out = nullptr);

}  // namespace trainer
