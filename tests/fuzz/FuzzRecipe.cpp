// libFuzzer target: a recipe, TOML and --set overrides, through the whole
// check `trainer validate` does before any training (sections, keys, types,
// bounds, choices, plugin names and their keys). The input is the TOML text,
// then optionally a line "#--set" and one override per line. Any input
// either loads or throws InputError; it must never crash or hang.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "FuzzScratch.h"
#include "plugin/PluginRegistry.h"
#include "recipe/Recipe.h"

namespace {

trainer::PluginRegistry& registry() {
  static trainer::PluginRegistry* r = [] {
    auto* made = new trainer::PluginRegistry;
    const char* dir = std::getenv("FUZZ_PLUGIN_DIR");
    made->discover({dir ? dir : "build/lib/trainer/plugins"});
    return made;
  }();
  return *r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t marker = input.find("\n#--set\n");
  std::vector<std::string> overrides;
  if (marker != std::string::npos) {
    size_t at = marker + 8;
    while (at <= input.size()) {
      const size_t end = std::min(input.find('\n', at), input.size());
      if (end > at) overrides.push_back(input.substr(at, end - at));
      at = end + 1;
    }
  }
  static const fuzz::Scratch scratch("fuzz-recipe", ".toml");
  const std::string& file = scratch.path;
  std::ofstream(file, std::ios::trunc) << input.substr(0, marker);
  try {
    const trainer::Recipe recipe = trainer::load_recipe(file, overrides, registry());
    (void)recipe.resolved_toml();
  } catch (const std::exception&) {
  }
  return 0;
}
