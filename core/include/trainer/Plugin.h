// The plugin ABI: the descriptor every plugin exports, the kinds, and the
// macro that exports it. A plugin includes only headers of core/include.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <torch/version.h>
#include <boost/dll/alias.hpp>

#include "trainer/Options.h"

namespace trainer {

/// Bumped whenever PluginDescriptor, Context or any interface class changes
/// layout or virtual functions. The loader compares it before reading any
/// other field, so `abi_version` must stay the first member forever.
/// core/include/trainer/abi-digest.txt records a digest of the SDK headers
/// for each version; a test fails when the headers change and it does not.
inline constexpr uint32_t kAbiVersion = 6;

enum class PluginKind : uint32_t { Strategy = 0, Model = 1, Dataset = 2, Logger = 3, Comm = 4 };

/// "strategy", "model", ... as used in recipes and `trainer plugins`.
const char* kind_name(PluginKind kind);

/// Base of every object a plugin creates. Its key function lives in
/// libtrainer_core.so, so typeinfo of all interfaces is unique process-wide.
class Component {
 public:
  virtual ~Component();
};

/// What every component learns about the run besides its own recipe table.
struct Context {
  std::string output_dir;  ///< the run's output directory (exists)
  std::string device;      ///< "cpu" or "cuda"
  uint64_t seed = 0;       ///< run.seed
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
};

/// Creates the plugin's component from its validated options. Throws
/// InputError for bad options; the caller owns the returned object.
using CreateFn = Component* (*)(const Options& options, const Context& context);

/// Returned by the plugin's entry point; static storage in the plugin.
struct PluginDescriptor {
  uint32_t abi_version;  ///< kAbiVersion the plugin was built with; must stay first
  PluginKind kind;
  const char* name;  ///< unique per kind, as written in recipes
  const char* version;
  const char* description;    ///< one line
  const char* torch_version;  ///< TORCH_VERSION the plugin was built against
  const KeySpec* keys;        ///< the plugin's recipe keys (besides `name`)
  size_t num_keys;
  CreateFn create;
};

using DescribeFn = const PluginDescriptor*();

/// Name of the symbol (a Boost.DLL alias) every plugin exports.
inline constexpr const char* kEntryPoint = "trainer_plugin_v1";

}  // namespace trainer

/// Exports `describe_fn` (a function `const trainer::PluginDescriptor* ()`)
/// as the plugin's entry point. Use once per plugin, at namespace scope.
#define TRAINER_PLUGIN(describe_fn) BOOST_DLL_ALIAS(describe_fn, trainer_plugin_v1)

/// The torch version string a plugin records in its descriptor.
#define TRAINER_TORCH_VERSION TORCH_VERSION
