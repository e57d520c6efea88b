// The ZeRO stages' shared base (see trainer/sharding/ShardedStrategy.h).
#include "trainer/sharding/ShardedStrategy.h"

#include <utility>

#include <fmt/format.h>

#include "trainer/Errors.h"

namespace trainer {

ShardedStrategy::ShardedStrategy(const Options& options, std::string name)
    : name_(std::move(name)),
      reduce_dtype_(options.text("reduce_dtype") == "bf16" ? torch::kBFloat16 : torch::kFloat32),
      shard_group_size_(options.integer(kShardGroupSizeKey.name)) {}

ShardedStrategy::ShardedStrategy(const Options& options, std::string name, const Context& context)
    : ShardedStrategy(options, std::move(name)) {
  if (shard_group_size_ != 0 && context.world_size % shard_group_size_ != 0) {
    options.fail(kShardGroupSizeKey.name, fmt::format("a divisor of the world size {} (or 0: every rank), got {}",
                                                      context.world_size, shard_group_size_));
  }
}

void ShardedStrategy::join(Comm& world, const StrategyEnv& env) {
  groups_of_ = ShardGroups(world, shard_group_size_, name_);
  comm_ = &groups_of_.shard();
  exact_ = env.exact_gradients;
  if (!env.optimizer) throw std::logic_error(fmt::format("strategy '{}': StrategyEnv::optimizer is null", name_));
  optimizer_ = OptimizerShards(*env.optimizer, comm_->world_size());
}

void ShardedStrategy::keep_full_parameters(Model& model, const StrategyEnv& env) {
  full_ = flatten_parameters(model.parameters(), env.device, /*pad_to=*/shard_padding(comm_->world_size()),
                             torch::kFloat32, env.compute_dtype);
  optimizer_ = OptimizerShards::viewing(*env.optimizer, full_, comm_->rank(), comm_->world_size());
}

void ShardedStrategy::keep_full_gradients() {
  if (exact_) return;
  for (ParameterGroup& group : full_) {
    full_gradients_.push_back(torch::zeros_like(group.values));
    bind_gradients(group, full_gradients_.back());
  }
}

void ShardedStrategy::backward(const torch::Tensor& loss, const MicroStep&) {
  if (full_gradients_.empty() && !exact_) {
    throw TrainingError(fmt::format(
        "strategy '{}' keeps no full gradients (ShardedStrategy::keep_full_gradients), so its backward must be its own",
        name_));
  }
  loss.backward();
}

double ShardedStrategy::reduce_gradients_and_norm() {
  if (exact_) return 0.0;
  groups_of_.finish_sums_over_replicas();
  return optimizer_.gradient_norm(*comm_);
}

void ShardedStrategy::apply_update(const UpdateArgs& args) {
  optimizer_.update(args, comm_, &groups_of_.replicas());
  if (!full_.empty()) all_gather_parameters(optimizer_, full_, *comm_);
  discard_gradients();
}

void ShardedStrategy::discard_gradients() {
  optimizer_.zero_gradients();
  for (torch::Tensor& gradient : full_gradients_) gradient.zero_();
}

MemoryReport ShardedStrategy::memory() const {
  MemoryReport report;
  report.gradient_bytes = optimizer_.gradient_bytes();
  report.optimizer_bytes = optimizer_.state_bytes();
  if (full_.empty()) {
    for (const OptimizerShard& s : optimizer_.groups()) report.parameter_bytes += s.values.numel() * 4;
  }
  for (const torch::Tensor& gradient : full_gradients_) report.gradient_bytes += gradient.numel() * 4;
  for (const ParameterGroup& group : full_) {
    report.parameter_bytes += group.compute.numel() * group.compute.element_size();
    // the fp32 master weights, when parameters compute in bf16
    if (separate_compute(group)) report.optimizer_bytes += group.values.numel() * 4;
  }
  return report;
}

std::vector<FlatSlice> ShardedStrategy::gradient_slices() const { return optimizer_.gradient_slices(); }
std::vector<FlatSlice> ShardedStrategy::parameter_slices() const { return optimizer_.parameter_slices(); }
std::vector<StateSlice> ShardedStrategy::state_slices() { return optimizer_.state_slices(); }

void ShardedStrategy::state_loaded() {
  if (!full_.empty()) all_gather_parameters(optimizer_, full_, *comm_);
}

bool ShardedStrategy::replayable_atoms() const { return exact_ && !full_.empty(); }

}  // namespace trainer
