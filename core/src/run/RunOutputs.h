// What a run writes when it ends besides metrics: memory.json, summary.json
// and its consolidated weights (model.safetensors, config.json). All three
// are collectives: every rank calls them, rank 0 (`writer`) writes.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "trainer/Comm.h"
#include "trainer/Model.h"
#include "trainer/Strategy.h"

namespace trainer {

/// What the run measured of its tensor memory on its device (live_bytes
/// above the level before the model was made), as opposed to what the
/// strategy reports: after the strategy's setup, after the first step
/// (activations and transients freed again), and the most live at any
/// moment of the first step (activations and transients included).
/// -1: not measured.
struct MeasuredMemory {
  int64_t after_setup_bytes = -1;
  int64_t after_first_step_bytes = -1;
  int64_t first_step_peak_bytes = -1;
};

/// Every rank's MemoryReport and MeasuredMemory, gathered to rank 0 and
/// written as memory.json (collective).
void write_memory_report(Strategy& strategy, Comm& comm, torch::Device device, const std::filesystem::path& file,
                         bool writer, const MeasuredMemory& measured);
/// XXH3-128 (hex) of the tensors' bytes one after the other (contiguous, on
/// the host): summary.json's weights hash, the kit's gradient hash.
std::string tensors_xxh3(const std::vector<torch::Tensor>& tensors);
/// `consolidated`: consolidated_parameters() (on the writer).
void write_summary(Strategy& strategy, Comm& comm, torch::Device device, const std::filesystem::path& file, bool writer,
                   int64_t steps, int64_t applied_updates, const std::vector<torch::Tensor>& consolidated);
/// Collective: the fp32 flat parameter groups (flatten_parameters' layout)
/// assembled from the ranks' parameter slices (each element from one of
/// the ranks that hold it, assign_writers), on the host of the writer
/// (undefined tensors elsewhere).
std::vector<torch::Tensor> consolidated_parameters(Model& model, Strategy& strategy, Comm& comm, torch::Device device,
                                                   bool writer);
void write_final_weights(Model& model, const std::vector<torch::Tensor>& consolidated, const std::filesystem::path& dir,
                         bool writer);

}  // namespace trainer
