// StreamedGradients (trainer/sharding/StreamedGradients.h): buckets bound just
// before their gradients arrive, sent once final, released after.
#include "trainer/sharding/StreamedGradients.h"

#include <algorithm>

namespace trainer {

StreamedGradients::StreamedGradients(std::vector<ParameterGroup>& groups, int64_t bucket_numel, Send sender)
    : groups_(&groups), send_(std::move(sender)), layout_(groups, bucket_numel) {
  const size_t n = layout_.buckets().size();
  buffers_.resize(n);
  sent_.assign(n, false);
  next_.resize(n);
  for (size_t b = 0; b < n; ++b) next_[b] = b + 1;  // until a backward has shown the order: the layout's
  first_ = 0;
  layout_.hook(
      groups, [this](size_t b) { first_gradient(b); }, [this](size_t b) { send(b); });
}

void StreamedGradients::backward(const torch::Tensor& loss) {
  const size_t n = buffers_.size();
  if (n == 0) return loss.backward();
  arrivals_.clear();
  bind(first_);
  layout_.arm(true);
  loss.backward();
  layout_.arm(false);
  for (size_t b : layout_.order()) {  // the agreed order, as the hooks sent the others
    if (sent_[b]) continue;
    bind(b);
    send(b);
  }
  finish();
  std::fill(sent_.begin(), sent_.end(), false);
  // The order for the next backward: this one's arrivals, then buckets that saw no gradient.
  std::vector<bool> seen(n, false);
  for (size_t b : arrivals_) seen[b] = true;
  for (size_t b = 0; b < n; ++b) {
    if (!seen[b]) arrivals_.push_back(b);
  }
  first_ = arrivals_[0];
  for (size_t i = 0; i < n; ++i) next_[arrivals_[i]] = i + 1 < n ? arrivals_[i + 1] : n;
}

// On the autograd thread: the first of bucket b's gradients was accumulated.
// The reductions in flight end, and when b came as expected (it was bound),
// the bucket expected after it is bound; an unexpected b (the first
// backward's order was a guess) binds nothing ahead, which keeps two live.
void StreamedGradients::first_gradient(size_t b) {
  arrivals_.push_back(b);
  const bool expected = buffers_[b].defined();
  finish();
  bind(b);
  if (expected && next_[b] < buffers_.size() && !sent_[next_[b]]) bind(next_[b]);
}

// An fp32 buffer as the .grad of bucket b's parameters; a gradient autograd
// stored already (the bucket was not bound in time) is moved into it.
void StreamedGradients::bind(size_t b) {
  if (buffers_[b].defined()) return;
  const GradientBucket& bucket = layout_.buckets()[b];
  ParameterGroup& group = (*groups_)[bucket.group];
  buffers_[b] = torch::zeros({bucket.numel()}, group.values.options());
  torch::NoGradGuard no_grad;
  for (size_t i : bucket.slots) {
    ParameterSlot& slot = group.slots[i];
    torch::Tensor view = buffers_[b].narrow(0, slot.offset - bucket.begin, slot.numel).view(slot.param.sizes());
    if (slot.param.grad().defined()) view.add_(slot.param.grad());
    slot.param.mutable_grad() = view;
  }
  live_bytes_ += bucket.numel() * 4;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
}

void StreamedGradients::send(size_t b) {
  in_flight_.emplace_back(b, send_(layout_.buckets()[b], buffers_[b]));
  sent_[b] = true;
}

void StreamedGradients::finish() {
  for (auto& [b, finish_bucket] : in_flight_) {
    finish_bucket();
    const GradientBucket& bucket = layout_.buckets()[b];
    for (size_t i : bucket.slots) (*groups_)[bucket.group].slots[i].param.mutable_grad() = torch::Tensor();
    buffers_[b] = torch::Tensor();
    live_bytes_ -= bucket.numel() * 4;
  }
  in_flight_.clear();
}

}  // namespace trainer
