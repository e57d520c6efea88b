// The qwen2 model's sizes: recipe keys, and Hugging Face's config.json and
// safetensors index when model.hf_dir is given. Free of LibTorch, so that a
// fuzz target (tests/fuzz) reaches it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/Options.h"

namespace trainer::qwen2 {

struct Config {
  int64_t vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads;
  double rope_theta, rms_norm_eps, initializer_range;
  bool tie_word_embeddings;
  int64_t max_positions;
  int64_t head_dim() const { return hidden_size / num_heads; }
};

/// The plugin's recipe keys, in declaration order.
const std::vector<KeySpec>& keys();

/// The sizes from the recipe's [model] table and, with hf_dir, from its
/// config.json (keys the recipe also sets must agree). InputError naming
/// the file and key, or the recipe key, for anything out of bounds.
Config read_config(const Options& o);

/// The safetensors files of hf_dir: model.safetensors, or the shards its
/// model.safetensors.index.json names (file names beside the index only).
std::vector<std::string> weight_files(const Options& o);

}  // namespace trainer::qwen2
