// The training loop: the one owner of the accumulation state (micro-step
// index, boundary, N_t) and of the optimizer-step counters.
#pragma once

#include <stdexcept>

#include "distributed/Launcher.h"
#include "recipe/Recipe.h"

namespace trainer {

/// Trains the recipe to its last step, writing recipe.toml and the loggers'
/// outputs into the run's output directory. Throws InputError for bad input
/// found while setting up (e.g. dataset and model disagree), TrainingError
/// for failures while training.
/// `world` says which rank this process is; at world size > 1 the loop joins
/// the rendezvous and loads the comm plugin named by distributed.backend.
void train(const Recipe& recipe, PluginRegistry& registry, const WorldInfo& world);

/// Thrown after a SIGTERM or SIGINT: the step in flight finished and a
/// checkpoint was written. The CLI exits with kExitPreempted.
class Preempted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
inline constexpr int kExitPreempted = 75;  // EX_TEMPFAIL: try again (resume)

}  // namespace trainer
