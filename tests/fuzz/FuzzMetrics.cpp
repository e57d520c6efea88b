// libFuzzer target: metrics.jsonl as `trainer compare` and resume read it.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <fstream>
#include <string>

#include "FuzzScratch.h"
#include "tools/Metrics.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch file("trainer-fuzz-metrics", ".jsonl");
  const std::string& path = file.path;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), size);
  try {
    volatile size_t rows = trainer::read_metrics(path).size();
    (void)rows;
  } catch (const std::exception&) {
  }
  return 0;
}
