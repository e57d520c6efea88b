// The optimizer half of a sharded strategy (see trainer/sharding/ShardedAdamW.h).
#include "trainer/sharding/ShardedAdamW.h"

#include <algorithm>

#include <fmt/format.h>

#include "trainer/Errors.h"

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

ShardReduction ShardedAdamW::reduce_to_owners(Comm& comm, size_t group, int64_t begin, const torch::Tensor& bucket) {
  OptimizerShard& g = groups_.at(group);
  const int64_t per_rank = g.shard.numel;  // every rank's shard is as large; rank r's starts at r * per_rank
  const int64_t end = begin + bucket.numel();
  ShardReduction reduction;
  if (per_rank == 0) return reduction;
  for (int64_t owner = begin / per_rank; owner * per_rank < end; ++owner) {
    const int64_t from = std::max(begin, owner * per_rank);
    const int64_t to = std::min(end, (owner + 1) * per_rank);
    torch::Tensor part = bucket.narrow(0, from - begin, to - from);
    reduction.works_.push_back(comm.reduce_sum_async(part, static_cast<int>(owner)));
    if (owner == comm.rank()) {
      reduction.mine_ = part;
      reduction.into_ = g.gradient.narrow(0, from - g.shard.offset, to - from);
    }
  }
  return reduction;
}

torch::Tensor ShardReduction::finish() {
  for (std::unique_ptr<CommWork>& work : works_) work->wait();
  works_.clear();
  torch::NoGradGuard no_grad;
  if (mine_.defined()) into_.add_(mine_);  // widened exactly when reduced in bf16
  torch::Tensor added = std::move(into_);
  mine_ = into_ = torch::Tensor();
  return added;
}

double ShardedAdamW::gradient_norm(Comm& comm) const {
  std::vector<torch::Tensor> owned;
  for (const OptimizerShard& g : groups_) owned.push_back(g.gradient.narrow(0, 0, g.owned.numel));
  return sharded_norm(owned, comm);
}

void ShardedAdamW::update(const AdamWConfig& config, const UpdateArgs& args) {
  torch::NoGradGuard no_grad;
  for (OptimizerShard& g : groups_) {
    adamw_update(g.values.narrow(0, 0, g.owned.numel), g.gradient.narrow(0, 0, g.owned.numel), g.state, config, g.decay,
                 args.lr, args.adam_step, args.grad_scale);
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
