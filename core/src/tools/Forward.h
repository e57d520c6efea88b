// `trainer forward`: a model's logits, for checking it against another implementation.
#pragma once

#include <string>

#include "recipe/Recipe.h"

namespace trainer {

/// Builds the recipe's model and writes its fp32 logits for the token ids in
/// `tokens_file` (one sequence per line, whitespace-separated, equal lengths)
/// to `out_file` as raw little-endian float32 [sequences, length, vocab].
/// Prints the shape.
void write_logits(const Recipe& recipe, const std::string& tokens_file, const std::string& out_file);

}  // namespace trainer
