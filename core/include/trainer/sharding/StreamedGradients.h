// zero2's gradient path as a building block: buckets of the full gradient
// bound as their parameters' .grad just in time and sent once final, so
// that the full gradient never exists at once.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "trainer/sharding/GradientBuckets.h"

namespace trainer {

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

  /// The buckets; their order is agreed with agree_on_order() (collective)
  /// after a first backward.
  GradientBuckets& layout() { return layout_; }

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
