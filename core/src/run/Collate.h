// A micro-batch as the model takes it: samples padded to seq_len, target
// flags turned into labels, on the run's device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "trainer/Dataset.h"
#include "trainer/Model.h"

namespace trainer {

struct MicroBatch {
  Batch batch;
  int64_t input_tokens = 0;    ///< non-padding input positions
  int64_t documents = 0;       ///< documents in its samples (one per sample unless packed)
  int64_t attended_pairs = 0;  ///< sum over those documents of their input positions squared
};

/// The dataset's samples `indices`, padded to seq_len, with labels
/// kIgnoreIndex where a token does not count, copied to `device`. A
/// dataset that packs gets position_ids and document_ids too, and no label
/// predicts a document's first token from the document before it.
/// InputError naming the dataset and sample when a sample is malformed.
MicroBatch collate(const Dataset& dataset, const std::string& dataset_name, const std::vector<int64_t>& indices,
                   torch::Device device);

}  // namespace trainer
