// libFuzzer target: the tokenizer on arbitrary bytes (invalid UTF-8, stray
// special-token fragments, long runs), with Qwen3's real tokenizer.json
// (scripts/fetch-tokenizer.sh; FUZZ_TOKENIZER names another). Every input
// must give ids inside the vocabulary without crashing or hanging.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "trainer/util/Tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const trainer::Tokenizer> tokenizer = trainer::Tokenizer::load(
      std::getenv("FUZZ_TOKENIZER") ? std::getenv("FUZZ_TOKENIZER") : ".cache/tokenizers/qwen3");
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const int64_t id : tokenizer->encode(text)) {
    if (id < 0 || id >= tokenizer->vocab_size()) __builtin_trap();
  }
  if (size > 0 && tokenizer->encode(text).empty()) __builtin_trap();  // something always comes out
  return 0;
}
