// One line of the jsonl dataset turned into a sample, free of LibTorch so
// that a fuzz target (tests/fuzz) reaches it.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/Dataset.h"

namespace trainer {

struct JsonlRecordFormat {
  int64_t seq_len;     ///< inputs per sample: longer records are truncated to seq_len + 1 tokens
  int64_t vocab_size;  ///< token ids are below this
  bool completion_only;
};

/// A record {"prompt", "completion"} (text: byte tokens, BOS and EOS added)
/// or {"prompt_ids", "completion_ids"} (token ids as given). Throws
/// std::runtime_error saying what is wrong (the caller adds file and line).
Sample parse_jsonl_record(const std::string& line, const JsonlRecordFormat& format);

}  // namespace trainer
