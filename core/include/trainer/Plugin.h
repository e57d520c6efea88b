// The plugin ABI: the descriptor every plugin exports, the kinds, and the
// macro that exports it. A plugin includes only headers of core/include.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>

#include <torch/version.h>
#include <boost/dll/alias.hpp>

#include "trainer/Options.h"

namespace trainer {

/// Bumped whenever PluginDescriptor, Context or any interface class changes
/// layout or virtual functions. The loader compares it before reading any
/// other field, so `abi_version` must stay the first member forever.
/// core/include/trainer/abi-digest.txt records a digest of the SDK headers
/// for each version; a test fails when the headers change and it does not.
inline constexpr uint32_t kAbiVersion = 16;

enum class PluginKind : uint32_t { Strategy = 0, Model = 1, Dataset = 2, Logger = 3, Comm = 4, Optimizer = 5 };

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

/// Name of the symbol (a Boost.DLL alias) every plugin exports. It keeps
/// "v1" across ABI versions on purpose: the generation is the descriptor's
/// first field, so a plugin built for another kAbiVersion still loads far
/// enough to be refused by name with both versions, where a versioned
/// symbol name would only say that no entry point was found.
inline constexpr const char* kEntryPoint = "trainer_plugin_v1";

/// For TRAINER_DEFINE_PLUGIN: a plugin without recipe keys of its own.
struct NoKeys {
  constexpr const KeySpec* data() const { return nullptr; }
  constexpr size_t size() const { return 0; }
};
inline constexpr NoKeys kNoKeys{};

namespace plugin_detail {

/// A component built with whichever constructor its class declares:
/// (options, context), (options), (context) or none.
template <typename T>
Component* create(const Options& options, const Context& context) {
  (void)options, (void)context;  // each constructor takes some of them
  if constexpr (std::is_constructible_v<T, const Options&, const Context&>)
    return new T(options, context);
  else if constexpr (std::is_constructible_v<T, const Options&>)
    return new T(options);
  else if constexpr (std::is_constructible_v<T, const Context&>)
    return new T(context);
  else
    return new T();
}

}  // namespace plugin_detail

}  // namespace trainer

/// Exports `describe_fn` (a function `const trainer::PluginDescriptor* ()`)
/// as the plugin's entry point. Use once per plugin, at namespace scope.
#define TRAINER_PLUGIN(describe_fn) BOOST_DLL_ALIAS(describe_fn, trainer_plugin_v1)

/// The torch version string a plugin records in its descriptor.
#define TRAINER_TORCH_VERSION TORCH_VERSION

/// Defines and exports a plugin's descriptor, once per plugin, at global
/// scope. KIND: a PluginKind enumerator (Strategy, Model, Dataset, Logger,
/// Comm, Optimizer); CLASS: the component (see plugin_detail::create for its
/// constructor); NAME, VERSION, DESCRIPTION: string literals; KEYS: its
/// recipe keys, an array of KeySpec, a container of them with data() and
/// size() that outlives the process, or trainer::kNoKeys.
#define TRAINER_DEFINE_PLUGIN(KIND, CLASS, NAME, VERSION, DESCRIPTION, KEYS)                       \
  namespace {                                                                                      \
  namespace trainer_plugin_definition {                                                            \
  const ::trainer::PluginDescriptor* describe() {                                                  \
    static const auto& keys = KEYS;                                                                \
    static const ::trainer::PluginDescriptor descriptor{::trainer::kAbiVersion,                    \
                                                        ::trainer::PluginKind::KIND,               \
                                                        NAME,                                      \
                                                        VERSION,                                   \
                                                        DESCRIPTION,                               \
                                                        TRAINER_TORCH_VERSION,                     \
                                                        std::data(keys),                           \
                                                        std::size(keys),                           \
                                                        &::trainer::plugin_detail::create<CLASS>}; \
    return &descriptor;                                                                            \
  }                                                                                                \
  }                                                                                                \
  }                                                                                                \
  TRAINER_PLUGIN(trainer_plugin_definition::describe)
