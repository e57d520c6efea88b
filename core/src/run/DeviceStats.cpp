// What a step measures of the machine (see DeviceStats.h): memory peaks, RSS,
// the matmul rate MFU is relative to, and the step profiler.
#include "run/DeviceStats.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <fmt/format.h>

#include "trainer/Log.h"

#ifdef TRAINER_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace trainer {

namespace {
c10::DeviceIndex index_of(const torch::Device& device) { return device.index() < 0 ? 0 : device.index(); }

#ifdef TRAINER_CUDA_KERNELS
// The caching allocator's per-device state is created lazily, with the
// process's first CUDA tensor; until then its statistics calls throw
// ("Invalid device argument 0: did you call init?"). An empty tensor
// creates it (and allocates nothing), so the statistics can be read before
// the run's first tensor: live_bytes() is the baseline taken before the
// model exists.
c10::DeviceIndex initialised_index(const torch::Device& device) {
  (void)torch::empty({0}, torch::TensorOptions().device(torch::kCUDA, index_of(device)));
  return index_of(device);
}
#endif
}  // namespace

// The CPU allocator, counted: each allocation comes from the allocator it
// replaces and is recorded (pointer -> size and that allocator's deleter)
// until freed. The data pointer stays its own context, as LibTorch's
// raw_allocate expects of a CPU allocator.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)  // allocate() lost its const
  c10::DataPtr allocate(size_t bytes) override { return wrap(inner_->allocate(bytes), bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t bytes) const override { return wrap(inner_->allocate(bytes), bytes); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  static CountingCpuAllocator*& instance() {
    static CountingCpuAllocator* allocator = nullptr;
    return allocator;
  }
  int64_t live() const { return live_.load(); }
  int64_t peak() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = live_.load();
  }

 private:
  struct Held {
    size_t bytes;
    c10::DataPtr inner;
  };

  c10::DataPtr wrap(c10::DataPtr inner, size_t bytes) const {
    void* data = inner.get();
    if (data == nullptr) return inner;
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held_.emplace(data, Held{bytes, std::move(inner)});
      live_ += static_cast<int64_t>(bytes);
      peak_ = std::max(peak_, live_.load());
    }
    return c10::DataPtr(data, data, &release, device);
  }

  static void release(void* data) {
    CountingCpuAllocator* self = instance();
    c10::DataPtr inner;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      const auto it = self->held_.find(data);
      if (it == self->held_.end()) return;  // not ours (cannot happen: only our DataPtrs name this deleter)
      self->live_ -= static_cast<int64_t>(it->second.bytes);
      inner = std::move(it->second.inner);
      self->held_.erase(it);
    }
  }  // `inner` frees the memory through the replaced allocator's deleter

  c10::Allocator* inner_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Held> held_;
  mutable std::atomic<int64_t> live_{0};
  mutable int64_t peak_ = 0;  // under mutex_
};

void count_cpu_allocations() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingCpuAllocator allocator(c10::GetCPUAllocator());
    CountingCpuAllocator::instance() = &allocator;
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
  });
}

int64_t live_bytes(const torch::Device& device) {
#ifdef TRAINER_CUDA_KERNELS
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(initialised_index(device)).allocated_bytes[0].current;
  }
#endif
  (void)device;
  const CountingCpuAllocator* allocator = CountingCpuAllocator::instance();
  return allocator ? allocator->live() : -1;
}

int64_t settled_live_bytes(const torch::Device& device) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(2);
  int64_t last = live_bytes(device);
  int unchanged = 0;
  while (unchanged < 20 && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const int64_t now = live_bytes(device);
    unchanged = now == last ? unchanged + 1 : 0;
    last = now;
  }
  return last;
}

int64_t peak_live_bytes(const torch::Device& device) {
#ifdef TRAINER_CUDA_KERNELS
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(initialised_index(device)).allocated_bytes[0].peak;
  }
#endif
  (void)device;
  const CountingCpuAllocator* allocator = CountingCpuAllocator::instance();
  return allocator ? allocator->peak() : -1;
}

void reset_memory_peaks(const torch::Device& device) {
#ifdef TRAINER_CUDA_KERNELS
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(initialised_index(device));
#endif
  if (!device.is_cuda()) {
    if (CountingCpuAllocator* allocator = CountingCpuAllocator::instance()) allocator->reset_peak();
  }
}

MemoryPeaks memory_peaks(const torch::Device& device) {
  MemoryPeaks peaks;
#ifdef TRAINER_CUDA_KERNELS
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(initialised_index(device));
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

double datasheet_flops_for(const std::string& name, torch::Dtype dtype) {
  // NVIDIA's datasheets, dense (without sparsity): bf16 tensor cores; fp32 without TF32.
  struct Entry {
    const char* name;   // a part of the name CUDA reports; the first match wins
    double bf16, fp32;  // TFLOP/s
  };
  static const Entry kTable[] = {
      {"H200", 989.4, 66.9}, {"H100 PCIe", 756.0, 51.2}, {"H100", 989.4, 66.9}, {"A100", 312.0, 19.5}};
  for (const Entry& e : kTable) {
    if (name.find(e.name) != std::string::npos) return 1e12 * (dtype == torch::kBFloat16 ? e.bf16 : e.fp32);
  }
  return 0.0;
}

double datasheet_flops(const torch::Device& device, torch::Dtype dtype, std::string* name) {
  name->clear();
#ifdef TRAINER_CUDA_KERNELS
  if (device.is_cuda()) *name = at::cuda::getDeviceProperties(index_of(device))->name;
#endif
  return device.is_cuda() ? datasheet_flops_for(*name, dtype) : 0.0;
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

struct StepClock::Mark {
  std::chrono::steady_clock::time_point host;
#ifdef TRAINER_CUDA_KERNELS
  std::unique_ptr<at::cuda::CUDAEvent> event;  // with timing; null on the CPU
#endif
};

struct StepClock::Side {
#ifdef TRAINER_CUDA_KERNELS
  std::optional<c10::cuda::CUDAStream> stream;
#endif
};

StepClock::StepClock(const torch::Device& device) : device_(device), side_(std::make_unique<Side>()), origin_(mark()) {}
StepClock::~StepClock() = default;

std::shared_ptr<const StepClock::Mark> StepClock::mark_after(const std::function<void()>& join) const {
#ifdef TRAINER_CUDA_KERNELS
  if (device_.is_cuda()) {
    if (!side_->stream) side_->stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index_of(device_));
    at::cuda::CUDAEvent here;
    here.record(at::cuda::getCurrentCUDAStream(index_of(device_)));
    here.block(*side_->stream);
    const c10::cuda::CUDAStreamGuard on_side(*side_->stream);
    join();
    return mark();
  }
#endif
  join();
  return mark();
}

double StepClock::step_seconds(const Mark* before_begin, const Mark* before_end, const Mark& begin, const Mark& end) {
  if (before_begin == nullptr || before_end == nullptr) return seconds_between(begin, end);
  // From the step before's begin, which precedes all three: no negative spans.
  const double before_ends = seconds_between(*before_begin, *before_end);
  const double begins = seconds_between(*before_begin, begin);
  return seconds_between(*before_begin, end) - std::max(before_ends, begins);
}

std::shared_ptr<const StepClock::Mark> StepClock::mark() const {
  auto mark = std::make_shared<Mark>();
#ifdef TRAINER_CUDA_KERNELS
  if (device_.is_cuda()) {
    mark->event = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
    mark->event->record(at::cuda::getCurrentCUDAStream(index_of(device_)));
    return mark;
  }
#endif
  mark->host = std::chrono::steady_clock::now();
  return mark;
}

double StepClock::seconds_between(const Mark& from, const Mark& to) {
#ifdef TRAINER_CUDA_KERNELS
  if (to.event) {
    to.event->synchronize();
    return static_cast<double>(from.event->elapsed_time(*to.event)) / 1e3;
  }
#endif
  return std::chrono::duration<double>(to.host - from.host).count();
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
