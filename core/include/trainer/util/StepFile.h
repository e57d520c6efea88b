// The output file of a file logger (csv, jsonl, tensorboard): where it
// lives, opened fresh or continued for a resumed run, whole records written
// and flushed, a failed write reported by the file's name.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "trainer/Plugin.h"

namespace trainer {

/// `path` as a logger's key gives it: absolute, or relative to the run's
/// output directory.
std::filesystem::path run_path(const std::string& path, const Context& context);

/// The output of a logger whose key `key` names it (run_path of the
/// option's value), claimed for it: InputError naming the key when the path
/// is one of the run's own outputs (recipe.toml, summary.json, memory.json,
/// model.safetensors, config.json, profile/, the checkpoint directory),
/// another logger's output, inside or around one of them, or exists as the
/// other kind (a directory where a file is written, a file where a
/// directory is). Loggers call it in their constructor, so that a bad path
/// is refused before the run writes anything.
std::filesystem::path claim_run_path(const Options& options, const std::string& key, const Context& context,
                                     bool directory = false);

/// Which optimizer step a line of a logger's file records; nullopt for a
/// line without one (a header, a crashed run's torn last line).
using StepOfLine = std::function<std::optional<int64_t>(const std::string& line)>;

/// What a kept line becomes in the resumed run's file (a CSV row moved
/// into this version's columns).
using ConvertLine = std::function<std::string(const std::string& line)>;

/// For a file logger of a resumed run: rewrites `path` (atomically: into a
/// file of its own beside it, flushed, renamed over it) as `prefix`
/// followed by the lines whose `step_of` is at most `last_step`, each
/// through `convert` when one is given; lines without a step and later
/// steps are dropped, so every step appears once. A missing file is left
/// alone. Throws InputError naming the file when the rewrite cannot be
/// written; `path` then stays as it was.
void keep_steps_until(const std::string& path, int64_t last_step, const std::string& prefix, const StepOfLine& step_of);
void keep_steps_until(const std::string& path, int64_t last_step, const std::string& prefix, const StepOfLine& step_of,
                      const ConvertLine& convert);

/// One logger's file. Not thread-safe: loggers are called from the
/// training thread only.
class StepFile {
 public:
  /// A text file of one line per step for a run that starts at
  /// `first_step`: a fresh run (first_step 0, or no file yet) truncates it
  /// and writes `header` (may be empty); a resumed one keeps `header` and
  /// the lines up to first_step (keep_steps_until with `step_of`) and
  /// appends. A PATH.tmp-XXXXXX that a run killed during that rewrite left
  /// is removed. InputError naming the file when it cannot be opened.
  void open_lines(const std::filesystem::path& path, int64_t first_step, const std::string& header,
                  const StepOfLine& step_of);
  /// The same, each kept line through `convert` (keep_steps_until).
  void open_lines(const std::filesystem::path& path, int64_t first_step, const std::string& header,
                  const StepOfLine& step_of, const ConvertLine& convert);
  /// A new binary file, truncated. InputError naming it when it cannot be opened.
  void open_binary(const std::filesystem::path& path);
  /// Appends `bytes` and flushes, so that a crash leaves whole records;
  /// TrainingError naming the file when the write fails.
  void write(const std::string& bytes);
  /// Flushes, if open (Logger::finish).
  void finish();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace trainer
