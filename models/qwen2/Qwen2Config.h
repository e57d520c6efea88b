// The qwen2 model's sizes: recipe keys, and Hugging Face's config.json and
// safetensors index when model.hf_dir is given. Free of LibTorch, so that a
// fuzz target (tests/fuzz) reaches it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/Options.h"

namespace trainer::qwen2 {

/// Llama 3's rope scaling (rope_type "llama3"); factor 1: none.
struct RopeScalingConfig {
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_positions = 8192;
};

struct Config {
  int64_t vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads;
  double rope_theta, rms_norm_eps, initializer_range;
  bool tie_word_embeddings;
  int64_t max_positions;
  bool attention_bias = true;  ///< q/k/v biases: Qwen2 has them, Llama not
  RopeScalingConfig rope_scaling;
  int64_t head_dim() const { return hidden_size / num_heads; }
  /// Qwen2 has q/k/v biases and plain rope; anything else exports as Llama.
  bool is_llama() const { return !attention_bias || rope_scaling.factor != 1.0; }
};

/// The plugin's recipe keys, in declaration order.
const std::vector<KeySpec>& keys();

/// The sizes from the recipe's [model] table and, with hf_dir, from its
/// config.json (model_type qwen2 or llama; keys the recipe also sets must
/// agree). InputError naming
/// the file and key, or the recipe key, for anything out of bounds.
Config read_config(const Options& o);

/// The safetensors files of hf_dir: model.safetensors, or the shards its
/// model.safetensors.index.json names (file names beside the index only).
std::vector<std::string> weight_files(const Options& o);

}  // namespace trainer::qwen2
