// GradientBuckets (trainer/sharding/GradientBuckets.h): buckets of whole
// parameters in backward order, and the hooks that say when each fills.
#include "trainer/sharding/GradientBuckets.h"

#include <algorithm>
#include <mutex>

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

namespace trainer {

struct GradientBuckets::State {
  std::mutex mutex;
  bool armed = false;
  std::vector<int> ready;  // per bucket: parameters accumulated in this backward
  std::vector<int> whole;  // per bucket: its parameter count
  size_t next = 0;         // the next bucket owed ready(), in bucket order
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
  state_->ready.assign(buckets_.size(), 0);
  for (const GradientBucket& bucket : buckets_) state_->whole.push_back(static_cast<int>(bucket.slots.size()));
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
              // In bucket order: b and every complete bucket after it, once
              // all before it were delivered.
              while (state->next < state->ready.size() && state->ready[state->next] == state->whole[state->next]) {
                if (state->done) state->done(state->next);
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
}

}  // namespace trainer
