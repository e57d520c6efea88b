// libFuzzer target: `trainer forward`'s token file on arbitrary bytes. Every
// input is either refused as bad input (InputError) or parsed into rows of
// one length whose ids lie in [0, vocab_size).
#include <cstddef>
#include <cstdint>
#include <string>

#include "tools/TokenRows.h"
#include "trainer/Errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kVocab = 1000;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto rows = trainer::parse_token_rows(text, "fuzz.txt", kVocab);
    if (rows.empty()) __builtin_trap();
    for (const auto& row : rows) {
      if (row.size() != rows.front().size() || row.empty()) __builtin_trap();
      for (const int64_t id : row) {
        if (id < 0 || id >= kVocab) __builtin_trap();
      }
    }
  } catch (const trainer::InputError&) {
    // refused, as bad input must be
  }
  return 0;
}
