// Collating a micro-batch (see Collate.h).
#include "run/Collate.h"

#include <fmt/format.h>

#include "trainer/Errors.h"

namespace trainer {

// Pads samples to seq_len and turns target masks into labels (kIgnoreIndex
// where a token does not count). Checks what the dataset returned.
MicroBatch collate(const Dataset& dataset, const std::string& dataset_name, const std::vector<int64_t>& indices,
                   torch::Device device) {
  const int64_t rows = static_cast<int64_t>(indices.size());
  const int64_t seq = dataset.seq_len();
  const int64_t vocab = dataset.vocab_size();
  torch::Tensor inputs = torch::zeros({rows, seq}, torch::kInt64);
  torch::Tensor labels = torch::full({rows, seq}, kIgnoreIndex, torch::kInt64);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = labels.accessor<int64_t, 2>();
  MicroBatch micro;
  for (int64_t row = 0; row < rows; ++row) {
    const Sample sample = dataset.get(indices[row]);
    const int64_t n = static_cast<int64_t>(sample.tokens.size());
    if (n < 2 || n > seq + 1 || sample.target.size() != sample.tokens.size()) {
      throw InputError(
          fmt::format("dataset '{}' sample {}: {} tokens and {} target flags; expected equal counts "
                      "between 2 and seq_len + 1 = {}",
                      dataset_name, indices[row], n, sample.target.size(), seq + 1));
    }
    for (int64_t i = 0; i < n; ++i) {
      if (sample.tokens[i] < 0 || sample.tokens[i] >= vocab) {
        throw InputError(fmt::format("dataset '{}' sample {}: token {} at position {} is outside [0, vocab_size = {})",
                                     dataset_name, indices[row], sample.tokens[i], i, vocab));
      }
    }
    for (int64_t i = 0; i + 1 < n; ++i) {
      in[row][i] = sample.tokens[i];
      if (sample.target[i + 1]) {
        out[row][i] = sample.tokens[i + 1];
        ++micro.batch.target_tokens;
      }
    }
    micro.input_tokens += n - 1;
  }
  // Pinned host memory lets the copies run asynchronously with the GPU's work.
  const bool pinned = device.is_cuda();
  micro.batch.input_ids = (pinned ? inputs.pin_memory() : inputs).to(device, /*non_blocking=*/pinned);
  micro.batch.labels = (pinned ? labels.pin_memory() : labels).to(device, /*non_blocking=*/pinned);
  return micro;
}

}  // namespace trainer
