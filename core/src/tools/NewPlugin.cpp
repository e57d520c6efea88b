// `trainer new-plugin`: writes the embedded templates (core/templates) as a
// project, names substituted (see NewPlugin.h).
#include "tools/NewPlugin.h"

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string_view>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainer/Errors.h"
#include "util/Files.h"

namespace trainer {

// Generated from core/templates by core/CMakeLists.txt.
struct TemplateFile {
  const char* path;  // "<kind or common>/<path in the project, with @CLASS@>"
  const char* text;
};
extern const TemplateFile kPluginTemplates[];
extern const size_t kNumPluginTemplates;

namespace {

// What each kind's README says it is.
const std::map<std::string, std::string>& kinds() {
  static const std::map<std::string, std::string> about = {
      {"comm",
       "A communication backend: collectives on CPU tensors through the job's rendezvous store. Choose it "
       "with `[distributed] backend = '@NAME@'`; it is used at world size > 1."},
      {"dataset",
       "A dataset: sequences that count up modulo the vocabulary. Choose it with `[dataset] name = "
       "'@NAME@'`."},
      {"logger", "A logger: prints the loss every few steps. Add it with `[[logger]] name = '@NAME@'`."},
      {"optimizer",
       "An optimizer: sign descent with decoupled weight decay, which `trainer check-plugin` checks under "
       "every strategy. Choose it with `[optimizer] name = '@NAME@'`."},
      {"model",
       "A model: a bigram language model with two units (embedding, output), so every strategy, zero3 "
       "included, can train it. Choose it with `[model] name = '@NAME@'`."},
      {"strategy",
       "A strategy: plain data parallelism (whole fp32 gradients all-reduced as sums, full optimizer state "
       "on every rank) that passes `trainer check-plugin`. Choose it with `[strategy] name = "
       "'@NAME@'`."},
  };
  return about;
}

std::string replace_all(std::string text, const std::map<std::string, std::string>& values) {
  for (const auto& [key, value] : values) {
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size())) {
      text.replace(at, key.size(), value);
    }
  }
  return text;
}

}  // namespace

const std::vector<std::string>& sdk_type_names() {
  // Kept equal to the headers' declarations by NewPlugin.ClassNamesAvoidEverySdkType.
  static const std::vector<std::string> names = {"AdamWConfig",
                                                 "AdamWState",
                                                 "Batch",
                                                 "Callback",
                                                 "Comm",
                                                 "CommSetup",
                                                 "CommWork",
                                                 "Component",
                                                 "Context",
                                                 "ConvertLine",
                                                 "CreateFn",
                                                 "Dataset",
                                                 "DescribeFn",
                                                 "DocumentLayout",
                                                 "DocumentPiece",
                                                 "Entry",
                                                 "Finish",
                                                 "FlatSlice",
                                                 "GradientBucket",
                                                 "GradientBuckets",
                                                 "Impl",
                                                 "InputError",
                                                 "InputFunction",
                                                 "Json",
                                                 "KeySpec",
                                                 "Kind",
                                                 "Logger",
                                                 "LongDocuments",
                                                 "LossSum",
                                                 "MemoryReport",
                                                 "MetricField",
                                                 "MicroStep",
                                                 "Model",
                                                 "NamedParameter",
                                                 "NoKeys",
                                                 "Optimizer",
                                                 "OptimizerShard",
                                                 "OptimizerShards",
                                                 "Options",
                                                 "OverlappedUpdate",
                                                 "ParameterGroup",
                                                 "ParameterInfo",
                                                 "ParameterSlot",
                                                 "ParameterUnit",
                                                 "PluginDescriptor",
                                                 "PluginKind",
                                                 "QkvHeads",
                                                 "RopeScaling",
                                                 "RotaryTables",
                                                 "RunInfo",
                                                 "SafetensorsReader",
                                                 "Sample",
                                                 "Send",
                                                 "Shard",
                                                 "ShardGroups",
                                                 "ShardReduction",
                                                 "ShardedStrategy",
                                                 "State",
                                                 "StateSlice",
                                                 "StepFile",
                                                 "StepOfLine",
                                                 "StepRecord",
                                                 "Strategy",
                                                 "StrategyEnv",
                                                 "StreamedGradients",
                                                 "Tokenizer",
                                                 "TrainingFlops",
                                                 "TrainingError",
                                                 "UnitEvents",
                                                 "UnitHooks",
                                                 "UnitSpan",
                                                 "UpdateArgs",
                                                 "UpdateSlice",
                                                 "Value",
                                                 "ValueType"};
  return names;
}

std::string plugin_class_name(const std::string& kind, const std::string& name) {
  const auto camel = [](const std::string& words) {
    std::string out;
    bool upper = true;
    for (const char c : words) {
      if (c == '-') {
        upper = true;
        continue;
      }
      out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      upper = false;
    }
    return out;
  };
  std::string class_name = camel(name);
  const std::string suffix = camel(kind);
  const bool has_suffix = class_name.size() > suffix.size() &&
                          class_name.compare(class_name.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (!has_suffix) class_name += suffix;
  const std::vector<std::string>& sdk = sdk_type_names();
  if (std::find(sdk.begin(), sdk.end(), class_name) != sdk.end()) class_name += "Plugin";
  return class_name;
}

void new_plugin(const std::string& kind, const std::string& name, const std::string& dir,
                const std::vector<std::pair<std::string, std::string>>& installed) {
  const auto& about = kinds();
  if (about.count(kind) == 0) {
    std::vector<std::string> names;
    for (const auto& [k, text] : about) names.push_back(k);
    throw InputError(fmt::format("new-plugin: unknown kind '{}'; expected one of {}", kind, fmt::join(names, ", ")));
  }
  const bool valid_name =
      !name.empty() && name.size() <= 64 && std::islower(static_cast<unsigned char>(name[0])) &&
      std::all_of(name.begin(), name.end(), [](char c) {
        return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-';
      });
  if (!valid_name) {
    throw InputError(
        fmt::format("new-plugin: name '{}': expected a lowercase letter, then lowercase letters, "
                    "digits and '-' (at most 64), as recipes write it",
                    name));
  }
  for (const auto& [taken, file] : installed) {
    if (taken == name) {
      throw InputError(
          fmt::format("new-plugin: name '{}': the {} plugin {} has it, and two {} plugins of one name "
                      "refuse every command; choose another name",
                      name, kind, file, kind));
    }
  }
  if (dir.empty()) throw InputError("new-plugin: DIR is empty; expected the project's directory");
  std::error_code error;
  // "dir/" and "dir/." name dir.
  std::filesystem::path target = std::filesystem::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  if (target.empty() || target.filename() == ".." || target.filename() == ".") {
    throw InputError(fmt::format("new-plugin: DIR '{}': expected a directory's path with a name of its own", dir));
  }
  if (std::filesystem::exists(target, error) &&
      (!std::filesystem::is_directory(target, error) || !std::filesystem::is_empty(target, error))) {
    throw InputError(fmt::format("new-plugin: {} exists and is not an empty directory; nothing was written", dir));
  }
  const std::string class_name = plugin_class_name(kind, name);
  std::string snake = name;
  std::replace(snake.begin(), snake.end(), '-', '_');
  const std::map<std::string, std::string> values = {
      {"@ABOUT@", replace_all(about.at(kind), {{"@NAME@", name}})},
      {"@CLASS@", class_name},
      {"@KIND@", kind},
      {"@NAME@", name},
      {"@TARGET@", fmt::format("trainer_{}_{}", kind, snake)},
  };

  // Written beside DIR, then renamed into place: DIR is whole or absent.
  const std::filesystem::path parent = std::filesystem::absolute(target).parent_path();
  // Missing parents are made, and removed again when the project is not written.
  MadeDirectories made;
  made.create(parent, error);
  if (error || !std::filesystem::is_directory(parent, error)) {
    throw InputError(fmt::format("new-plugin: {}: cannot make the directory it goes into, {}; nothing was written", dir,
                                 parent.string()));
  }
  const std::filesystem::path staging = parent / fmt::format(".{}.new-plugin-{}", target.filename().string(), getpid());
  remove_tree(staging.string());
  std::vector<std::string> written;
  try {
    for (size_t i = 0; i < kNumPluginTemplates; ++i) {
      const std::string_view path = kPluginTemplates[i].path;
      const size_t slash = path.find('/');
      const std::string_view group = path.substr(0, slash);
      if (group != "common" && group != kind) continue;
      const std::string relative = replace_all(std::string(path.substr(slash + 1)), values);
      const std::filesystem::path file = staging / relative;
      std::filesystem::create_directories(file.parent_path());
      std::ofstream out(file, std::ios::binary);
      out << replace_all(kPluginTemplates[i].text, values);
      if (!out.flush()) throw InputError(fmt::format("new-plugin: cannot write {}", file.string()));
      written.push_back(relative);
    }
    if (std::filesystem::exists(target, error)) std::filesystem::remove(target);  // empty, checked above
    std::filesystem::rename(staging, target);
  } catch (const std::filesystem::filesystem_error& failure) {
    remove_tree(staging.string());
    throw InputError(fmt::format("new-plugin: cannot write {}: {}; nothing was written", dir, failure.what()));
  } catch (...) {
    remove_tree(staging.string());
    throw;
  }
  made.keep();
  std::sort(written.begin(), written.end());
  std::cout << fmt::format("wrote {} plugin '{}' to {}:\n", kind, name, dir);
  for (const std::string& file : written) std::cout << "  " << file << "\n";
  std::cout << fmt::format(
      "build and test it:\n  cmake -S {0} -B {0}/build -DCMAKE_PREFIX_PATH=<trainer's prefix>\n"
      "  cmake --build {0}/build && ctest --test-dir {0}/build --output-on-failure\n",
      dir);
}

}  // namespace trainer
