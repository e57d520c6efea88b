// The recipe: a TOML file plus --set overrides, validated against the keys
// the core sections and each chosen plugin declare.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "plugin/PluginRegistry.h"
#include "trainer/Options.h"

namespace trainer {

/// A plugin chosen by a recipe table, with its validated options.
struct ComponentChoice {
  const LoadedPlugin* plugin = nullptr;
  Options options;
};

struct Recipe {
  std::string file;
  Options run;
  Options training;
  /// [optimizer]: every key, the core's (name, lr) and the plugin's.
  Options optimizer;
  Options lr_schedule;
  Options distributed;
  Options checkpoint;
  ComponentChoice model;
  ComponentChoice dataset;
  ComponentChoice strategy;
  /// [optimizer]'s plugin with its own keys only (what it is created with).
  ComponentChoice optimizer_plugin;
  std::vector<ComponentChoice> loggers;  ///< always includes a jsonl logger writing metrics.jsonl

  /// The recipe with every default filled in, as TOML: what the run used.
  std::string resolved_toml() const;

  /// How a resolved recipe's text (an earlier run's recipe.toml) differs
  /// from this recipe in what shapes a run's results, as "[section] key:
  /// VALUE there, VALUE here" for the first key that differs; "" when none
  /// does. Where the outputs go, the loggers, [checkpoint], the profiler,
  /// MFU's peaks and distributed.timeout_s do not count, nor a key the
  /// earlier recipe lacks (added since) that this one leaves at its default.
  std::string result_difference(const std::string& earlier) const;

  /// The first line of resolved_toml(): a recipe.toml that begins with it
  /// was written by a run.
  static constexpr const char* kResolvedHeader = "# Resolved recipe: every key with the value this run used.";

  /// The files the run reads, as (what, path): the recipe itself and every
  /// string key outside [[logger]] that names an existing regular file
  /// (a dataset's path, a tokenizer, init_from, ...), for the output claims:
  /// no logger may write over one.
  std::vector<std::pair<std::string, std::string>> input_files() const;

  /// The directories the run reads, as (what, path): every string key
  /// outside [[logger]] and [run] that the recipe or a --set gives and that
  /// names an existing directory (model.hf_dir, a tokenizer's directory,
  /// checkpoint.resume, ...), except plugin choices (`name`) and
  /// checkpoint.dir (where the run writes).
  std::vector<std::pair<std::string, std::string>> input_directories() const;

  /// A hash of what a checkpoint may not be resumed without: the model,
  /// dataset and optimizer tables and the global batch size.
  std::string fingerprint(int64_t global_batch_size) const;
};

/// Parses and validates. Overrides are "section.key=value" or
/// "logger.N.key=value"; values are TOML literals, or bare strings.
/// Throws InputError naming the file, line and key.
Recipe load_recipe(const std::string& file, const std::vector<std::string>& overrides, PluginRegistry& registry);

/// Validates a TOML table given as text (e.g. "hidden_size = 16") against a
/// plugin's declared keys, filling defaults; for tools that build components
/// without a recipe file (the conformance kit).
Options plugin_options(const LoadedPlugin& plugin, const std::string& table_text);

/// The core sections' declared keys, for `trainer validate` and the README.
struct SectionSpec {
  const char* name;
  const KeySpec* keys;
  size_t num_keys;
  Options Recipe::*options;  ///< where a Recipe keeps the validated section
};
std::vector<SectionSpec> core_sections();

/// The declared key closest to `key` by edit distance, or "" if none is close.
std::string closest_key(const std::string& key, const std::vector<std::string>& candidates);

/// How many samples each rank and micro-step takes.
struct BatchShape {
  int64_t micro_batch_size = 1;
  int64_t grad_accum_steps = 1;
  int world_size = 1;
  int64_t global_batch_size() const { return micro_batch_size * grad_accum_steps * world_size; }
};

/// training.micro_batch_size and grad_accum_steps, or grad_accum_steps
/// derived from training.global_batch_size; InputError when they disagree.
BatchShape batch_shape(const Recipe& recipe, int world_size);

/// At world size > 1, distributed.backend must be a comm plugin found here
/// (by name or path); InputError naming the key otherwise. A single process
/// needs none, so a build without one (gloo on a CUDA host) still runs it.
void check_backend(const Recipe& recipe, PluginRegistry& registry, int world_size);

}  // namespace trainer
