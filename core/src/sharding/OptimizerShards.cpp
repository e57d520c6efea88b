// The optimizer half of every strategy (see trainer/sharding/OptimizerShards.h).
#include "trainer/sharding/OptimizerShards.h"

#include <algorithm>

#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainer/Errors.h"

namespace trainer {

OptimizerShards::OptimizerShards(Optimizer& optimizer, int shard_ranks)
    : optimizer_(&optimizer), shard_ranks_(shard_ranks) {}

OptimizerShards OptimizerShards::viewing(Optimizer& optimizer, std::vector<ParameterGroup>& groups, int rank, int ranks,
                                         bool write_compute) {
  OptimizerShards shards(optimizer, ranks);
  for (ParameterGroup& group : groups) {
    const Shard shard = shard_of(group.padded_numel, rank, ranks);
    const Shard owned = unpadded(group, shard);
    shards.add_group(shard, owned, group, group.values.narrow(0, shard.offset, shard.numel));
    if (write_compute && separate_compute(group)) {
      shards.groups_.back().compute = group.compute.narrow(0, owned.offset, owned.numel);
    }
  }
  return shards;
}

void all_gather_parameters(const OptimizerShards& optimizer, std::vector<ParameterGroup>& groups, Comm& comm) {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < groups.size(); ++g) {
    comm.all_gather(optimizer.groups()[g].values, groups[g].values);
    sync_compute(groups[g]);
  }
}

std::vector<ParameterInfo> parameter_infos(const ParameterGroup& group, size_t group_index) {
  std::vector<ParameterInfo> out;
  for (const ParameterSlot& slot : group.slots) {
    out.push_back({slot.name, slot.param.sizes().vec(), group.decay, group_index, slot.offset, slot.numel});
  }
  return out;
}

void OptimizerShards::add_group(const Shard& shard, const Shard& owned, const ParameterGroup& layout,
                                torch::Tensor values) {
  if (!optimizer_) throw std::logic_error("OptimizerShards::add_group before an optimizer was given");
  OptimizerShard g;
  g.shard = shard;
  g.owned = owned;
  g.decay = layout.decay;
  g.gradient = torch::zeros({shard.numel}, values.options());
  const torch::Dtype state_dtype =
      values.scalar_type() == torch::kFloat64 ? torch::kFloat64 : optimizer_->state_dtype();
  for (size_t k = 0; k < optimizer_->state_names().size(); ++k) {
    g.state.push_back(torch::zeros({owned.numel}, values.options().dtype(state_dtype)));
  }
  g.values = std::move(values);
  g.parameters = parameter_infos(layout, groups_.size());
  for (const ParameterInfo& p : g.parameters) g.whole_matrix.push_back(optimizer_->whole_matrix(p) ? 1 : 0);
  groups_.push_back(std::move(g));
}

namespace {

// Elements [begin, end) (group offsets, inside the owned range) of `g` as an UpdateSlice.
UpdateSlice slice_of(OptimizerShard& g, int64_t begin, int64_t end) {
  UpdateSlice s;
  s.offset = begin;
  s.decay = g.decay;
  s.values = g.values.narrow(0, begin - g.shard.offset, end - begin);
  s.gradient = g.gradient.narrow(0, begin - g.shard.offset, end - begin);
  for (torch::Tensor& t : g.state) s.state.push_back(t.narrow(0, begin - g.owned.offset, end - begin));
  if (g.compute.defined()) s.compute = g.compute.narrow(0, begin - g.owned.offset, end - begin);
  return s;
}

void refresh_compute(const UpdateSlice& s) {
  if (s.compute.defined()) s.compute.copy_(s.values);
}

}  // namespace

bool OptimizerShards::has_whole_matrix() const {
  for (const OptimizerShard& g : groups_) {
    if (std::find(g.whole_matrix.begin(), g.whole_matrix.end(), 1) != g.whole_matrix.end()) return true;
  }
  return false;
}

void OptimizerShards::update_elements(const UpdateArgs& args, size_t group, int64_t from, int64_t to) {
  torch::NoGradGuard no_grad;
  OptimizerShard& g = groups_.at(group);
  from = std::max(from, g.owned.offset);
  to = std::min(to, g.owned.offset + g.owned.numel);
  // Maximal runs of the owned elements in [from, to) between whole-matrix parameters.
  int64_t run = -1;  // start of the current run, -1: none
  const auto flush = [&](int64_t end) {
    if (run >= 0 && end > run) {
      UpdateSlice s = slice_of(g, run, end);
      s.group = group;
      if (!optimizer_->update(s, args)) refresh_compute(s);
    }
    run = -1;
  };
  for (size_t k = 0; k < g.parameters.size(); ++k) {
    const ParameterInfo& p = g.parameters[k];
    const int64_t begin = std::max(p.offset, from), end = std::min(p.offset + p.numel, to);
    if (end <= begin) continue;
    if (g.whole_matrix[k]) {
      flush(begin);
    } else if (run < 0) {
      run = begin;
    }
  }
  flush(to);
}

void OptimizerShards::update(const UpdateArgs& args, Comm* shard_comm, Comm* replica_comm) {
  torch::NoGradGuard no_grad;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    update_elements(args, gi, groups_[gi].owned.offset, groups_[gi].owned.offset + groups_[gi].owned.numel);
  }
  // Whole-matrix parameters: runs of one shape (rank-independent), each
  // rank's held matrices of a run transformed as one stack.
  struct Entry {
    size_t group;
    size_t index;
  };
  std::vector<std::vector<Entry>> shapes;  // per distinct shape, in order of first appearance
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const OptimizerShard& g = groups_[gi];
    for (size_t k = 0; k < g.parameters.size(); ++k) {
      if (!g.whole_matrix[k]) continue;
      const auto same = [&](const std::vector<Entry>& list) {
        return groups_[list.front().group].parameters[list.front().index].shape == g.parameters[k].shape;
      };
      const auto found = std::find_if(shapes.begin(), shapes.end(), same);
      (found == shapes.end() ? shapes.emplace_back() : *found).push_back({gi, k});
    }
  }
  struct Held {
    const ParameterInfo* info;
    UpdateSlice slice;
    torch::Tensor direction;
    int64_t begin, end;
  };
  // A run's matrices, held by this rank, and their transform: computed
  // here, or by the replica that owns the run and broadcast from it.
  struct Run {
    std::vector<Held> held;
    std::vector<int64_t> shape;  // of `transformed`: the matrix's, or the stack's
    torch::Tensor transformed;
    bool stacked = false;  // transformed holds one matrix per held one, in order
    int owner = 0;
  };
  const int replicas = replica_comm != nullptr ? replica_comm->world_size() : 1;
  const int me = replica_comm != nullptr ? replica_comm->rank() : 0;
  int64_t runs_seen = 0;
  std::vector<Run> pending;  // with several replicas: applied once every run's transform has arrived
  const auto apply_run = [&](Run& r) {
    for (size_t i = 0; i < r.held.size(); ++i) {
      const Held& h = r.held[i];
      const ParameterInfo& p = *h.info;
      const torch::Tensor t = r.stacked ? r.transformed[static_cast<int64_t>(i)] : r.transformed;
      if (t.numel() != p.numel || t.scalar_type() != h.slice.values.scalar_type()) {
        throw TrainingError(fmt::format("optimizer: transform of '{}' returned {} elements of {}, expected {} of {}",
                                        p.name, t.numel(), c10::toString(t.scalar_type()), p.numel,
                                        c10::toString(h.slice.values.scalar_type())));
      }
      UpdateSlice slice = h.slice;
      optimizer_->apply(p, slice, t.reshape({-1}).narrow(0, h.begin - p.offset, h.end - h.begin), args);
      refresh_compute(slice);
    }
  };
  for (const std::vector<Entry>& list : shapes) {
    const ParameterInfo& first = groups_[list.front().group].parameters[list.front().index];
    const auto stack = static_cast<size_t>(std::max<int64_t>(1, optimizer_->stack_size(first)));
    for (size_t run = 0; run < list.size(); run += stack) {
      std::vector<Held> held;
      for (size_t e = run; e < std::min(list.size(), run + stack); ++e) {
        OptimizerShard& g = groups_[list[e].group];
        const ParameterInfo& p = g.parameters[list[e].index];
        const int64_t per_rank = g.shard.numel;  // every rank's shard is as large
        const int64_t begin = std::max(p.offset, g.owned.offset);
        const int64_t end = std::min(p.offset + p.numel, g.owned.offset + g.owned.numel);
        const bool holds = end > begin;
        const bool spans =
            shard_ranks_ > 1 && per_rank > 0 && p.offset / per_rank != (p.offset + p.numel - 1) / per_rank;
        if (!spans && !holds) continue;
        torch::Tensor direction =
            spans ? torch::zeros({p.numel}, g.values.options()) : torch::empty({p.numel}, g.values.options());
        UpdateSlice s;
        if (holds) {
          s = slice_of(g, begin, end);
          s.group = list[e].group;
          optimizer_->prepare(p, s, direction.narrow(0, begin - p.offset, end - begin), args);
        }
        if (spans) {
          if (!shard_comm) {
            throw std::logic_error("OptimizerShards::update: a matrix spans shards and no comm was given");
          }
          shard_comm->all_reduce_sum(direction);  // disjoint parts and zeros: exact
        }
        if (holds) held.push_back({&p, std::move(s), std::move(direction), begin, end});
      }
      if (held.empty()) continue;
      Run r;
      r.owner = static_cast<int>(runs_seen++ % replicas);
      r.shape = first.shape;
      r.stacked = stack > 1;
      if (r.stacked) r.shape.insert(r.shape.begin(), static_cast<int64_t>(stack));
      const torch::TensorOptions options = held[0].direction.options();
      if (r.owner != me) {
        r.transformed = torch::empty(r.shape, options);  // filled by the owner's broadcast
        for (Held& h : held) h.direction = torch::Tensor();
      } else if (stack == 1) {
        r.transformed = optimizer_->transform(*held[0].info, held[0].direction.view(first.shape), args);
        held[0].direction = torch::Tensor();
      } else {
        torch::Tensor matrices = torch::zeros(r.shape, options);
        std::vector<ParameterInfo> infos;
        for (size_t i = 0; i < held.size(); ++i) {
          matrices[static_cast<int64_t>(i)].view({-1}).copy_(held[i].direction);
          infos.push_back(*held[i].info);
        }
        for (Held& h : held) h.direction = torch::Tensor();  // the stack holds them now
        r.transformed = optimizer_->transform_stack(infos, matrices, args);
        if (r.transformed.sizes() != matrices.sizes() || r.transformed.scalar_type() != matrices.scalar_type()) {
          throw TrainingError(
              fmt::format("optimizer: transform_stack of {} matrices like '{}' returned {} of {}, "
                          "expected {} of {}",
                          held.size(), first.name, fmt::join(r.transformed.sizes(), "x"),
                          c10::toString(r.transformed.scalar_type()), fmt::join(matrices.sizes(), "x"),
                          c10::toString(matrices.scalar_type())));
        }
      }
      r.held = std::move(held);
      if (replicas == 1) {
        apply_run(r);
      } else {
        pending.push_back(std::move(r));
      }
    }
  }
  if (pending.empty()) return;
  // Every replica has transformed its runs; each run's result goes from its
  // owner to the others (the same kernels on the same directions: the bits
  // each replica would have computed itself).
  std::vector<std::unique_ptr<CommWork>> broadcasts;
  for (Run& r : pending) {
    // A transform may return its matrix in another shape of the same size (apply reads it flat).
    if (!r.stacked && r.transformed.numel() == c10::multiply_integers(r.shape)) {
      r.transformed = r.transformed.reshape(r.shape);
    }
    if (r.transformed.scalar_type() != r.held[0].slice.values.scalar_type() ||
        r.transformed.sizes() != c10::IntArrayRef(r.shape)) {
      throw TrainingError(fmt::format("optimizer: transform of '{}' returned {} of {}, expected {} of {}",
                                      r.held[0].info->name, fmt::join(r.transformed.sizes(), "x"),
                                      c10::toString(r.transformed.scalar_type()), fmt::join(r.shape, "x"),
                                      c10::toString(r.held[0].slice.values.scalar_type())));
    }
    r.transformed = r.transformed.contiguous();
    broadcasts.push_back(replica_comm->broadcast_async(r.transformed, r.owner));
  }
  for (std::unique_ptr<CommWork>& work : broadcasts) work->wait();
  for (Run& r : pending) apply_run(r);
}

ShardReduction OptimizerShards::reduce_to_owners(Comm& comm, size_t group, int64_t begin, const torch::Tensor& bucket) {
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

double OptimizerShards::gradient_norm(Comm& comm) const {
  std::vector<torch::Tensor> owned;
  for (const OptimizerShard& g : groups_) owned.push_back(g.gradient.narrow(0, 0, g.owned.numel));
  return sharded_norm(owned, comm);
}

void OptimizerShards::zero_gradients() {
  for (OptimizerShard& g : groups_) g.gradient.zero_();
}

std::vector<FlatSlice> OptimizerShards::gradient_slices() const {
  std::vector<FlatSlice> out;
  for (size_t i = 0; i < groups_.size(); ++i) {
    out.push_back({i, groups_[i].owned.offset, groups_[i].gradient.narrow(0, 0, groups_[i].owned.numel)});
  }
  return out;
}

std::vector<FlatSlice> OptimizerShards::parameter_slices() const {
  std::vector<FlatSlice> out;
  for (size_t i = 0; i < groups_.size(); ++i) {
    out.push_back({i, groups_[i].owned.offset, groups_[i].values.narrow(0, 0, groups_[i].owned.numel)});
  }
  return out;
}

std::vector<StateSlice> OptimizerShards::state_slices() {
  std::vector<StateSlice> out;
  for (size_t i = 0; i < groups_.size(); ++i) {
    OptimizerShard& g = groups_[i];
    out.push_back({i, g.owned.offset, g.values.narrow(0, 0, g.owned.numel), g.state});
  }
  return out;
}

int64_t OptimizerShards::gradient_bytes() const {
  int64_t bytes = 0;
  for (const OptimizerShard& g : groups_) bytes += g.gradient.numel() * g.gradient.element_size();
  return bytes;
}

int64_t OptimizerShards::state_bytes() const {
  int64_t bytes = 0;
  for (const OptimizerShard& g : groups_) {
    for (const torch::Tensor& t : g.state) bytes += t.numel() * t.element_size();
  }
  return bytes;
}

}  // namespace trainer
