// Helpers shared by the tests: scratch directories, files, running the
// trainer binary, reading metrics.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cstdint>
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

/// A fresh, empty directory under the build tree for one test. It lies
/// under the running test's own folder, so tests that ctest runs side by
/// side never share one, whatever names they choose.
inline std::string scratch_dir(const std::string& name) {
  std::string owner = "outside-tests";
  if (const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info()) {
    owner = std::string(test->test_suite_name()) + "." + test->name();
    for (char& c : owner) c = c == '/' ? '_' : c;
  }
  const std::filesystem::path dir = std::filesystem::path(TRAINER_TEST_TMP) / owner / name;
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

/// The entries directly in `dir` whose names mark an unfinished write
/// (".tmp" anywhere in the name: PATH.tmp-XXXXXX, a step-N.tmp checkpoint),
/// sorted: what a write that failed or finished must not leave behind.
inline std::vector<std::string> temporaries_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename();
    if (name.find(".tmp") != std::string::npos) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
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
// A port held listening (so nobody else takes it) while `listener` is open.
inline int listening_port(int* listener) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  listen(fd, 1);
  *listener = fd;
  return ntohs(address.sin_port);
}

// `trainer` (args[0] is its path) as a child with its output in `log` and `env` added to its
// environment; killed (with its workers, through their parent-death signal)
// and reaped on every exit path of the test.
class Job {
 public:
  /// `append`: the log is added to instead of replaced.
  Job(const std::vector<std::string>& args, const std::string& log, const std::vector<std::string>& env = {},
      bool append = false) {
    pid_ = fork();
    if (pid_ == 0) {
      for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(TRAINER_BINARY, argv.data());
      _exit(127);
    }
  }
  ~Job() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  void signal(int number) const { kill(pid_, number); }
  pid_t pid() const { return pid_; }
  /// The exit code (128 + signal when killed).
  int wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
};

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

/// The quickstart recipe with its dataset replaced by `windows` windows of
/// 32 tokens (ids below 64, from a fixed LCG) of a uint16 token file: every
/// sample has every position a target, so every micro-batch of a size has
/// one target count (the synthetic samples' padding varies it). Written
/// into scratch_dir(name); returns the recipe's path.
inline std::string token_file_quickstart(const std::string& name, int windows) {
  const std::string dir = scratch_dir(name);
  std::string tokens;
  uint32_t state = 12345;
  for (int i = 0; i < windows * 32 + 1; ++i) {
    state = state * 1664525u + 1013904223u;
    const uint16_t id = static_cast<uint16_t>((state >> 16) % 64);
    tokens.append(reinterpret_cast<const char*>(&id), sizeof id);
  }
  write_file(dir + "/tokens.bin", tokens);
  std::string recipe = read_file(quickstart_recipe());
  const size_t from = recipe.find("[dataset]"), to = recipe.find("[training]");
  if (from == std::string::npos || to == std::string::npos || to < from) {
    ADD_FAILURE() << "configs/quickstart.toml: no [dataset] table before [training]";
    return "";
  }
  recipe.replace(from, to - from,
                 "[dataset]\nname = \"tokens\"\npath = \"" + dir + "/tokens.bin\"\nseq_len = 32\nvocab_size = 64\n");
  return write_file(dir + "/recipe.toml", recipe);
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
using testing::Job;
using testing::listening_port;
using testing::read_file;
using testing::run_command;
using testing::scratch_dir;
using testing::source_path;
using testing::temporaries_in;
using testing::trainer;
using testing::write_file;

/// configs/quickstart.toml, for the integration tests that vary it.
inline const std::string& kQuickstart = testing::quickstart_recipe();

/// The built-in strategies, ddp first (the reference the others are held to).
inline const std::vector<std::string> kStrategies = {"ddp", "zero1", "zero2", "zero3"};

}  // namespace trainer
