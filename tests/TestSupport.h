// Helpers shared by the tests: scratch directories, files, running the
// trainer binary, reading metrics.
#pragma once

#include <sys/wait.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tools/Metrics.h"
#include "util/Files.h"

namespace trainer::testing {

/// A fresh, empty directory under the build tree for one test.
inline std::string scratch_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(TRAINER_TEST_TMP) / name;
  remove_tree(dir.string());
  std::filesystem::create_directories(dir);
  return dir.string();
}

inline std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

/// `trainer ARGS` from the build tree.
inline CommandResult trainer(const std::string& args) { return run_command(std::string(TRAINER_BINARY) + " " + args); }

inline std::string source_path(const std::string& relative) {
  return (std::filesystem::path(TRAINER_SOURCE_DIR) / relative).string();
}

/// Qwen3's real tokenizer (tokenizer.json, tokenizer_config.json), which
/// scripts/fetch-tokenizer.sh puts here (scripts/test.sh runs it).
inline std::string qwen3_tokenizer_dir() { return source_path(".cache/tokenizers/qwen3"); }

inline std::vector<double> column(const std::vector<MetricsRow>& rows, const std::string& key) {
  std::vector<double> values;
  for (const MetricsRow& row : rows) values.push_back(row.at(key));
  return values;
}

/// configs/quickstart.toml: the recipe most integration tests vary.
inline const std::string& quickstart_recipe() {
  static const std::string path = source_path("configs/quickstart.toml");
  return path;
}

/// The losses of `trainer run` on the quickstart recipe with `overrides`
/// (e.g. "--set training.steps=30"), in scratch_dir(name); the run must
/// succeed.
inline std::vector<double> quickstart_losses(const std::string& name, const std::string& overrides) {
  const std::string dir = scratch_dir(name);
  const CommandResult result = trainer("run " + quickstart_recipe() + " --set run.output_dir=" + dir + " " + overrides);
  if (result.exit_code != 0) ADD_FAILURE() << overrides << "\n" << result.output;
  return column(read_metrics(dir + "/metrics.jsonl"), "loss");
}

}  // namespace trainer::testing

namespace trainer {

// The helpers every test file uses, named without a preamble of its own.
using testing::column;
using testing::CommandResult;
using testing::read_file;
using testing::run_command;
using testing::scratch_dir;
using testing::source_path;
using testing::trainer;
using testing::write_file;

/// configs/quickstart.toml, for the integration tests that vary it.
inline const std::string& kQuickstart = testing::quickstart_recipe();

}  // namespace trainer
