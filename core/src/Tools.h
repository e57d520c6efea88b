// Commands beside training: export a run's weights for Hugging Face, and
// compute a model's logits for checking it against another implementation.
#pragma once

#include <string>

#include "Recipe.h"

namespace trainer {

/// Copies RUN_DIR's model.safetensors and config.json into `to` (created),
/// after checking the safetensors file reads back; or, when RUN_DIR is a
/// checkpoint, consolidates its shards. InputError if missing or corrupt.
void export_run(const std::string& run_dir, const std::string& to);

/// Builds the recipe's model and writes its fp32 logits for the token ids in
/// `tokens_file` (one sequence per line, whitespace-separated, equal lengths)
/// to `out_file` as raw little-endian float32 [sequences, length, vocab].
/// Prints the shape.
void write_logits(const Recipe& recipe, const std::string& tokens_file, const std::string& out_file);

}  // namespace trainer
