// libFuzzer target: the tokenizer.json reader on arbitrary bytes. Every
// input is refused as bad input (InputError naming the file) or loads into
// a tokenizer that encodes a fixed text into ids inside its vocabulary;
// any other exception, a crash or a hang is a finding.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "FuzzScratch.h"
#include "trainer/Errors.h"
#include "trainer/util/Tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch("fuzz-tokenizer-json");
  static const int made = mkdir(scratch.path.c_str(), 0700);
  (void)made;
  const std::string& dir = scratch.path;
  const std::string path = dir + "/tokenizer.json";
  FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) return 0;
  std::fwrite(data, 1, size, file);
  std::fclose(file);
  try {
    const auto tokenizer = trainer::Tokenizer::load(path);
    for (const int64_t id : tokenizer->encode("Hello, world! 123 \xe4\xb8\x96\xe7\x95\x8c")) {
      if (id < 0 || id >= tokenizer->vocab_size()) __builtin_trap();
    }
  } catch (const trainer::InputError&) {
    // refused, as bad input must be
  }
  return 0;
}
