// One line of the jsonl dataset turned into a sample, free of LibTorch so
// that a fuzz target (tests/fuzz) reaches it.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/Dataset.h"

namespace trainer {

class Tokenizer;

struct JsonlRecordFormat {
  int64_t seq_len;     ///< inputs per sample: longer records are truncated to seq_len + 1 tokens
  int64_t vocab_size;  ///< token ids are below this
  bool completion_only;
  const Tokenizer* tokenizer = nullptr;  ///< for text; none: byte b is token b, BOS 256, EOS 257
};

/// A record {"prompt", "completion"} (text: tokenized, the tokenizer's BOS
/// before the prompt and EOS after the completion where it has them), {"text"}
/// (a plain pretraining line, the same BOS and EOS, every token a target) or
/// {"prompt_ids", "completion_ids"} (token ids as given). Throws
/// std::runtime_error saying what is wrong (the caller adds file and line).
Sample parse_jsonl_record(const std::string& line, const JsonlRecordFormat& format);

}  // namespace trainer
