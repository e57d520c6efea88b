// What a step measures of the machine: device memory peaks, the process's
// resident set, and the matmul rate MFU is relative to.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <torch/types.h>

namespace trainer {

struct MemoryPeaks {
  int64_t allocated_bytes = -1;  ///< CUDA caching allocator; -1 on the CPU
  int64_t reserved_bytes = -1;
  int64_t rss_bytes = -1;  ///< the process's resident set on the CPU; -1 on CUDA
};

/// Makes every LibTorch CPU allocation of this process counted (from now
/// on; earlier tensors are not), so that live_bytes() can measure CPU
/// memory as the CUDA caching allocator measures device memory. Idempotent.
void count_cpu_allocations();

/// Bytes of tensor memory allocated and not yet freed on `device`: the CUDA
/// caching allocator's current allocated bytes, or on the CPU the counted
/// allocations (count_cpu_allocations(); -1 when not counting).
int64_t live_bytes(const torch::Device& device);

/// live_bytes() once it has stopped falling: threads that finish a step's
/// work (autograd's, a communication backend's) drop their last references
/// a little after the step returns, later on a loaded machine. Read every
/// 5 ms until unchanged for 100 ms, for at most 2 s.
int64_t settled_live_bytes(const torch::Device& device);

/// The most tensor bytes live at once on `device` since the last
/// reset_memory_peaks: the CUDA caching allocator's allocated peak, or the
/// counted CPU allocations' (-1 when not counting).
int64_t peak_live_bytes(const torch::Device& device);

/// Starts a new peak window on `device` (CUDA, and the counted CPU allocations).
void reset_memory_peaks(const torch::Device& device);

/// The peaks since the last reset on CUDA; the current resident set on the CPU.
MemoryPeaks memory_peaks(const torch::Device& device);

/// Where each step's time is read: the device's own timeline. On CUDA a
/// mark is an event recorded on the current stream, reached when the work
/// launched before it has run, so the host may launch the next step while
/// the device still runs this one and a step still lasts from the moment
/// the device could start its work to the end of its last kernel: idle time
/// inside a step counts, the host's time between steps (logging,
/// checkpoints) does not. On the CPU, where every operation has finished
/// when it returns, a mark is the host clock.
class StepClock {
 public:
  struct Mark;                                      ///< one instant (DeviceStats.cpp)
  explicit StepClock(const torch::Device& device);  ///< marks the run's start
  ~StepClock();
  StepClock(const StepClock&) = delete;
  StepClock& operator=(const StepClock&) = delete;
  /// Now on the device's timeline: after all the work launched so far.
  std::shared_ptr<const Mark> mark() const;
  /// The same, and after whatever `join` makes the current stream wait for
  /// (Strategy::wait_for_update): on CUDA, `join` runs with a stream of the
  /// clock's own current, which first waits for the current one, so the
  /// current stream itself waits for nothing more.
  std::shared_ptr<const Mark> mark_after(const std::function<void()>& join) const;
  const Mark& origin() const { return *origin_; }
  /// Seconds from `from` to `to` (marked after it); waits until the device
  /// has reached `to`.
  static double seconds_between(const Mark& from, const Mark& to);
  /// A step's seconds: from its begin, or from the end of the step before
  /// where that came later (an update still running behind this step's first
  /// kernels), to its end. `before_begin`/`before_end`: the step before's
  /// marks, or null for the first step timed.
  static double step_seconds(const Mark* before_begin, const Mark* before_end, const Mark& begin, const Mark& end);

 private:
  struct Side;  // the stream mark_after records on (DeviceStats.cpp)
  torch::Device device_;
  std::unique_ptr<Side> side_;
  std::shared_ptr<const Mark> origin_;
};

/// Dense matmul rate in FLOP/s on `device` in `dtype`: the median of timed
/// 8192^3 products; 0 on the CPU (not measured: give run.peak_tflops).
double measure_matmul_flops(const torch::Device& device, torch::Dtype dtype);

/// The datasheet's dense peak FLOP/s (no sparsity) of `device` for `dtype`
/// (bf16 on tensor cores; fp32 without TF32) for the devices this table
/// knows by the name CUDA reports (H200, H100 SXM and PCIe, A100), the name
/// in `name`; 0 for others and on the CPU.
double datasheet_flops(const torch::Device& device, torch::Dtype dtype, std::string* name);
/// The table behind it: the peak for a device named `name`, 0 when unknown.
double datasheet_flops_for(const std::string& name, torch::Dtype dtype);

/// Empty when this LibTorch can record and write a profiler trace (it was
/// built with Kineto); otherwise what is missing, for an error message.
std::string profiler_unavailable();

/// Records the steps [first, first + count) (1-based) with the PyTorch
/// profiler (Kineto: host operators and, on CUDA, every kernel and copy) and
/// writes them as one Chrome trace (chrome://tracing, Perfetto) at `path`.
/// first = 0: off. The device is synchronized at both ends of the window so
/// the trace holds exactly the work of those steps.
class StepProfiler {
 public:
  StepProfiler(int64_t first, int64_t count, std::string path, const torch::Device& device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;
  void step_begins(int64_t step);
  void step_ended(int64_t step);

 private:
  int64_t first_, last_;
  std::string path_;
  torch::Device device_;
  bool recording_ = false;
};

}  // namespace trainer
