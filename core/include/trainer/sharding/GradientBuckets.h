// Buckets of whole parameters over flat parameter groups, in the order
// backward produces their gradients (each group from its end backwards), and
// the autograd hooks that tell a strategy when a bucket's gradients are
// final: the building block of communication that overlaps backward (ddp's
// all-reduce, zero2's reduce to each shard's owner).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "trainer/Comm.h"
#include "trainer/sharding/FlatParameters.h"

namespace trainer {

struct GradientBucket {
  size_t group = 0;
  int64_t begin = 0;          ///< its first element in the group's flat buffer
  int64_t end = 0;            ///< one past its last
  std::vector<size_t> slots;  ///< the group's parameters it holds, whole
  int64_t numel() const { return end - begin; }
};

class GradientBuckets {
 public:
  using Callback = std::function<void(size_t bucket)>;

  GradientBuckets();
  /// Buckets of at most `bucket_numel` elements, or of one parameter larger
  /// than that, numbered in the order backward completes them (by the
  /// position of each bucket's first parameter in Model::parameters(),
  /// last first): bucket 0 holds the model's last parameters.
  GradientBuckets(const std::vector<ParameterGroup>& groups, int64_t bucket_numel);

  const std::vector<GradientBucket>& buckets() const { return buckets_; }

  /// Hooks on every parameter's gradient accumulator (once; they live as
  /// long as the model's autograd nodes). While armed, on the autograd
  /// thread and one call at a time: first(b) right after the first of bucket
  /// b's parameters has had its gradient accumulated in this backward;
  /// ready(b) once all of them have and ready was called for every bucket
  /// before b in order(): ready comes in that order, whatever order the
  /// gradients come in, so collectives started from it are in the same
  /// order on every rank even when the ranks' graphs differ (a parameter
  /// some rank does not use). A parameter that takes no part in the
  /// backward never counts: the buckets still owed ready are then the last
  /// ones of order(), which the strategy finishes in that order after
  /// backward returns.
  void hook(const std::vector<ParameterGroup>& groups, Callback first, Callback ready);

  /// Arms the hooks for one backward, every count at zero, or disarms them.
  void arm(bool armed);

  /// The order ready() delivers buckets in: bucket index order until
  /// agree_on_order(), the same on every rank.
  const std::vector<size_t>& order() const;
  /// The buckets in the order they completed in the last armed backward,
  /// then those that did not, in order().
  std::vector<size_t> completion_order() const;
  /// Collective over `comm` (tensors on `device`), after a backward: every
  /// rank adopts rank 0's completion_order() as order(), so that later
  /// backwards deliver buckets as they come (as PyTorch DDP rebuilds its
  /// buckets after the first iteration) and still in one order everywhere.
  void agree_on_order(Comm& comm, torch::Device device);

 private:
  struct State;
  std::vector<GradientBucket> buckets_;
  std::shared_ptr<State> state_;  // shared with the hooks, so the block may move
};

}  // namespace trainer
