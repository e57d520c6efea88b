// libFuzzer target: metrics.jsonl as `trainer compare` and resume read it.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <fstream>
#include <string>

#include "tools/Metrics.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/trainer-fuzz-metrics-" + std::to_string(getpid()) + ".jsonl";
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), size);
  try {
    volatile size_t rows = trainer::read_metrics(path).size();
    (void)rows;
  } catch (const std::exception&) {
  }
  return 0;
}
