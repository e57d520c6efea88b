// libFuzzer target: one line of a jsonl dataset (text or token-id records).
// Any input either becomes a sample that respects the format (ids below the
// vocabulary, one target flag per token, at most seq_len + 1 tokens) or
// throws; it must never crash or hang.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "JsonlRecord.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const trainer::JsonlRecordFormat format{64, 300, true};
  try {
    const trainer::Sample s =
        trainer::parse_jsonl_record(std::string(reinterpret_cast<const char*>(data), size), format);
    if (s.tokens.size() != s.target.size() || s.tokens.size() < 2 ||
        s.tokens.size() > static_cast<size_t>(format.seq_len + 1)) {
      __builtin_trap();
    }
    for (const int32_t id : s.tokens) {
      if (id < 0 || id >= format.vocab_size) __builtin_trap();
    }
  } catch (const std::exception&) {
  }
  return 0;
}
