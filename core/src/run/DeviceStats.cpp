// What a step measures of the machine (see DeviceStats.h): memory peaks, RSS,
// the matmul rate MFU is relative to, and the step profiler.
#include "run/DeviceStats.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include <unistd.h>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <fmt/format.h>

#include "trainer/Log.h"

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

std::string profiler_unavailable() {
  namespace prof = torch::profiler::impl;
  const std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  const std::filesystem::path probe =
      std::filesystem::temp_directory_path() / fmt::format("trainer-profile-probe-{}.json", getpid());
  try {  // whether a trace can be saved is known only to the LibTorch build, at run time
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    torch::autograd::profiler::disableProfiler()->save(probe.string());
  } catch (const c10::Error& error) {
    std::error_code ignored;
    std::filesystem::remove(probe, ignored);
    return fmt::format("a LibTorch that can write profiler traces; this one cannot ({})", error.msg());
  }
  std::error_code ignored;
  std::filesystem::remove(probe, ignored);
  return {};
}

StepProfiler::StepProfiler(int64_t first, int64_t count, std::string path, const torch::Device& device)
    : first_(first), last_(first + count - 1), path_(std::move(path)), device_(device) {}

StepProfiler::~StepProfiler() {
  if (recording_) torch::autograd::profiler::disableProfiler();  // a step threw: nothing to write
}

void StepProfiler::step_begins(int64_t step) {
  if (first_ <= 0 || step != first_) return;
  namespace prof = torch::profiler::impl;
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (device_.is_cuda()) activities.insert(prof::ActivityType::CUDA);
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
  torch::autograd::profiler::prepareProfiler(config, activities);
  if (device_.is_cuda()) torch::cuda::synchronize(index_of(device_));
  torch::autograd::profiler::enableProfiler(config, activities);
  recording_ = true;
}

void StepProfiler::step_ended(int64_t step) {
  if (!recording_ || step != last_) return;
  if (device_.is_cuda()) torch::cuda::synchronize(index_of(device_));
  const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  recording_ = false;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  result->save(path_);
  log::info(fmt::format("profile of steps {}..{} written to {}", first_, last_, path_));
}

}  // namespace trainer
