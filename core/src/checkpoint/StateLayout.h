// The flat layout as checkpoints and the final weights see it: which
// ranges each rank holds, which it writes (every element once, by one of
// its holders), and the check that a strategy's slices cover every element.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/Manifest.h"
#include "trainer/Comm.h"
#include "trainer/Model.h"
#include "trainer/Strategy.h"

namespace trainer {

/// Elements of each flat group of `model` (decay, then no decay; empty ones
/// left out), as flatten_parameters lays them out.
std::vector<int64_t> group_sizes(Model& model);

/// Collective (`device`: where the comm moves tensors). From the ranges
/// each rank holds, the ranges every rank writes: manifest::writers, the
/// problems (elements no rank holds, ranges outside a group) in `problems`.
std::vector<std::vector<manifest::Range>> assign_writers(const std::vector<manifest::Range>& held, Comm& comm,
                                                         torch::Device device, const std::vector<int64_t>& group_numel,
                                                         std::vector<manifest::Range>* problems);

/// The ranges of the flat groups the slices cover.
std::vector<manifest::Range> held_ranges(const std::vector<FlatSlice>& slices);
std::vector<manifest::Range> held_ranges(const std::vector<StateSlice>& slices);

/// out (laid out as `range`) = the elements of `range` the slices hold;
/// the others are left as they are.
void fill_range(const std::vector<FlatSlice>& slices, const manifest::Range& range, torch::Tensor out);

/// Collective; right after Strategy::setup. Checkpoints and the final
/// weights are assembled from the slices (assign_writers), so together the
/// ranks' state_slices() and parameter_slices() must cover every element of
/// every flat group, within its bounds, 1-D, with moments as long as the
/// values. Throws InputError on every rank, naming the strategy, the rank or
/// the elements, when they do not (a strategy bug that would otherwise show
/// up hours later as a failed checkpoint, or as zeros in exported weights).
void check_state_coverage(Strategy& strategy, Model& model, Comm& comm, torch::Device device,
                          const std::string& strategy_name);

/// Elements of `group` in `ranges`.
int64_t group_length(const std::vector<manifest::Range>& ranges, size_t group);

// The pieces of `slice` values inside `range`: [begin, end) in group offsets.
template <class Slice>
inline bool overlap(const Slice& slice, int64_t numel, const manifest::Range& range, int64_t* begin, int64_t* end) {
  if (slice.group != range.group) return false;
  *begin = std::max(range.begin, slice.offset);
  *end = std::min(range.end, slice.offset + numel);
  return *end > *begin;
}

}  // namespace trainer
