// The token-id file of `trainer forward`: one sequence per line, ids
// separated by spaces or tabs, every line of one length. No LibTorch here
// (a fuzz target of its own).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

/// Parses `text` (the contents of `file`, named in messages). Blank lines
/// are skipped. InputError naming the file, line and token for anything
/// that is not a decimal id in [0, vocab_size), a line of another length
/// than the first, or no ids at all.
std::vector<std::vector<int64_t>> parse_token_rows(const std::string& text, const std::string& file,
                                                   int64_t vocab_size);

}  // namespace trainer
