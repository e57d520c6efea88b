// Deterministic global-batch sampling (see Sampler.h for the rule).
#include "run/Sampler.h"

#include <numeric>
#include <stdexcept>

#include "trainer/util/Random.h"

namespace trainer {

FeistelPermutation::FeistelPermutation(int64_t n, uint64_t key) : n_(n), key_(key) {
  if (n <= 0 || n > (int64_t(1) << 62)) throw std::invalid_argument("FeistelPermutation: n outside [1, 2^62]");
  while (half_bits_ < 31 && (int64_t(1) << (2 * half_bits_)) < n) ++half_bits_;
  half_mask_ = (uint64_t(1) << half_bits_) - 1;
}

uint64_t FeistelPermutation::round(int r, uint64_t half) const {
  uint64_t state = key_ ^ (static_cast<uint64_t>(r) << 56) ^ (half * 0xd6e8feb86659fd93ULL);
  return splitmix64(state) & half_mask_;
}

int64_t FeistelPermutation::operator()(int64_t index) const {
  if (index < 0 || index >= n_) throw std::out_of_range("FeistelPermutation: index outside [0, n)");
  uint64_t x = static_cast<uint64_t>(index);
  do {  // cycle-walking: the network permutes [0, 4^b); its cycles lead back into [0, n)
    uint64_t left = x >> half_bits_, right = x & half_mask_;
    for (int r = 0; r < 6; ++r) {
      const uint64_t next = left ^ round(r, right);
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

GlobalBatchSampler::GlobalBatchSampler(uint64_t seed, int64_t dataset_size, bool shuffle, SampleOrder order)
    : seed_(seed), size_(dataset_size), shuffle_(shuffle), order_(order) {
  if (dataset_size <= 0) throw std::invalid_argument("GlobalBatchSampler: empty dataset");
}

int64_t GlobalBatchSampler::index_at(int64_t position) {
  const int64_t epoch = position / size_;
  const int64_t offset = position % size_;
  if (!shuffle_) return offset;
  if (order_ == SampleOrder::Feistel) {
    if (!feistel_ || feistel_epoch_ != epoch) {
      feistel_.emplace(size_, seed_ * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL * static_cast<uint64_t>(epoch + 1));
      feistel_epoch_ = epoch;
    }
    return (*feistel_)(offset);
  }
  auto it = permutations_.find(epoch);
  if (it == permutations_.end()) {
    while (permutations_.size() >= 2) permutations_.erase(permutations_.begin());
    std::vector<int64_t> order(static_cast<size_t>(size_));
    std::iota(order.begin(), order.end(), 0);
    uint64_t state = seed_ * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(epoch) + 1;
    for (size_t i = order.size() - 1; i > 0; --i) {  // Fisher-Yates
      std::swap(order[i], order[uniform_below(state, i + 1)]);
    }
    it = permutations_.emplace(epoch, std::move(order)).first;
  }
  return it->second[static_cast<size_t>(offset)];
}

std::vector<int64_t> GlobalBatchSampler::global_batch(int64_t step, int64_t global_batch_size) {
  std::vector<int64_t> batch(static_cast<size_t>(global_batch_size));
  for (int64_t j = 0; j < global_batch_size; ++j) batch[j] = index_at(step * global_batch_size + j);
  return batch;
}

std::vector<int64_t> local_micro_batch(const std::vector<int64_t>& global, const BatchShape& shape, int rank,
                                       int64_t micro_step) {
  const int64_t per_rank = shape.micro_batch_size * shape.grad_accum_steps;
  const int64_t begin = rank * per_rank + micro_step * shape.micro_batch_size;
  return std::vector<int64_t>(global.begin() + begin, global.begin() + begin + shape.micro_batch_size);
}

}  // namespace trainer
