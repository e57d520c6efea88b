// Which ranges of the flat layout each rank holds and writes, and the check
// that the strategy's slices cover the layout (see StateLayout.h).
#include "checkpoint/StateLayout.h"

#include <fmt/format.h>

#include "trainer/Errors.h"

namespace trainer {

using manifest::Range;

namespace {

// The ranges every rank holds, gathered: one all-gather of their counts,
// one of the ranges (padded to the most any rank has).
std::vector<std::vector<Range>> gather_ranges(const std::vector<Range>& mine, Comm& comm, torch::Device device) {
  const int world = comm.world_size();
  if (world == 1) return {mine};
  const auto options = torch::TensorOptions().dtype(torch::kInt64).device(device);
  torch::Tensor counts = torch::zeros({world}, options);
  comm.all_gather(torch::full({1}, static_cast<int64_t>(mine.size()), options), counts);
  const int64_t most = counts.max().item<int64_t>();
  std::vector<int64_t> flat(static_cast<size_t>(3 * most), 0);
  for (size_t i = 0; i < mine.size(); ++i) {
    flat[3 * i] = static_cast<int64_t>(mine[i].group);
    flat[3 * i + 1] = mine[i].begin;
    flat[3 * i + 2] = mine[i].end;
  }
  torch::Tensor all = torch::zeros({3 * most * world}, options);
  comm.all_gather(torch::tensor(flat, torch::kInt64).to(device), all);
  all = all.cpu();
  counts = counts.cpu();
  std::vector<std::vector<Range>> out(world);
  for (int r = 0; r < world; ++r) {
    for (int64_t i = 0; i < counts[r].item<int64_t>(); ++i) {
      const int64_t at = 3 * (r * most + i);
      out[r].push_back(Range{static_cast<size_t>(all[at].item<int64_t>()), all[at + 1].item<int64_t>(),
                             all[at + 2].item<int64_t>()});
    }
  }
  return out;
}

}  // namespace

// Elements of `group` in `ranges`.
int64_t group_length(const std::vector<Range>& ranges, size_t group) {
  int64_t length = 0;
  for (const Range& range : ranges) length += range.group == group ? range.size() : 0;
  return length;
}

std::vector<int64_t> group_sizes(Model& model) {
  int64_t numel[2] = {0, 0};
  for (const NamedParameter& p : model.parameters()) numel[p.decay ? 0 : 1] += p.tensor.numel();
  std::vector<int64_t> sizes;
  for (const int64_t n : numel) {
    if (n > 0) sizes.push_back(n);
  }
  return sizes;
}

std::vector<std::vector<Range>> assign_writers(const std::vector<Range>& held, Comm& comm, torch::Device device,
                                               const std::vector<int64_t>& group_numel, std::vector<Range>* problems) {
  return manifest::writers(gather_ranges(held, comm, device), group_numel, problems);
}

std::vector<Range> held_ranges(const std::vector<FlatSlice>& slices) {
  std::vector<Range> out;
  for (const FlatSlice& s : slices) out.push_back(Range{s.group, s.offset, s.offset + s.values.numel()});
  return out;
}

std::vector<Range> held_ranges(const std::vector<StateSlice>& slices) {
  std::vector<Range> out;
  for (const StateSlice& s : slices) out.push_back(Range{s.group, s.offset, s.offset + s.values.numel()});
  return out;
}

void fill_range(const std::vector<FlatSlice>& slices, const Range& range, torch::Tensor out) {
  for (const FlatSlice& s : slices) {
    int64_t begin = 0, end = 0;
    if (!overlap(s, s.values.numel(), range, &begin, &end)) continue;
    out.narrow(0, begin - range.begin, end - begin).copy_(s.values.narrow(0, begin - s.offset, end - begin));
  }
}

void check_state_coverage(Strategy& strategy, Model& model, Comm& comm, torch::Device device,
                          const std::string& strategy_name) {
  const int world = comm.world_size();
  const std::vector<int64_t> sizes = group_sizes(model);
  const std::vector<StateSlice> states = strategy.state_slices();
  const std::vector<FlatSlice> parameters = strategy.parameter_slices();
  // This rank's slices: a group the model lacks, a piece not 1-D, or moments
  // of another length than the values.
  bool bad = false;
  for (const StateSlice& s : states) {
    bad = bad || s.group >= sizes.size() || s.values.dim() != 1;
    for (const torch::Tensor& t : s.state) bad = bad || t.numel() != s.values.numel();
  }
  for (const FlatSlice& s : parameters) bad = bad || s.group >= sizes.size() || s.values.dim() != 1;
  torch::Tensor flags = torch::zeros({world}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  const torch::Tensor mine = torch::full({1}, int64_t{bad ? 1 : 0}, flags.options());
  if (world > 1) {
    comm.all_gather(mine, flags);
  } else {
    flags.copy_(mine);
  }
  flags = flags.cpu();
  for (int r = 0; r < world; ++r) {
    if (flags[r].item<int64_t>() != 0) {
      throw InputError(
          fmt::format("strategy '{}': rank {}'s state or parameter slices name a group beyond the model's {}, are "
                      "not 1-D, or have values and state of unequal lengths (trainer/Strategy.h, state_slices)",
                      strategy_name, r, sizes.size()));
    }
  }
  for (const bool state : {true, false}) {
    std::vector<Range> problems;
    assign_writers(state ? held_ranges(states) : held_ranges(parameters), comm, device, sizes, &problems);
    if (problems.empty()) continue;
    const Range& p = problems.front();
    const char* what = state ? "state_slices" : "parameter_slices";
    if (p.begin < 0 || p.end > sizes[p.group]) {
      throw InputError(fmt::format("strategy '{}': a rank's {} hold elements [{}, {}) of group {}, outside its {}",
                                   strategy_name, what, p.begin, p.end, p.group, sizes[p.group]));
    }
    throw InputError(
        fmt::format("strategy '{}': no rank's {} hold elements [{}, {}) of group {}; together the ranks' slices "
                    "must cover every element of every group (trainer/Strategy.h), which checkpoints and the final "
                    "weights are assembled from",
                    strategy_name, what, p.begin, p.end, p.group));
  }
}

}  // namespace trainer
