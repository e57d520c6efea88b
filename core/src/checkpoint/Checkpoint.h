// Sharded checkpoints in a layout independent of strategy and world size:
// each rank writes ranges of the flat groups' fp32 master weights and AdamW
// moments, every element once, from one of the ranks that hold it
// (assign_writers: ddp's full copies give rank r the r-th of ceil(n / world)
// elements, disjoint shards their own, replicated shards a part each); rank
// 0 writes a manifest with the step, every file's ranges and checksum. Any
// strategy at any world size reads the pieces it holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/Manifest.h"
#include "checkpoint/StateLayout.h"
#include "trainer/Comm.h"
#include "trainer/Model.h"
#include "trainer/Strategy.h"

namespace trainer {

struct TrainingPosition {
  int64_t step = 0;             ///< optimizer steps completed
  int64_t applied_updates = 0;  ///< Adam's step count
  /// Reproducible mode: the fixed-point scale exponent of each parameter
  /// (ExactGradients::exponents, kUnknown where none yet); empty otherwise.
  std::vector<int64_t> gradient_exponents;
};

class Checkpointer {
 public:
  /// `root`: the directory holding step-NNNNNNNN checkpoints. `fingerprint`
  /// identifies what must not change across a resume (model, data,
  /// optimizer, global batch); `keep`: newest checkpoints kept.
  Checkpointer(std::string root, int64_t keep, std::string fingerprint, std::string strategy_name);

  /// Collective. Writes into step-N.tmp, fsyncs, renames to step-N, prunes
  /// the oldest beyond `keep`. A crash at any point leaves earlier
  /// checkpoints intact. Returns the checkpoint's directory.
  std::string save(Strategy& strategy, Model& model, Comm& comm, const TrainingPosition& position);

  /// Collective. Loads a verified checkpoint into the strategy.
  TrainingPosition load(const std::string& dir, Strategy& strategy, Model& model, Comm& comm);

  /// "" -> ""; "auto" -> the newest checkpoint under root that verifies,
  /// saying which were skipped and why ("" when there is none at all;
  /// InputError when there are some and none verifies); a path ->
  /// that path, verified. InputError names a corrupt or foreign file.
  std::string resolve(const std::string& resume) const;

  /// Throws InputError naming the first file whose size or checksum differs
  /// from the manifest, or a manifest that is missing or malformed.
  static void verify(const std::string& dir);

 private:
  std::string root_;
  int64_t keep_;
  std::string fingerprint_;
  std::string strategy_name_;
};

/// The whole flat groups of `name` ("values", "exp_avg", "exp_avg_sq") of a
/// checkpoint, joined from its shards (whatever world size wrote it).
std::vector<torch::Tensor> checkpoint_state(const std::string& dir, const char* name);

}  // namespace trainer
