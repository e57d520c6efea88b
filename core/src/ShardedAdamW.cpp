#include "trainer/ShardedAdamW.h"

namespace trainer {

ShardedAdamW ShardedAdamW::viewing(std::vector<ParameterGroup>& groups, const Comm& comm) {
  ShardedAdamW optimizer;
  for (ParameterGroup& group : groups) {
    const Shard shard = shard_of(group.padded_numel, comm.rank(), comm.world_size());
    optimizer.add_group(shard, unpadded(group, shard), group.decay, group.values.narrow(0, shard.offset, shard.numel));
  }
  return optimizer;
}

void all_gather_parameters(const ShardedAdamW& optimizer, std::vector<ParameterGroup>& groups, Comm& comm) {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < groups.size(); ++g) {
    comm.all_gather(optimizer.groups()[g].values, groups[g].values);
    sync_compute(groups[g]);
  }
}

void ShardedAdamW::add_group(const Shard& shard, const Shard& owned, bool decay, torch::Tensor values) {
  OptimizerShard g;
  g.shard = shard;
  g.owned = owned;
  g.decay = decay;
  g.gradient = torch::zeros({shard.numel}, values.options());
  g.state = adamw_init(values.narrow(0, 0, owned.numel));
  g.values = std::move(values);
  groups_.push_back(std::move(g));
}

double ShardedAdamW::gradient_norm(Comm& comm) const {
  std::vector<torch::Tensor> owned;
  for (const OptimizerShard& g : groups_) owned.push_back(g.gradient.narrow(0, 0, g.owned.numel));
  return sharded_norm(owned, comm);
}

void ShardedAdamW::update(const AdamWConfig& config, const UpdateArgs& args) {
  torch::NoGradGuard no_grad;
  for (OptimizerShard& g : groups_) {
    adamw_update(g.values.narrow(0, 0, g.owned.numel), g.gradient.narrow(0, 0, g.owned.numel), g.state, config,
                 g.decay, args.lr, args.adam_step, args.grad_scale);
  }
}

void ShardedAdamW::zero_gradients() {
  for (OptimizerShard& g : groups_) g.gradient.zero_();
}

std::vector<FlatSlice> ShardedAdamW::gradient_slices() const {
  std::vector<FlatSlice> out;
  for (size_t i = 0; i < groups_.size(); ++i) {
    out.push_back({i, groups_[i].owned.offset, groups_[i].gradient.narrow(0, 0, groups_[i].owned.numel)});
  }
  return out;
}

std::vector<FlatSlice> ShardedAdamW::parameter_slices() const {
  std::vector<FlatSlice> out;
  for (size_t i = 0; i < groups_.size(); ++i) {
    out.push_back({i, groups_[i].owned.offset, groups_[i].values.narrow(0, 0, groups_[i].owned.numel)});
  }
  return out;
}

std::vector<StateSlice> ShardedAdamW::state_slices() {
  std::vector<StateSlice> out;
  for (size_t i = 0; i < groups_.size(); ++i) {
    OptimizerShard& g = groups_[i];
    out.push_back({i, g.owned.offset, g.values.narrow(0, 0, g.owned.numel), g.state.exp_avg, g.state.exp_avg_sq});
  }
  return out;
}

int64_t ShardedAdamW::gradient_bytes() const {
  int64_t bytes = 0;
  for (const OptimizerShard& g : groups_) bytes += g.gradient.numel() * g.gradient.element_size();
  return bytes;
}

int64_t ShardedAdamW::moment_bytes() const {
  int64_t bytes = 0;
  for (const OptimizerShard& g : groups_) {
    bytes += (g.state.exp_avg.numel() + g.state.exp_avg_sq.numel()) * g.state.exp_avg.element_size();
  }
  return bytes;
}

}  // namespace trainer
