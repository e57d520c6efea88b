// Collating a micro-batch (see Collate.h).
#include "run/Collate.h"

#include <algorithm>

#include <fmt/format.h>

#include "trainer/Errors.h"
#include "trainer/ops/Attention.h"

namespace trainer {

// Pads samples to seq_len and turns target masks into labels (kIgnoreIndex
// where a token does not count). Checks what the dataset returned.
MicroBatch collate(const Dataset& dataset, const std::string& dataset_name, const std::vector<int64_t>& indices,
                   torch::Device device) {
  const int64_t rows = static_cast<int64_t>(indices.size());
  const int64_t seq = dataset.seq_len();
  const int64_t vocab = dataset.vocab_size();
  const bool packs = dataset.packs_documents();
  torch::Tensor inputs = torch::zeros({rows, seq}, torch::kInt64);
  torch::Tensor labels = torch::full({rows, seq}, kIgnoreIndex, torch::kInt64);
  torch::Tensor positions = packs ? torch::zeros({rows, seq}, torch::kInt64) : torch::Tensor();
  torch::Tensor documents = packs ? torch::zeros({rows, seq}, torch::kInt64) : torch::Tensor();
  auto in = inputs.accessor<int64_t, 2>();
  auto out = labels.accessor<int64_t, 2>();
  int64_t* position = packs ? positions.data_ptr<int64_t>() : nullptr;  // [rows, seq], row-major
  int64_t* number = packs ? documents.data_ptr<int64_t>() : nullptr;
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
    const std::vector<int64_t>& starts = sample.document_starts;
    if (!starts.empty()) {
      if (!packs) {
        throw InputError(
            fmt::format("dataset '{}' sample {}: {} documents in a sample of a dataset that does not "
                        "pack (its packs_documents() is false)",
                        dataset_name, indices[row], starts.size()));
      }
      for (size_t d = 0; d < starts.size(); ++d) {
        const int64_t previous = d == 0 ? -1 : starts[d - 1];
        if ((d == 0 && starts[0] != 0) || starts[d] <= previous || starts[d] >= n) {
          throw InputError(
              fmt::format("dataset '{}' sample {}: document {} starts at token {}; expected starts "
                          "ascending from 0 and below the sample's {} tokens",
                          dataset_name, indices[row], d, starts[d], n));
        }
      }
    }
    // Document d spans [starts[d], starts[d + 1]); the input at i predicts
    // token i + 1 only inside one document.
    size_t document = 0;
    const auto starts_at = [&](int64_t i) { return document + 1 < starts.size() && starts[document + 1] == i; };
    for (int64_t i = 0; i + 1 < n; ++i) {
      if (starts_at(i)) ++document;
      in[row][i] = sample.tokens[i];
      if (packs) {
        position[row * seq + i] = i - (starts.empty() ? 0 : starts[document]);
        number[row * seq + i] = static_cast<int64_t>(document);
      }
      if (sample.target[i + 1] && !starts_at(i + 1)) {
        out[row][i] = sample.tokens[i + 1];
        ++micro.batch.target_tokens;
      }
    }
    if (packs) {  // padding: a document of its own, positions from 0
      for (int64_t i = n - 1; i < seq; ++i) {
        position[row * seq + i] = i - (n - 1);
        number[row * seq + i] = static_cast<int64_t>(document) + 1;
      }
    }
    micro.input_tokens += n - 1;
    micro.documents += starts.empty() ? 1 : static_cast<int64_t>(starts.size());
    // Document d's input positions: [starts[d], starts[d + 1]), the last one's up to n - 1.
    for (size_t d = 0; d < std::max<size_t>(1, starts.size()); ++d) {
      const int64_t begin = starts.empty() ? 0 : starts[d];
      const int64_t end = d + 1 < starts.size() ? starts[d + 1] : n - 1;
      micro.attended_pairs += (end - begin) * (end - begin);
    }
  }
  // Pinned host memory lets the copies run asynchronously with the GPU's work.
  const bool pinned = device.is_cuda();
  micro.batch.input_ids = (pinned ? inputs.pin_memory() : inputs).to(device, /*non_blocking=*/pinned);
  micro.batch.labels = (pinned ? labels.pin_memory() : labels).to(device, /*non_blocking=*/pinned);
  if (packs) {
    micro.batch.position_ids = (pinned ? positions.pin_memory() : positions).to(device, /*non_blocking=*/pinned);
    micro.batch.document_ids = (pinned ? documents.pin_memory() : documents).to(device, /*non_blocking=*/pinned);
    const ops::DocumentLayout layout = ops::document_layout(documents);
    micro.batch.document_offsets =
        (pinned ? layout.offsets.pin_memory() : layout.offsets).to(device, /*non_blocking=*/pinned);
    micro.batch.longest_document = layout.longest;
  }
  return micro;
}

}  // namespace trainer
