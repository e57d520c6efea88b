// Run comparison over metrics.jsonl files.
#include "Compare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "Metrics.h"
#include "trainer/Errors.h"

namespace trainer {

namespace {

double deviation(double value, double reference) {
  if (value == reference || (std::isnan(value) && std::isnan(reference))) return 0.0;  // equal, or both skipped
  return std::abs(value - reference) / std::max(std::abs(reference), 1e-30);
}

// One run's records by step, each with the keys compared; anything else is
// an error naming the file and the record.
std::map<int64_t, MetricsRow> records_by_step(const std::string& dir) {
  const std::string file = dir + "/metrics.jsonl";
  if (!std::filesystem::is_regular_file(file)) {
    throw InputError(fmt::format("{}: no metrics file (is {} a run directory?)", file, dir));
  }
  const std::vector<MetricsRow> rows = read_metrics(file);
  if (rows.empty()) throw InputError(fmt::format("{}: no step records", file));
  std::map<int64_t, MetricsRow> by_step;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (const char* key : {"step", "loss", "grad_norm"}) {
      if (rows[i].count(key) == 0) {
        throw InputError(fmt::format("{}: record {} has no numeric '{}'", file, i + 1, key));
      }
    }
    const double step = rows[i].at("step");
    if (!(step >= 1) || step != std::floor(step) || step > 1e15) {
      throw InputError(fmt::format("{}: record {} has step {}; expected a positive integer", file, i + 1, step));
    }
    if (!by_step.emplace(static_cast<int64_t>(step), rows[i]).second) {
      throw InputError(fmt::format("{}: step {} appears twice (record {})", file, static_cast<int64_t>(step), i + 1));
    }
  }
  return by_step;
}

}  // namespace

int compare_runs(const std::vector<std::string>& run_dirs, double rtol, bool quiet) {
  if (run_dirs.size() < 2) throw InputError("trainer compare: give at least two run directories");
  if (!std::isfinite(rtol) || rtol < 0) {
    throw InputError(fmt::format("trainer compare: --rtol must be a finite number >= 0, got {}", rtol));
  }
  std::vector<std::map<int64_t, MetricsRow>> runs;
  for (const std::string& dir : run_dirs) runs.push_back(records_by_step(dir));
  const std::map<int64_t, MetricsRow>& reference = runs.front();
  bool agree = true;
  // Records are matched by their step, never by position.
  std::vector<int64_t> steps;
  for (const auto& [step, row] : reference) {
    bool everywhere = true;
    for (size_t r = 1; r < runs.size(); ++r) everywhere = everywhere && runs[r].count(step) > 0;
    if (everywhere) steps.push_back(step);
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    if (runs[r].size() != reference.size() || runs[r].size() != steps.size()) {
      fmt::print("note: {} has {} steps ({} to {}), {} has {} ({} to {}); {} steps are in every run\n", run_dirs[r],
                 runs[r].size(), runs[r].begin()->first, runs[r].rbegin()->first, run_dirs[0], reference.size(),
                 reference.begin()->first, reference.rbegin()->first, steps.size());
      agree = false;
    }
  }
  if (steps.empty()) throw InputError("trainer compare: the runs have no step in common");
  if (!quiet) {
    fmt::print("{:>6} {:>14}", "step", "loss[0]");
    for (size_t r = 1; r < runs.size(); ++r) fmt::print(" {:>11} {:>11}", fmt::format("dloss[{}]", r), fmt::format("dgrad[{}]", r));
    fmt::print("\n");
  }
  double worst = 0.0;
  int64_t worst_step = steps.front();
  size_t worst_run = 1;
  std::string worst_key = "loss";
  for (const int64_t step : steps) {
    const MetricsRow& ref = reference.at(step);
    if (!quiet) fmt::print("{:>6} {:>14.8f}", step, ref.at("loss"));
    for (size_t r = 1; r < runs.size(); ++r) {
      for (const char* key : {"loss", "grad_norm"}) {
        const double d = deviation(runs[r].at(step).at(key), ref.at(key));
        if (!(d <= rtol)) agree = false;
        if (!(d <= worst)) {
          worst = d;
          worst_step = step;
          worst_run = r;
          worst_key = key;
        }
        if (!quiet) fmt::print(" {:>11.3e}", d);
      }
    }
    if (!quiet) fmt::print("\n");
  }
  fmt::print("largest relative deviation: {:.3e} ({} of {} at step {}); tolerance {:.1e}: {}\n", worst, worst_key,
             run_dirs[worst_run], worst_step, rtol, agree ? "all agree" : "DIFFER");
  return agree ? 0 : 1;
}

}  // namespace trainer
