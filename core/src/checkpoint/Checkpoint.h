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
  /// optimizer, global batch); `keep`: newest checkpoints kept; `device`:
  /// the run's, where the collectives' tensors live (a rank that holds no
  /// state still takes part in them).
  Checkpointer(std::string root, int64_t keep, std::string fingerprint, std::string strategy_name,
               torch::Device device);

  /// Collective. Writes into step-N.tmp, fsyncs, renames to step-N, prunes
  /// the oldest beyond `keep`. A crash at any point leaves earlier
  /// checkpoints intact. Returns the checkpoint's directory.
  std::string save(Strategy& strategy, Model& model, Comm& comm, const TrainingPosition& position);

  /// Collective. Loads a checkpoint into the strategy: each rank opens only
  /// the files that hold part of its state, and checks their checksums.
  /// InputError names a file this rank sees otherwise than the manifest
  /// (resolve() has checked that every rank reads the step rank 0 chose).
  TrainingPosition load(const std::string& dir, Strategy& strategy, Model& model, Comm& comm);

  /// Collective. Rank 0 alone resolves `resume` (resolve_here) and verifies
  /// it; every rank gets its choice, so all resume the same step (a rank's
  /// own view of the directory, through caches or a concurrent pruner, may
  /// differ). Returns the directory ("" for a fresh start) and, through
  /// `step`, the step its manifest names. When rank 0 fails, every rank
  /// throws: rank 0 its error, the others an InputError naming rank 0.
  std::string resolve(const std::string& resume, Comm& comm, int64_t* step) const;

  /// This process alone: "" -> ""; "auto" -> the newest checkpoint under
  /// root that verifies, saying which were skipped and why ("" when there is
  /// none at all; InputError when there are some and none verifies); a path
  /// -> that path, verified. InputError names a corrupt or foreign file.
  std::string resolve_here(const std::string& resume) const;

  /// Throws InputError naming the first file whose size or checksum differs
  /// from the manifest, or a manifest that is missing or malformed.
  static void verify(const std::string& dir);

 private:
  std::string root_;
  int64_t keep_;
  std::string fingerprint_;
  std::string strategy_name_;
  torch::Device device_;
};

/// The whole flat groups of `name` ("values", "exp_avg", "exp_avg_sq") of a
/// checkpoint, joined from its shards (whatever world size wrote it).
std::vector<torch::Tensor> checkpoint_state(const std::string& dir, const char* name);

}  // namespace trainer
