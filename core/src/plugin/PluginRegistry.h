// Finds, loads and checks plugins (Boost.DLL), and creates their components.
// Libraries are never unloaded: objects, hooks and CUDA state they create may
// outlive any scope, so the handles live until the process exits.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "trainer/Errors.h"
#include "trainer/Plugin.h"

namespace trainer {

struct LoadedPlugin {
  const PluginDescriptor* descriptor = nullptr;
  std::string file;  ///< canonical path of the .so
};

/// While one exists, checking_only() is true (trainer validate's components).
class CheckingOnly {
 public:
  CheckingOnly();
  ~CheckingOnly();
  CheckingOnly(const CheckingOnly&) = delete;
  CheckingOnly& operator=(const CheckingOnly&) = delete;
};

class PluginRegistry {
 public:
  /// Loads every trainer-*.so in each directory, in order. Missing
  /// directories are skipped; a file that fails to load is an InputError.
  void discover(const std::vector<std::string>& directories);

  /// Loads one plugin file (a recipe may name a path); returns the entry.
  const LoadedPlugin& load_file(const std::string& path);

  /// A plugin of `kind` by recipe name, or by path when `name` names a file
  /// (contains '/' or ends in ".so"). Unknown: InputError listing the names.
  const LoadedPlugin& find(PluginKind kind, const std::string& name);

  const std::deque<LoadedPlugin>& plugins() const { return plugins_; }

  /// Creates the plugin's component and checks it implements `Interface`.
  template <class Interface>
  static std::unique_ptr<Interface> create(const LoadedPlugin& plugin, const Options& options, const Context& context) {
    std::unique_ptr<Component> component(plugin.descriptor->create(options, context));
    if (auto* typed = dynamic_cast<Interface*>(component.get())) {
      component.release();
      return std::unique_ptr<Interface>(typed);
    }
    throw InputError(plugin.file + ": the plugin's factory returned an object that is not a " +
                     kind_name(plugin.descriptor->kind));
  }

 private:
  const LoadedPlugin& add(const LoadedPlugin& plugin);

  // A deque: loading one more plugin never moves the others, so the
  // references find() and load_file() return (kept by recipes) stay valid.
  std::deque<LoadedPlugin> plugins_;
};

/// The search order of DESIGN.md: explicit directories, then
/// TRAINER_PLUGIN_PATH (colon-separated), then <executable>/../lib/trainer/plugins
/// (the install's, and in a build tree build/lib/trainer/plugins).
std::vector<std::string> plugin_search_path(const std::vector<std::string>& explicit_dirs);

}  // namespace trainer
