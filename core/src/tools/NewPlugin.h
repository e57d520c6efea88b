// `trainer new-plugin KIND NAME DIR`: a buildable out-of-tree plugin project
// from the templates in core/templates (embedded in the binary at build time).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace trainer {

/// Writes DIR: CMakeLists.txt (find_package(trainer)), README.md,
/// src/<Class>.cpp (the descriptor, its keys, a working plugin of `kind`) and
/// tests/ (a GoogleTest that runs the installed trainer with it). DIR must
/// not exist or be empty; it appears whole or not at all. InputError for an
/// unknown kind, a name recipes cannot use, a name `installed` already
/// holds (name, file: the plugins of `kind` on the search path; two plugins
/// of one kind and name refuse every command), or a DIR in the way.
void new_plugin(const std::string& kind, const std::string& name, const std::string& dir,
                const std::vector<std::pair<std::string, std::string>>& installed);

/// The C++ class a project of `kind` named `name` declares: the name in
/// CamelCase with the kind appended ("my-cache" dataset -> MyCacheDataset;
/// "fast-model" model -> FastModel), and "Plugin" appended again when that
/// is a type the SDK declares (the template's `using namespace trainer`
/// would make it ambiguous: "sharded" strategy -> ShardedStrategyPlugin).
std::string plugin_class_name(const std::string& kind, const std::string& name);

/// The type names core/include declares (classes, structs, enums, aliases),
/// which plugin_class_name avoids.
const std::vector<std::string>& sdk_type_names();

}  // namespace trainer
