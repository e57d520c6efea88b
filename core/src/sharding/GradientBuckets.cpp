// GradientBuckets (trainer/sharding/GradientBuckets.h): buckets of whole
// parameters in backward order, and the hooks that say when each fills.
#include "trainer/sharding/GradientBuckets.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

namespace trainer {

struct GradientBuckets::State {
  std::mutex mutex;
  bool armed = false;
  std::vector<int> ready;         // per bucket: parameters accumulated in this backward
  std::vector<int> whole;         // per bucket: its parameter count
  std::vector<size_t> order;      // the order ready() delivers buckets in
  size_t next = 0;                // the position in `order` of the next bucket owed ready()
  std::vector<size_t> completed;  // buckets in the order they completed, this backward
  Callback first, done;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // the hooks live as long as these
};

GradientBuckets::GradientBuckets() : state_(std::make_shared<State>()) {}

GradientBuckets::GradientBuckets(const std::vector<ParameterGroup>& groups, int64_t bucket_numel)
    : state_(std::make_shared<State>()) {
  for (size_t g = groups.size(); g-- > 0;) {
    const std::vector<ParameterSlot>& slots = groups[g].slots;
    GradientBucket bucket;
    bucket.group = g;
    bucket.end = groups[g].numel;
    bucket.begin = bucket.end;
    for (size_t i = slots.size(); i-- > 0;) {
      if (!bucket.slots.empty() && bucket.end - slots[i].offset > bucket_numel) {
        buckets_.push_back(bucket);
        bucket.end = bucket.begin;
        bucket.slots.clear();
      }
      bucket.begin = slots[i].offset;
      bucket.slots.push_back(i);
    }
    if (!bucket.slots.empty()) buckets_.push_back(bucket);
  }
  // Numbered in about the order backward completes them, the first
  // backward's delivery order: backward reaches parameters in about reverse
  // model order, so a bucket is complete once its first parameter in model
  // order has its gradient. A bucket of parameters spread over every layer
  // (biases and norms) comes last, after the buckets it spans. The order is
  // a function of the model alone: the same on every rank.
  auto first_position = [&](const GradientBucket& bucket) {
    size_t first = std::numeric_limits<size_t>::max();
    for (size_t slot : bucket.slots) first = std::min(first, groups[bucket.group].slots[slot].position);
    return first;
  };
  std::stable_sort(buckets_.begin(), buckets_.end(), [&](const GradientBucket& a, const GradientBucket& b) {
    return first_position(a) > first_position(b);
  });
  state_->ready.assign(buckets_.size(), 0);
  for (const GradientBucket& bucket : buckets_) state_->whole.push_back(static_cast<int>(bucket.slots.size()));
  for (size_t b = 0; b < buckets_.size(); ++b) state_->order.push_back(b);
}

void GradientBuckets::hook(const std::vector<ParameterGroup>& groups, Callback first, Callback ready) {
  state_->first = std::move(first);
  state_->done = std::move(ready);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t slot : buckets_[b].slots) {
      std::shared_ptr<torch::autograd::Node> accumulator =
          torch::autograd::impl::grad_accumulator(groups[buckets_[b].group].slots[slot].param);
      const int parameters = static_cast<int>(buckets_[b].slots.size());
      std::weak_ptr<State> weak = state_;
      accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak, b, parameters](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            const std::shared_ptr<State> state = weak.lock();
            if (!state) return outputs;
            std::lock_guard<std::mutex> lock(state->mutex);
            if (!state->armed) return outputs;
            const int count = ++state->ready[b];
            if (count == 1 && state->first) state->first(b);
            if (count == parameters) {
              state->completed.push_back(b);
              // In the agreed order: every complete bucket up to the first
              // that is not, which holds back the ones behind it.
              while (state->next < state->order.size() &&
                     state->ready[state->order[state->next]] == state->whole[state->order[state->next]]) {
                if (state->done) state->done(state->order[state->next]);
                ++state->next;
              }
            }
            return outputs;
          }));
      state_->accumulators.push_back(std::move(accumulator));
    }
  }
}

void GradientBuckets::arm(bool armed) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->armed = armed;
  std::fill(state_->ready.begin(), state_->ready.end(), 0);
  state_->next = 0;
  if (armed) state_->completed.clear();
}

const std::vector<size_t>& GradientBuckets::order() const { return state_->order; }

std::vector<size_t> GradientBuckets::completion_order() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<size_t> out = state_->completed;
  std::vector<bool> seen(buckets_.size(), false);
  for (size_t b : out) seen[b] = true;
  for (size_t b : state_->order) {
    if (!seen[b]) out.push_back(b);
  }
  return out;
}

void GradientBuckets::agree_on_order(Comm& comm, torch::Device device) {
  std::vector<int64_t> mine;
  for (size_t b : completion_order()) mine.push_back(static_cast<int64_t>(b));
  torch::Tensor order = torch::tensor(mine, torch::kInt64).to(device);
  if (comm.world_size() > 1 && !mine.empty()) comm.broadcast(order, 0);
  const torch::Tensor host = order.cpu();
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (size_t i = 0; i < state_->order.size(); ++i) state_->order[i] = static_cast<size_t>(host[i].item<int64_t>());
}

}  // namespace trainer
