// What the ZeRO strategies share, as a base class: the shard groups, the
// sharded optimizer state, and every Strategy method that only reads or updates
// that state (the norm, the update, the slice views, memory). A stage
// derives from it and writes its gradient path: setup, backward, how the
// gradient reaches the shard accumulators, and (zero3) where the full
// parameters live while a unit runs. No stage flag: what differs is code in
// the stage's own file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "trainer/Strategy.h"
#include "trainer/sharding/FlatParameters.h"
#include "trainer/sharding/OptimizerShards.h"
#include "trainer/sharding/ShardGroups.h"

namespace trainer {

class ShardedStrategy : public Strategy {
 public:
  /// For stages that keep full gradients (keep_full_gradients): autograd
  /// adds the micro-step's gradient into them, never overwriting. A stage
  /// with a gradient path of its own overrides it; without full gradients
  /// this throws TrainingError naming the stage, never trains silently.
  /// With exact_gradients(): only backpropagates (the core sums).
  void backward(const torch::Tensor& loss, const MicroStep& micro) override;
  /// Waits for the sums over replica groups started during backward, then
  /// returns the norm of the whole gradient (stages whose reductions end
  /// within backward: zero2, zero3). Collective. With exact_gradients():
  /// 0, communicating nothing (StrategyEnv::exact_gradients).
  double reduce_gradients_and_norm() override;
  /// The optimizer's step on this rank's shards; with full parameters (keep_full_parameters)
  /// the updated shards all-gathered into them within the shard group; then
  /// discard_gradients(). Collective.
  void apply_update(const UpdateArgs& args) override;
  /// Zeroes the shard accumulators, and the full gradients if kept.
  void discard_gradients() override;
  /// The parameters (the full compute buffers, or the fp32 shards), the fp32
  /// master weights where parameters compute in bf16, the accumulators (and
  /// full gradients, if kept) and the moments. A stage adds what else it
  /// holds.
  MemoryReport memory() const override;
  std::vector<FlatSlice> gradient_slices() const override;
  std::vector<FlatSlice> parameter_slices() const override;
  std::vector<StateSlice> state_slices() override;
  /// With full parameters, the loaded shards all-gathered into them;
  /// otherwise nothing derives from the shards.
  void state_loaded() override;
  /// With exact_gradients() and full parameters (keep_full_parameters):
  /// forward() and backward() are then the model's and autograd's alone. A
  /// stage that overrides either with more (gathers, collectives) overrides
  /// this too.
  bool replayable_atoms() const override;

 protected:
  /// `name` appears in messages. Reads the stage's `reduce_dtype` key and
  /// kShardGroupSizeKey from `options`.
  ShardedStrategy(const Options& options, std::string name);
  /// The same, and kShardGroupSizeKey checked against `context`'s world
  /// size at once (InputError naming the key), so that `trainer validate`,
  /// which creates the strategy without training, refuses what run would.
  ShardedStrategy(const Options& options, std::string name, const Context& context);

  /// First in a stage's setup, collective over `world`: forms the shard and
  /// replica groups and takes the optimizer (env.optimizer) and
  /// env.exact_gradients.
  void join(Comm& world, const StrategyEnv& env);
  /// StrategyEnv::exact_gradients: the core sums the gradients; the stage
  /// binds no .grad and reduces nothing.
  bool exact_gradients() const { return exact_; }
  /// For stages whose every rank keeps the full parameters (zero1, zero2):
  /// the model's parameters moved into flat groups padded to a multiple of
  /// the shard group's size, the optimizer viewing this rank's shard of
  /// them. After join().
  void keep_full_parameters(Model& model, const StrategyEnv& env);

  /// For stages that accumulate the whole gradient before reducing it
  /// (zero1): an fp32 buffer per full group, bound as its parameters'
  /// .grad, so that autograd adds every micro-step into it (bf16 gradients
  /// widened exactly). After keep_full_parameters(). None with
  /// exact_gradients().
  void keep_full_gradients();
  /// keep_full_gradients()'s buffers, per group; empty otherwise.
  std::vector<torch::Tensor>& full_gradients() { return full_gradients_; }

  /// The ranks this rank splits the state with (the world without hybrid sharding).
  Comm& shard_comm() const { return *comm_; }
  ShardGroups& shard_groups() { return groups_of_; }
  OptimizerShards& optimizer() { return optimizer_; }
  const OptimizerShards& optimizer() const { return optimizer_; }
  /// keep_full_parameters()'s groups; empty for a stage that shards parameters.
  std::vector<ParameterGroup>& full_groups() { return full_; }
  const std::vector<ParameterGroup>& full_groups() const { return full_; }
  /// The dtype gradients travel in (`reduce_dtype`); accumulation stays fp32.
  torch::Dtype reduce_dtype() const { return reduce_dtype_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  torch::Dtype reduce_dtype_;
  int64_t shard_group_size_;
  bool exact_ = false;
  ShardGroups groups_of_;
  Comm* comm_ = nullptr;  // the shard group
  std::vector<ParameterGroup> full_;
  std::vector<torch::Tensor> full_gradients_;
  OptimizerShards optimizer_;
};

}  // namespace trainer
