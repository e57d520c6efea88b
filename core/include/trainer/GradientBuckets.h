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

#include "trainer/FlatParameters.h"

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
  /// than that; bucket 0 holds the last parameters of the last group.
  GradientBuckets(const std::vector<ParameterGroup>& groups, int64_t bucket_numel);

  const std::vector<GradientBucket>& buckets() const { return buckets_; }

  /// Hooks on every parameter's gradient accumulator (once; they live as
  /// long as the model's autograd nodes). While armed, on the autograd
  /// thread and one call at a time: first(b) right after the first of bucket
  /// b's parameters has had its gradient accumulated in this backward, then
  /// ready(b) once all of them have (both, in that order, for a bucket of
  /// one). A parameter that takes no part in the backward never counts:
  /// the strategy finishes such buckets after backward returns.
  void hook(const std::vector<ParameterGroup>& groups, Callback first, Callback ready);

  /// Arms the hooks for one backward, every count at zero, or disarms them.
  void arm(bool armed);

 private:
  struct State;
  std::vector<GradientBucket> buckets_;
  std::shared_ptr<State> state_;  // shared with the hooks, so the block may move
};

/// A gradient that never exists in full (zero2's): each bucket gets a fresh
/// fp32 buffer as its parameters' .grad just before its gradients arrive,
/// in the order their first gradients arrived in the previous backward
/// (the first bucket when backward starts, the next when one's first
/// gradient arrives; in the first backward a gradient that finds its bucket
/// unbound is moved into the buffer). Once a bucket's gradients are final it
/// goes to `send`; the function `send` returns is called, and the buffer
/// released, when the next bucket's first gradient arrives or when backward
/// ends. So at most two buckets are live, besides those whose gradients
/// arrive at both ends of backward (a tied embedding's, a small group of
/// norms spread over every layer), which live through it.
/// `groups` must outlive it and not move; it does not move either (its
/// hooks point to it).
class StreamedGradients {
 public:
  using Finish = std::function<void()>;
  using Send = std::function<Finish(const GradientBucket& bucket, const torch::Tensor& buffer)>;

  StreamedGradients(std::vector<ParameterGroup>& groups, int64_t bucket_numel, Send sender);
  StreamedGradients(const StreamedGradients&) = delete;
  StreamedGradients& operator=(const StreamedGradients&) = delete;

  /// loss.backward() with every bucket sent and finished when it returns
  /// (buckets without any gradient in it as zeros).
  void backward(const torch::Tensor& loss);

  /// The most bytes of bucket buffers live at once so far.
  int64_t peak_bytes() const { return peak_bytes_; }

 private:
  void first_gradient(size_t b);
  void bind(size_t b);
  void send(size_t b);
  void finish();

  std::vector<ParameterGroup>* groups_;
  Send send_;
  GradientBuckets layout_;
  std::vector<torch::Tensor> buffers_;  // per bucket: its fp32 gradient while bound
  std::vector<bool> sent_;
  std::vector<size_t> arrivals_;  // buckets in the order their first gradient arrived, this backward
  std::vector<size_t> next_;      // per bucket: the one after it in the previous backward's order
  size_t first_ = 0;              // the previous backward's first
  std::vector<std::pair<size_t, Finish>> in_flight_;
  int64_t live_bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace trainer
