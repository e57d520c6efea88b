// Run comparison over metrics.jsonl files.
#include "Compare.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "Metrics.h"
#include "trainer/Errors.h"

namespace trainer {

namespace {
double deviation(double value, double reference) {
  if (value == reference) return 0.0;
  return std::abs(value - reference) / std::max(std::abs(reference), 1e-30);
}
}  // namespace

int compare_runs(const std::vector<std::string>& run_dirs, double rtol, bool quiet) {
  if (run_dirs.size() < 2) throw InputError("trainer compare: give at least two run directories");
  std::vector<std::vector<MetricsRow>> runs;
  for (const std::string& dir : run_dirs) runs.push_back(read_metrics(dir + "/metrics.jsonl"));
  const std::vector<MetricsRow>& reference = runs.front();
  bool agree = true;
  for (size_t r = 1; r < runs.size(); ++r) {
    if (runs[r].size() != reference.size()) {
      fmt::print("{}: {} steps, {} has {}\n", run_dirs[r], runs[r].size(), run_dirs[0], reference.size());
      agree = false;
    }
  }
  const size_t steps = std::min_element(runs.begin(), runs.end(), [](const auto& a, const auto& b) {
                         return a.size() < b.size();
                       })->size();
  if (!quiet) {
    fmt::print("{:>6} {:>14}", "step", "loss[0]");
    for (size_t r = 1; r < runs.size(); ++r) fmt::print(" {:>11} {:>11}", fmt::format("dloss[{}]", r), fmt::format("dgrad[{}]", r));
    fmt::print("\n");
  }
  double worst = 0.0;
  size_t worst_step = 0, worst_run = 0;
  std::string worst_key = "loss";
  for (size_t i = 0; i < steps; ++i) {
    if (!quiet) fmt::print("{:>6} {:>14.8f}", static_cast<int64_t>(reference[i].at("step")), reference[i].at("loss"));
    for (size_t r = 1; r < runs.size(); ++r) {
      for (const char* key : {"loss", "grad_norm"}) {
        const double d = deviation(runs[r][i].at(key), reference[i].at(key));
        if (!(d <= rtol)) agree = false;
        if (!(d <= worst)) {
          worst = d;
          worst_step = i;
          worst_run = r;
          worst_key = key;
        }
        if (!quiet) fmt::print(" {:>11.3e}", d);
      }
    }
    if (!quiet) fmt::print("\n");
  }
  fmt::print("largest relative deviation: {:.3e} ({} of {} at step {}); tolerance {:.1e}: {}\n", worst, worst_key,
             run_dirs[worst_run], steps ? static_cast<int64_t>(reference[worst_step].at("step")) : 0, rtol,
             agree ? "all agree" : "DIFFER");
  return agree ? 0 : 1;
}

}  // namespace trainer
