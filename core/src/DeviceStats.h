// What a step measures of the machine: device memory peaks, the process's
// resident set, and the matmul rate MFU is relative to.
#pragma once

#include <cstdint>

#include <torch/types.h>

namespace trainer {

struct MemoryPeaks {
  int64_t allocated_bytes = -1;  ///< CUDA caching allocator; -1 on the CPU
  int64_t reserved_bytes = -1;
  int64_t rss_bytes = -1;        ///< the process's resident set on the CPU; -1 on CUDA
};

/// Starts a new peak window on `device` (CUDA); nothing on the CPU.
void reset_memory_peaks(const torch::Device& device);

/// The peaks since the last reset on CUDA; the current resident set on the CPU.
MemoryPeaks memory_peaks(const torch::Device& device);

/// Dense matmul rate in FLOP/s on `device` in `dtype`: the median of timed
/// 8192^3 products; 0 on the CPU (not measured: give run.peak_tflops).
double measure_matmul_flops(const torch::Device& device, torch::Dtype dtype);

}  // namespace trainer
