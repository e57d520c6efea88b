// The training loop: the one owner of the accumulation state (micro-step
// index, boundary, N_t) and of the optimizer-step counters.
#pragma once

#include "Recipe.h"

namespace trainer {

/// Trains the recipe to its last step, writing recipe.toml and the loggers'
/// outputs into the run's output directory. Throws InputError for bad input
/// found while setting up (e.g. dataset and model disagree), TrainingError
/// for failures while training.
void train(const Recipe& recipe);

/// The run's output directory: run.output_dir, or runs/<run.name>.
std::string output_dir_of(const Recipe& recipe);

}  // namespace trainer
