// Deterministic global-batch sampling (see Sampler.h for the rule).
#include "run/Sampler.h"

#include <numeric>
#include <stdexcept>

#include "trainer/util/Random.h"

namespace trainer {

GlobalBatchSampler::GlobalBatchSampler(uint64_t seed, int64_t dataset_size, bool shuffle)
    : seed_(seed), size_(dataset_size), shuffle_(shuffle) {
  if (dataset_size <= 0) throw std::invalid_argument("GlobalBatchSampler: empty dataset");
}

int64_t GlobalBatchSampler::index_at(int64_t position) {
  const int64_t epoch = position / size_;
  const int64_t offset = position % size_;
  if (!shuffle_) return offset;
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
