// libFuzzer target: checkpoint manifest validation, the step between a
// manifest on disk and every index resume and export compute from it.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string_view>

#include "checkpoint/Manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const trainer::Json manifest = trainer::json_parse(std::string_view(reinterpret_cast<const char*>(data), size));
    trainer::manifest::validate(manifest, "checkpoints/step-00000002/manifest.json");
  } catch (const std::exception&) {
  }
  return 0;
}
