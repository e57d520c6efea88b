// The `trainer` command line: run, validate, plugins, check-plugin, compare,
// export, forward, tokenize, new-plugin. Exit codes: 0 success, 2 bad input
// (recipe, plugin, data, command line), 1 failure while training, 75 stopped
// by a signal after writing a checkpoint.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "checkpoint/Checkpoint.h"
#include "distributed/Launcher.h"
#include "kit/Conformance.h"
#include "plugin/PluginRegistry.h"
#include "recipe/Recipe.h"
#include "run/RunConfig.h"
#include "run/TrainingLoop.h"
#include "tools/Compare.h"
#include "tools/Export.h"
#include "tools/Forward.h"
#include "tools/NewPlugin.h"
#include "tools/Tokenize.h"
#include "trainer/Dataset.h"
#include "trainer/Errors.h"
#include "trainer/Log.h"
#include "trainer/Model.h"
#include "trainer/Strategy.h"
#include "util/BriefError.h"

namespace {

using namespace trainer;

constexpr int kExitTrainingFailed = 1;
constexpr int kExitBadInput = 2;

struct CommonArgs {
  std::vector<std::string> plugin_dirs;
  bool verbose = false;
};

PluginRegistry discover(const CommonArgs& args) {
  PluginRegistry registry;
  registry.discover(plugin_search_path(args.plugin_dirs));
  return registry;
}

const char* type_name(ValueType type) {
  switch (type) {
    case ValueType::Bool:
      return "bool";
    case ValueType::Int:
      return "int";
    case ValueType::Float:
      return "float";
    case ValueType::String:
      return "string";
  }
  return "?";
}

void print_keys(const KeySpec* keys, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const KeySpec& k = keys[i];
    std::string note = k.default_value ? fmt::format("default {}", k.default_value) : "required";
    if (k.choices) note += fmt::format("; one of {}", k.choices);
    fmt::print("  {:<22} {:<7} {:<28} {}\n", k.name, type_name(k.type), note, k.help);
  }
}

// check-plugin's argument names an optimizer (not a strategy).
bool is_optimizer_plugin(PluginRegistry& registry, const std::string& name) {
  try {
    registry.find(PluginKind::Strategy, name);
    return false;
  } catch (const InputError& as_strategy) {
    try {
      registry.find(PluginKind::Optimizer, name);
      return true;
    } catch (const InputError&) {
      throw InputError(fmt::format("{} (nor is it an optimizer plugin)", as_strategy.what()));
    }
  }
}

int list_plugins(PluginRegistry& registry, const std::string& name) {
  if (!name.empty()) {
    bool found = false;
    for (const LoadedPlugin& plugin : registry.plugins()) {
      const PluginDescriptor& d = *plugin.descriptor;
      if (name != d.name && name != plugin.file) continue;
      found = true;
      fmt::print("{} {} {}: {}\n  file: {}\n  recipe keys of [{}]:\n", kind_name(d.kind), d.name, d.version,
                 d.description, plugin.file, kind_name(d.kind));
      if (d.num_keys == 0) fmt::print("  (none besides name)\n");
      print_keys(d.keys, d.num_keys);
    }
    if (!found) throw InputError(fmt::format("no plugin named '{}' (run `trainer plugins` for the list)", name));
    return 0;
  }
  fmt::print("{:<9} {:<12} {:<9} {}\n", "KIND", "NAME", "VERSION", "FILE");
  for (const LoadedPlugin& plugin : registry.plugins()) {
    const PluginDescriptor& d = *plugin.descriptor;
    fmt::print("{:<9} {:<12} {:<9} {}\n", kind_name(d.kind), d.name, d.version, plugin.file);
  }
  fmt::print("\nCore recipe sections:\n");
  for (const SectionSpec& section : core_sections()) {
    fmt::print("[{}]\n", section.name);
    print_keys(section.keys, section.num_keys);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported by
  // the file's name, instead of killing the process with its files half written.
  signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"trainer: train LibTorch models from a TOML recipe with run-time plugins"};
  app.require_subcommand(1);
  CommonArgs common;
  app.add_option("--plugin-dir", common.plugin_dirs, "search this directory for plugins first (repeatable)")
      ->check(CLI::ExistingDirectory);  // a mistyped directory is an error, not a silently empty search
  app.add_flag("-v,--verbose", common.verbose, "debug logging");

  std::string recipe_file;
  std::vector<std::string> overrides;
  CLI::App* run = app.add_subcommand("run", "train from a recipe");
  run->add_option("recipe", recipe_file, "recipe file (TOML)")->required();
  run->add_option("--set", overrides, "override a recipe key: section.key=value (repeatable)");
  int nproc = 0;
  run->add_option("--nproc", nproc, "start this many local workers (same as --set distributed.nproc=N)")
      ->check(CLI::Range(1, 4096));

  CLI::App* validate = app.add_subcommand("validate", "check a recipe and print it resolved");
  validate->add_option("recipe", recipe_file, "recipe file (TOML)")->required();
  validate->add_option("--set", overrides, "override a recipe key: section.key=value (repeatable)");

  std::string plugin_name;
  CLI::App* plugins = app.add_subcommand("plugins", "list plugins, or show one plugin's recipe keys");
  plugins->add_option("name", plugin_name, "a plugin name or file: show its recipe keys");

  ConformanceRequest check;
  std::vector<std::string> split_texts;
  std::string rank_report;
  std::vector<std::string> check_strategies;
  CLI::App* check_plugin_cmd = app.add_subcommand(
      "check-plugin", "run the conformance kit (the accumulation contract) on a strategy or optimizer plugin");
  check_plugin_cmd->add_option("plugin", check.strategy, "strategy or optimizer plugin: a name or .so path")
      ->required();
  check_plugin_cmd->add_option("--optimizer", check.optimizer,
                               "for a strategy: the optimizer it updates with (default adamw)");
  check_plugin_cmd->add_option("--optimizer-set", check.optimizer_settings,
                               "KEY=VALUE (a TOML value, e.g. state_dtype='bf16') for the optimizer (repeatable)");
  check_plugin_cmd->add_option("--strategy", check_strategies,
                               "for an optimizer: the strategies it is checked under (repeatable; default ddp, zero1, "
                               "zero2, zero3, with their hybrid splits)");
  check_plugin_cmd->add_option(
      "--split", split_texts,
      "micro,accum,world with product 8, or micro,accum,world,shard_group_size (repeatable; default: six splits, "
      "and two hybrid ones for a strategy with shard_group_size)");
  check_plugin_cmd->add_option("--device", check.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  check_plugin_cmd->add_option("--backend", check.backend, "comm plugin for world size > 1");
  check_plugin_cmd->add_flag("--backend-at-one-rank", check.backend_at_one_rank,
                             "use the backend at world size 1 too (tests it on one GPU)");
  check_plugin_cmd->add_flag("--bf16", check.bf16,
                             "also check bf16 accumulation over 16 micro-steps (default battery: on)");
  check_plugin_cmd->add_option("--timeout", check.timeout_s, "seconds before a silent peer fails a split");
  check_plugin_cmd->add_option("--report", check.report, "write one JSON row per split and rank here");
  check_plugin_cmd->add_option("--rank-report", rank_report, "(internal) worker output directory")->group("");
  check_plugin_cmd->add_option("--load-checkpoint", check.load_checkpoint, "(internal) the previous split's checkpoint")
      ->group("");

  std::vector<std::string> compare_dirs;
  double compare_rtol = 1e-5;
  bool compare_quiet = false;
  CLI::App* compare = app.add_subcommand("compare", "per-step agreement of loss and grad norm between runs");
  compare->add_option("runs", compare_dirs, "run directories (each with metrics.jsonl); the first is the reference")
      ->required()
      ->expected(2, 1 << 20);
  compare->add_option("--rtol", compare_rtol, "largest relative deviation that counts as agreement");
  compare->add_flag("-q,--quiet", compare_quiet, "print only the summary line");
  std::string compare_html;
  compare->add_option("--html", compare_html, "also write a self-contained HTML report with the curves here");

  std::string export_from, export_to;
  CLI::App* export_cmd =
      app.add_subcommand("export", "write a run's final weights, or a checkpoint's, as a Hugging Face directory");
  export_cmd->add_option("run", export_from, "run directory or checkpoint directory")->required();
  export_cmd->add_option("--to", export_to, "output directory (config.json + model.safetensors)")->required();

  std::string tokens_file, logits_file;
  CLI::App* forward = app.add_subcommand("forward", "write the recipe's model's logits for given token ids");
  forward->add_option("recipe", recipe_file, "recipe file (TOML)")->required();
  forward->add_option("--set", overrides, "override a recipe key (repeatable)");
  forward->add_option("--tokens", tokens_file, "token ids, one sequence per line")->required();
  forward->add_option("--out", logits_file, "raw float32 logits [sequences, length, vocab]")->required();

  TokenizeRequest tokenize;
  CLI::App* tokenize_cmd =
      app.add_subcommand("tokenize", "pre-tokenize a jsonl corpus ({\"text\": ...} per line) for the tokens dataset");
  tokenize_cmd->add_option("input", tokenize.input, "jsonl file")->required();
  tokenize_cmd->add_option("--tokenizer", tokenize.tokenizer, "a Hugging Face tokenizer.json or a directory with one")
      ->required();
  tokenize_cmd->add_option("--out", tokenize.out, "tokens file (OUT.docs: document offsets, uint64)")->required();
  tokenize_cmd->add_option("--dtype", tokenize.dtype, "uint16, uint32 or auto")
      ->check(CLI::IsMember({"auto", "uint16", "uint32"}));
  tokenize_cmd->add_option("--threads", tokenize.threads, "worker threads (default: one per core)")
      ->check(CLI::Range(1, 1024));
  tokenize_cmd->add_flag("--skip-bad-lines", tokenize.skip_bad_lines, "count and skip malformed lines");

  std::string new_kind, new_name, new_dir;
  CLI::App* new_plugin_cmd = app.add_subcommand(
      "new-plugin", "write a buildable out-of-tree plugin project (CMake, the SDK, a test) to start from");
  new_plugin_cmd->add_option("kind", new_kind, "strategy, model, dataset, logger, comm or optimizer")->required();
  new_plugin_cmd->add_option("name", new_name, "the plugin's name, as recipes will write it")->required();
  new_plugin_cmd->add_option("dir", new_dir, "the project's directory (must not exist, or be empty)")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : kExitBadInput;
  }
  log::set_verbose(common.verbose);
  if (nproc > 0) overrides.push_back(fmt::format("distributed.nproc={}", nproc));
  try {
    if (compare->parsed()) return compare_runs(compare_dirs, compare_rtol, compare_quiet, compare_html);
    if (tokenize_cmd->parsed()) return tokenize_corpus(tokenize);
    if (new_plugin_cmd->parsed()) {
      std::vector<std::pair<std::string, std::string>> installed;  // the names the new plugin may not take
      try {
        const PluginRegistry registry = discover(common);
        for (const LoadedPlugin& plugin : registry.plugins()) {
          if (kind_name(plugin.descriptor->kind) == new_kind)
            installed.emplace_back(plugin.descriptor->name, plugin.file);
        }
      } catch (const InputError& unusable) {
        log::warn(fmt::format("the installed plugins could not be listed ({}); the name is not checked against them",
                              unusable.what()));
      }
      new_plugin(new_kind, new_name, new_dir, installed);
      return 0;
    }
    if (export_cmd->parsed()) {
      export_run(export_from, export_to);
      return 0;
    }
    PluginRegistry registry = discover(common);
    if (plugins->parsed()) return list_plugins(registry, plugin_name);
    if (check_plugin_cmd->parsed()) {
      for (const std::string& text : split_texts) check.splits.push_back(parse_split(text));
      if (rank_report.empty() && is_optimizer_plugin(registry, check.strategy)) {
        check.optimizer = check.strategy;
        if (check_strategies.empty()) check_strategies = {"ddp", "zero1", "zero2", "zero3"};
        check.plugin_dirs = common.plugin_dirs;
        return check_optimizer(registry, check, check_strategies, "/proc/self/exe");
      }
      if (check.splits.empty()) {
        check.splits = default_splits(registry.find(PluginKind::Strategy, check.strategy));
        check.bf16 = true;
      }
      if (!rank_report.empty()) {  // a worker of one split
        const WorldInfo world = world_from_environment();
        log::set_rank(world.rank, world.world_size);
        run_conformance_worker(registry, check, check.splits.at(0), world,
                               rank_report + "/rank" + std::to_string(world.rank) + ".jsonl");
        return 0;
      }
      check.plugin_dirs = common.plugin_dirs;
      return check_plugin(registry, check, "/proc/self/exe");
    }
    const Recipe recipe = load_recipe(recipe_file, overrides, registry);
    if (forward->parsed()) {
      write_logits(recipe, tokens_file, logits_file);
      return 0;
    }
    if (validate->parsed()) {
      // The same batch checks as `trainer run` with the recipe's local workers.
      const int local_workers = std::max(1, comm_settings(recipe).nproc);
      const RunConfig config = run_config(recipe, local_workers);
      check_backend(recipe, registry, local_workers);
      // The components check their options in their constructors, against
      // the world size too; the model only checks (checking_only(): no
      // weights allocated or loaded).
      const Context context{config.output_dir, config.device, config.seed, 0, local_workers, 0};
      {
        const CheckingOnly checking;
        PluginRegistry::create<Model>(*recipe.model.plugin, recipe.model.options, context);
      }
      PluginRegistry::create<Strategy>(*recipe.strategy.plugin, recipe.strategy.options, context);
      PluginRegistry::create<Dataset>(*recipe.dataset.plugin, recipe.dataset.options, context);
      // What `run` would refuse of the files already there: a fresh run's
      // earlier checkpoints or another recipe's results (checkpoints are
      // not read here; `run` verifies the one it resumes).
      if (starts_at_step_zero(config.checkpoint.dir, config.checkpoint.resume)) {
        check_earlier_results(recipe, config.output_dir);
      }
      std::cout << recipe.resolved_toml();
      log::info(fmt::format("{}: recipe is valid (recipe fingerprint {})", recipe_file, config.fingerprint));
      return 0;
    }
    const CommSettings comm = comm_settings(recipe);
    const int workers = comm.nproc;
    if (started_as_worker()) {
      const WorldInfo world = world_from_environment();
      if (workers > 1 && !std::getenv("TRAINER_WORKER")) {
        log::warn(fmt::format("distributed.nproc = {} ignored: started by an external launcher ({}, world size {})",
                              workers, world.source, world.world_size));
      }
      train(recipe, registry, world);
      return 0;
    }
    if (workers > 1) {
      check_backend(recipe, registry, workers);  // once, before any worker starts
      return launch_local_workers(argc, argv, workers, comm.timeout_s);
    }
    train(recipe, registry, WorldInfo{});
    return 0;
  } catch (const Preempted& stopped) {
    log::warn(stopped.what());
    return kExitPreempted;
  } catch (const InputError& error) {
    log::error(error.what());
    return kExitBadInput;
  } catch (const TrainingError& error) {
    log::error(fmt::format("training failed: {}", error.what()));
    return kExitTrainingFailed;
  } catch (const std::exception& error) {
    log::error(fmt::format("training failed: {}", brief_error(error)));
    return kExitTrainingFailed;
  }
}
