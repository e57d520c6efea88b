// Runs the installed trainer (TRAINER_EXECUTABLE) with this project's
// plugins (PLUGIN_DIR) and returns its exit status and output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

struct TrainerResult {
  int status = -1;
  std::string output;
};

// The small run the tests vary: the qwen2 model at its default size on the
// synthetic dataset, four optimizer steps; a test appends its own keys to
// [training] and its own tables.
constexpr const char* kSmallRun = "[model]\nname = 'qwen2'\n[dataset]\nname = 'synthetic'\n[training]\nsteps = 4\n";

inline TrainerResult run_trainer(const std::string& arguments) {
  const std::string command =
      std::string("'") + TRAINER_EXECUTABLE + "' --plugin-dir '" + PLUGIN_DIR + "' " + arguments + " 2>&1";
  TrainerResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Writes TEST_DIR/<name>.toml: `body` after a [run] table whose output goes
// to TEST_DIR/<name> (emptied first). Returns the recipe's path.
inline std::string write_recipe(const std::string& name, const std::string& body) {
  const std::filesystem::path dir = std::filesystem::path(TEST_DIR) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir.parent_path());
  const std::string file = dir.string() + ".toml";
  std::ofstream(file) << "[run]\nname = '" << name << "'\noutput_dir = '" << dir.string() << "'\n" << body;
  return file;
}

// The "loss" of each line of a run's metrics.jsonl, in order.
inline std::vector<double> losses(const std::string& name) {
  std::ifstream in(std::filesystem::path(TEST_DIR) / name / "metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"loss\":");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 7)));
  }
  return out;
}
