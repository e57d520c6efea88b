#include "DeviceStats.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <vector>

#include <unistd.h>

#include <torch/cuda.h>

#ifdef TRAINER_CUDA_KERNELS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace trainer {

namespace {
c10::DeviceIndex index_of(const torch::Device& device) { return device.index() < 0 ? 0 : device.index(); }
}  // namespace

void reset_memory_peaks(const torch::Device& device) {
#ifdef TRAINER_CUDA_KERNELS
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(index_of(device));
#else
  (void)device;
#endif
}

MemoryPeaks memory_peaks(const torch::Device& device) {
  MemoryPeaks peaks;
#ifdef TRAINER_CUDA_KERNELS
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index_of(device));
    peaks.allocated_bytes = stats.allocated_bytes[0].peak;  // [0]: the aggregate over pools
    peaks.reserved_bytes = stats.reserved_bytes[0].peak;
    return peaks;
  }
#endif
  (void)device;
  // /proc/self/statm: size and resident, in pages.
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (statm >> size >> resident) peaks.rss_bytes = resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  return peaks;
}

double measure_matmul_flops(const torch::Device& device, torch::Dtype dtype) {
  if (!device.is_cuda()) return 0.0;
  torch::NoGradGuard no_grad;
  constexpr int64_t n = 8192;
  const auto options = torch::TensorOptions().device(device).dtype(dtype);
  const torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  torch::Tensor c = torch::empty({n, n}, options);
  std::vector<double> seconds;
  for (int i = 0; i < 13; ++i) {
    torch::cuda::synchronize(index_of(device));
    const auto start = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    torch::cuda::synchronize(index_of(device));
    if (i >= 3) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return 2.0 * n * n * n / seconds[seconds.size() / 2];
}

}  // namespace trainer
