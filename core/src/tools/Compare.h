// `trainer compare`: per-step agreement of loss and gradient norm between
// runs, the question an A/B experiment asks.
#pragma once

#include <string>
#include <vector>

namespace trainer {

/// Prints a per-step table of each run's loss and its relative deviation
/// from the first run (and the same for grad_norm), then the largest
/// deviation and its step, and the recipe keys whose values differ between
/// the runs (from each run's resolved recipe.toml). With `html` non-empty,
/// also writes a self-contained report there (uPlot embedded): loss,
/// gradient norm and learning rate of every run overlaid, the relative
/// deviations from the first run on a log axis with the tolerance and the
/// first step beyond it, and the differing keys. Returns 0 when every step
/// of every run agrees within `rtol`, 1 otherwise (also when step counts
/// differ).
int compare_runs(const std::vector<std::string>& run_dirs, double rtol, bool quiet, const std::string& html = "");

}  // namespace trainer
