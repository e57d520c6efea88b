// memory.json, summary.json and the consolidated final weights.
#include "run/RunOutputs.h"

#include <algorithm>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "checkpoint/Checkpoint.h"
#include "checkpoint/Manifest.h"
#include "trainer/Errors.h"
#include "trainer/util/JsonSupport.h"
#include "trainer/util/Safetensors.h"
#include "util/Files.h"

namespace trainer {

namespace fs = std::filesystem;

// Every rank's MemoryReport, gathered to rank 0 and written as memory.json.
void write_memory_report(Strategy& strategy, Comm& comm, torch::Device device, const fs::path& file, bool writer,
                         const MeasuredMemory& measured) {
  const MemoryReport mine = strategy.memory();
  torch::Tensor local =
      torch::tensor({mine.parameter_bytes, mine.gradient_bytes, mine.optimizer_bytes,
                     mine.peak_gathered_parameter_bytes, mine.peak_transient_gradient_bytes, mine.peak_transient_bytes,
                     measured.after_setup_bytes, measured.after_first_step_bytes, measured.first_step_peak_bytes},
                    torch::kInt64)
          .to(device);
  constexpr int kFields = 9;
  torch::Tensor all = torch::zeros({kFields * comm.world_size()}, local.options());
  comm.all_gather(local, all);
  if (!writer) return;
  all = all.cpu();
  Json ranks = Json::array();
  for (int r = 0; r < comm.world_size(); ++r) {
    const auto v = [&](int k) { return all[kFields * r + k].item<int64_t>(); };
    ranks.push_back(Json{{"rank", r},
                         {"parameter_bytes", v(0)},
                         {"gradient_bytes", v(1)},
                         {"optimizer_bytes", v(2)},
                         {"peak_gathered_parameter_bytes", v(3)},
                         {"peak_transient_gradient_bytes", v(4)},
                         {"peak_transient_bytes", v(5)},
                         {"measured_after_setup_bytes", v(6)},
                         {"measured_after_first_step_bytes", v(7)},
                         {"measured_first_step_peak_bytes", v(8)}});
  }
  write_file_atomically(file, ranks.dump(1) + "\n");
}

// summary.json: FNV-1a over the bytes of the parameters each rank updates
// (equal at the same world size and strategy layout exactly when the
// weights are), and XXH3-128 of the consolidated weights, which two runs
// share exactly when they ended with the same weights, whatever their world
// size or strategy.
void write_summary(Strategy& strategy, Comm& comm, torch::Device device, const fs::path& file, bool writer,
                   int64_t steps, int64_t applied_updates, const std::vector<torch::Tensor>& consolidated) {
  uint64_t hash = kFnv1aOffset;
  for (const FlatSlice& slice : strategy.parameter_slices()) {
    const torch::Tensor host = slice.values.to(torch::kCPU).contiguous();
    hash = fnv1a(host.data_ptr(), static_cast<size_t>(host.numel() * host.element_size()), hash);
  }
  torch::Tensor local = torch::tensor({static_cast<int64_t>(hash)}, torch::kInt64).to(device);
  torch::Tensor all = torch::zeros({comm.world_size()}, local.options());
  comm.all_gather(local, all);
  if (!writer) return;
  all = all.cpu();
  Json hashes = Json::array();
  for (int r = 0; r < comm.world_size(); ++r)
    hashes.push_back(fmt::format("{:016x}", static_cast<uint64_t>(all[r].item<int64_t>())));
  const Json summary{{"steps", steps},
                     {"applied_updates", applied_updates},
                     {"world_size", comm.world_size()},
                     {"parameter_fnv1a_per_rank", hashes},
                     {"parameters_xxh3_128", tensors_xxh3(consolidated)}};
  write_file_atomically(file, summary.dump() + "\n");
}

std::string tensors_xxh3(const std::vector<torch::Tensor>& tensors) {
  std::vector<std::string_view> pieces;
  for (const torch::Tensor& t : tensors) pieces.emplace_back(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return pieces_xxh3(pieces);
}

// The parameters, consolidated: every rank contributes the ranges of the
// flat layout it writes (assign_writers over its parameter slices: each
// element from one of the ranks that hold it), and one all-reduce per piece
// assembles them.
std::vector<torch::Tensor> consolidated_parameters(Model& model, Strategy& strategy, Comm& comm, torch::Device device,
                                                   bool writer) {
  const std::vector<int64_t> group_numel = group_sizes(model);
  const std::vector<FlatSlice> slices = strategy.parameter_slices();
  std::vector<manifest::Range> problems;
  const std::vector<manifest::Range> mine =
      assign_writers(held_ranges(slices), comm, device, group_numel, &problems).at(static_cast<size_t>(comm.rank()));
  // Assembled on the host one device chunk at a time: a device copy of all
  // parameters at once would set the run's peak device memory at its end.
  constexpr int64_t kChunk = int64_t(64) << 20;  // elements: 256 MiB of fp32
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> full;
  for (size_t g = 0; g < group_numel.size(); ++g) {
    const int64_t n = group_numel[g];
    full.push_back(writer ? torch::empty({n}) : torch::Tensor());
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t end_of_chunk = std::min(n, start + kChunk);
      torch::Tensor part = torch::zeros({end_of_chunk - start}, torch::TensorOptions().device(device));
      for (const manifest::Range& range : mine) {
        const manifest::Range in_part{range.group, std::max(range.begin, start), std::min(range.end, end_of_chunk)};
        if (range.group != g || in_part.size() <= 0) continue;
        fill_range(slices, in_part, part.narrow(0, in_part.begin - start, in_part.size()));
      }
      if (comm.world_size() > 1) comm.all_reduce_sum(part);
      if (writer) full[g].narrow(0, start, end_of_chunk - start).copy_(part);
    }
  }
  return full;
}

// Rank 0 writes model.safetensors (fp32, Hugging Face names) and the model's
// config.json.
void write_final_weights(Model& model, const std::vector<torch::Tensor>& full, const fs::path& dir, bool writer) {
  if (!writer) return;
  const std::vector<NamedParameter> params = model.parameters();
  // Decay, then no decay; with one group, every parameter is in it.
  const int group_of_kind[2] = {0, full.size() > 1 ? 1 : 0};
  std::vector<std::pair<std::string, torch::Tensor>> named;
  int64_t offset[2] = {0, 0};
  for (const NamedParameter& p : params) {
    const int kind = p.decay ? 0 : 1;
    named.emplace_back(p.name,
                       full[group_of_kind[kind]].narrow(0, offset[kind], p.tensor.numel()).view(p.tensor.sizes()));
    offset[kind] += p.tensor.numel();
  }
  write_safetensors((dir / "model.safetensors").string(), named);
  const std::string config = model.hf_config();
  if (!config.empty()) write_file_atomically(dir / "config.json", config);
}

}  // namespace trainer
