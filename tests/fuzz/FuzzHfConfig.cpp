// libFuzzer target: a Hugging Face directory's config.json and
// model.safetensors.index.json as the qwen2 model reads them (model.hf_dir).
// The input is written as both files. Any input either gives sizes within
// the recipe keys' bounds and shard names beside the index, or throws
// InputError; it must never crash or hang.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "FuzzScratch.h"
#include "Qwen2Config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::Scratch scratch("fuzz-hf");
  static const std::filesystem::path dir = scratch.path;
  std::filesystem::create_directories(dir);
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::ofstream(dir / "config.json", std::ios::trunc) << text;
  std::ofstream(dir / "model.safetensors.index.json", std::ios::trunc) << text;
  using E = trainer::Options::Entry;
  const trainer::Options options(
      "model", "fuzz.toml",
      {E{"vocab_size", int64_t(64), "default"}, E{"hidden_size", int64_t(64), "default"},
       E{"intermediate_size", int64_t(128), "default"}, E{"num_hidden_layers", int64_t(2), "default"},
       E{"num_attention_heads", int64_t(4), "default"}, E{"num_key_value_heads", int64_t(2), "default"},
       E{"rope_theta", 10000.0, "default"}, E{"rms_norm_eps", 1e-6, "default"}, E{"initializer_range", 0.02, "default"},
       E{"tie_word_embeddings", false, "default"}, E{"max_position_embeddings", int64_t(32768), "default"},
       E{"hf_dir", dir.string(), "fuzz.toml:1:1"}});
  try {
    const trainer::qwen2::Config c = trainer::qwen2::read_config(options);
    if (c.hidden_size % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0 || c.head_dim() % 2 != 0)
      __builtin_trap();
  } catch (const std::exception&) {
  }
  try {
    for (const std::string& file : trainer::qwen2::weight_files(options)) {
      if (std::filesystem::path(file).parent_path() != dir) __builtin_trap();  // shards stay beside the index
    }
  } catch (const std::exception&) {
  }
  return 0;
}
