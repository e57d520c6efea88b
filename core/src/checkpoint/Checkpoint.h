// Sharded checkpoints in a layout independent of strategy and world size:
// each rank writes ranges of the flat groups' fp32 master weights and AdamW
// moments, every element once, from one of the ranks that hold it
// (assign_writers: ddp's full copies give rank r the r-th of ceil(n / world)
// elements, disjoint shards their own, replicated shards a part each); rank
// 0 writes a manifest with the step, every file's ranges and checksum. Any
// strategy at any world size reads the pieces it holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/Manifest.h"
#include "checkpoint/StateLayout.h"
#include "run/Sampler.h"
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
  /// The data order the run started with (a checkpoint of before
  /// "feistel-1" keeps its Fisher-Yates order).
  SampleOrder order = SampleOrder::Feistel;
};

class Checkpointer {
 public:
  /// `root`: the directory holding step-NNNNNNNN checkpoints. `fingerprint`
  /// identifies what must not change across a resume (model and its
  /// parameter table, data, seed, optimizer, global batch, data order);
  /// `legacy_fingerprint` the same for checkpoints written before
  /// "feistel-1" (Recipe::fingerprint: no seed, no parameter table);
  /// `keep`: newest checkpoints of this run kept; `device`: the run's, where
  /// the collectives' tensors live (a rank that holds no state still takes
  /// part in them); `state_names`: the optimizer's (Optimizer::state_names),
  /// in the order of StateSlice::state.
  Checkpointer(std::string root, int64_t keep, std::string fingerprint, std::string legacy_fingerprint,
               std::string strategy_name, torch::Device device,
               std::vector<std::string> state_names = {"exp_avg", "exp_avg_sq"});

  /// The number of samples the run's dataset gives (Dataset::size), written
  /// into every manifest and checked by load(): the data order over a
  /// dataset of another size is another order, so a checkpoint whose data
  /// changed since (a corpus re-tokenized or appended to at the same path)
  /// is refused instead of resuming onto other samples. Unset (-1): neither.
  void set_dataset_samples(int64_t samples) { dataset_samples_ = samples; }

  /// The run's resolved recipe (Recipe::resolved_toml), written as
  /// recipe.toml into every checkpoint, checksummed by the manifest: the
  /// recipe its steps were trained with. Unset (""): none.
  void set_recipe(std::string resolved_toml) { recipe_ = std::move(resolved_toml); }

  /// The recipe.toml a verified checkpoint holds; nullopt for one written
  /// before checkpoints held their recipe.
  static std::optional<std::string> recipe_of(const std::string& dir);

  /// Collective. Writes into step-N.tmp, fsyncs, renames to step-N, then
  /// prunes this run's checkpoints (those of its lineage: started by it, or
  /// by the run it resumed, and so on) older than step-N beyond `keep`;
  /// another run's checkpoints are never removed. A crash at any point
  /// leaves earlier checkpoints intact. Returns the checkpoint's directory.
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
  /// Sets the run's lineage: the resumed checkpoint's, or a new one.
  std::string resolve(const std::string& resume, Comm& comm, int64_t* step);

  /// This process alone: "" -> "" (InputError when root holds complete
  /// checkpoints: another run's, which this one would mix its own with);
  /// "auto" -> the newest checkpoint under root that verifies, saying which
  /// were skipped and why ("" when there is none at all; InputError when
  /// there are some and none verifies); a path -> that path, verified
  /// (InputError when root holds a newer checkpoint than it: resuming would
  /// interleave two histories). InputError names a corrupt or foreign file.
  std::string resolve_here(const std::string& resume) const;

  /// Throws InputError naming the first file whose size or checksum differs
  /// from the manifest, or a manifest that is missing or malformed.
  static void verify(const std::string& dir);

 private:
  void prune(int64_t written_step) const;
  /// Removes the step-N.tmp directories under root_: checkpoints a run
  /// stopped writing (killed, or out of memory), never resumable, each as
  /// large as a checkpoint. The run's lock on root_ (RunLock) means no
  /// writer of theirs is alive.
  void remove_incomplete() const;

  std::string root_;
  int64_t keep_;
  std::string fingerprint_;
  std::string legacy_fingerprint_;
  std::string lineage_;                       // the manifests' run_id; "" for checkpoints written before it
  SampleOrder order_ = SampleOrder::Feistel;  // the resumed run's (load)
  int64_t dataset_samples_ = -1;              // set_dataset_samples; -1: not recorded
  std::string recipe_;                        // set_recipe; "": none written
  std::string strategy_name_;
  torch::Device device_;
  std::vector<std::string> names_;  // "values", then the optimizer's state names
};

/// Whether a run with checkpoint.resume = `resume` and checkpoint.dir =
/// `root` starts at step 0, as far as can be told without reading a
/// checkpoint (`trainer validate`): "" -> true (InputError, as
/// Checkpointer::resolve_here, when `root` holds checkpoints); "auto" ->
/// true when `root` holds no step-N entry (a step-N.tmp, which run
/// removes, is none); a path -> false.
bool starts_at_step_zero(const std::string& root, const std::string& resume);

/// What a checkpoint of this run must have been written by: the recipe's
/// fingerprint (Recipe::fingerprint: model, data, optimizer, global batch),
/// the seed (which draws the data order), the data order's name, and the
/// model's parameter table (names, shapes, decay: the flat layout).
std::string run_fingerprint(const std::string& recipe_fingerprint, uint64_t seed, Model& model);

/// The whole flat groups of `name` ("values", or one of the optimizer's
/// state names: AdamW's "exp_avg", "exp_avg_sq") of a checkpoint, joined from its shards (whatever world size wrote
/// it).
std::vector<torch::Tensor> checkpoint_state(const std::string& dir, const std::string& name);

}  // namespace trainer
