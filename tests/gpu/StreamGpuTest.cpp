// Every project kernel runs on the stream its caller made current, never on
// another: each op's inputs are written on a non-default stream behind a
// gate that holds the stream, so a kernel launched anywhere else would run
// at once and read the inputs before they exist (zeros), and its results
// would differ from the same op run plainly.
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include "gpu/GpuTestSupport.h"
#include "run/DeviceStats.h"
#include "trainer/ops/LinearCrossEntropy.h"
#include "trainer/ops/Rotary.h"
#include "trainer/ops/SwiGlu.h"
#include "trainer/sharding/AdamW.h"

namespace trainer {
namespace {

using testing::kCuda;

std::atomic<bool> g_open{false};
void CUDART_CB hold_stream(void*) {
  while (!g_open.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

// `op(inputs)` returns tensors to compare. Runs it plainly, then again on a
// pool stream whose work waits behind a gate, with `inputs` first zeroed and
// then filled on that stream behind the gate. The gate opens once `op` has
// queued everything (or after 10 s, so an op that waited on the host cannot
// hang the test); both runs must give the same bits.
void expect_on_the_current_stream(const char* name, const std::vector<torch::Tensor>& values,
                                  const std::function<std::vector<torch::Tensor>(std::vector<torch::Tensor>&)>& op) {
  std::vector<torch::Tensor> plain_inputs;
  for (const torch::Tensor& v : values) plain_inputs.push_back(v.clone());
  std::vector<torch::Tensor> expected;
  for (const torch::Tensor& t : op(plain_inputs)) expected.push_back(t.detach().clone());
  torch::cuda::synchronize();

  std::vector<torch::Tensor> inputs;
  for (const torch::Tensor& v : values) inputs.push_back(torch::zeros_like(v));
  torch::cuda::synchronize();
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, kCuda.index());
  std::vector<torch::Tensor> got;
  g_open.store(false);
  std::thread safety([] {
    for (int i = 0; i < 1000 && !g_open.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    g_open.store(true);
  });
  {
    const c10::cuda::CUDAStreamGuard on(stream);
    ASSERT_EQ(cudaLaunchHostFunc(stream.stream(), hold_stream, nullptr), cudaSuccess);
    for (size_t i = 0; i < inputs.size(); ++i) inputs[i].copy_(values[i]);
    for (const torch::Tensor& t : op(inputs)) got.push_back(t.detach());
  }
  g_open.store(true);
  safety.join();
  torch::cuda::synchronize();
  ASSERT_EQ(got.size(), expected.size()) << name;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i], expected[i])) << name << ": result " << i << " differs (a kernel ran on another "
                                                   << "stream than the caller's)";
  }
}

// Inputs that require gradients, and their gradients after backward(outputs, grads).
std::vector<torch::Tensor> with_gradients(const std::vector<torch::Tensor>& outputs, const torch::Tensor& input,
                                          const torch::Tensor& grad_output_seed) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& out : outputs) grads.push_back(grad_output_seed.narrow(0, 0, out.numel()).view_as(out));
  torch::autograd::backward(outputs, grads);
  std::vector<torch::Tensor> all = outputs;
  all.push_back(input.grad());
  return all;
}

TEST(StreamsGpu, EveryKernelRunsOnTheCallersStream) {
  REQUIRE_CUDA();
  torch::manual_seed(9);
  const auto f32 = torch::TensorOptions().device(kCuda).dtype(torch::kFloat32);
  const torch::Tensor seed = torch::randn({1 << 20}, f32);

  // swiglu_forward and swiglu_backward.
  expect_on_the_current_stream("swiglu", {torch::randn({64, 2 * 96}, f32), seed}, [](std::vector<torch::Tensor>& in) {
    const torch::Tensor x = in[0].detach().requires_grad_();
    return with_gradients({ops::swiglu(x)}, x, in[1]);
  });
  // qkv_rotary_forward and qkv_rotary_backward.
  expect_on_the_current_stream("split_qkv_rotary", {torch::randn({2, 17, (4 + 2 * 2) * 32}, f32), seed},
                               [](std::vector<torch::Tensor>& in) {
                                 const torch::Tensor x = in[0].detach().requires_grad_();
                                 const auto tables = ops::RotaryTables::make(17, 32, 1e4, torch::kFloat32, kCuda);
                                 const ops::QkvHeads h = ops::split_qkv_rotary(x, 4, 2, tables);
                                 return with_gradients({h.q, h.k, h.v}, x, in[1]);
                               });
  // cross_entropy_rows (every row a target: no host sync to select rows).
  const torch::Tensor labels = torch::randint(0, 500, {40}, torch::TensorOptions().device(kCuda).dtype(torch::kInt64));
  expect_on_the_current_stream("linear_cross_entropy_sum", {torch::randn({40, 32}, f32), torch::randn({500, 32}, f32)},
                               [&](std::vector<torch::Tensor>& in) {
                                 const torch::Tensor h = in[0].detach().requires_grad_();
                                 const torch::Tensor loss = ops::linear_cross_entropy_sum(h, in[1], labels, 16, 40);
                                 loss.backward();
                                 return std::vector<torch::Tensor>{loss, h.grad()};
                               });
  // adamw_step, with the compute copy.
  expect_on_the_current_stream(
      "adamw_step", {torch::randn({4099}, f32), torch::randn({4099}, f32)}, [](std::vector<torch::Tensor>& in) {
        torch::Tensor params = in[0];
        AdamWState state = adamw_init(params);
        const torch::Tensor compute = torch::empty({4099}, params.options().dtype(torch::kBFloat16));
        adamw_update(params, in[1], state, AdamWConfig{}, true, 1e-2, 1, 1.0, compute);
        return std::vector<torch::Tensor>{params, state.exp_avg, state.exp_avg_sq, compute};
      });
}

// The training loop's step clock: a mark is recorded on the caller's stream
// and never waits for the device (the host launches the next step while
// this one's kernels run), and the time between two marks is the device's:
// a kernel that spins for 2e9 cycles (about a second at the H200's 1.98 GHz)
// shows as at least a quarter of a second.
TEST(StreamsGpu, StepClockMarksDoNotWaitAndMeasureTheDevicesTimeline) {
  REQUIRE_CUDA();
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, kCuda.index());
  const c10::cuda::CUDAStreamGuard on(stream);
  const StepClock clock(kCuda);
  at::cuda::sleep(2000000000LL);
  const std::shared_ptr<const StepClock::Mark> after = clock.mark();
  EXPECT_FALSE(stream.query()) << "mark() waited for the work queued before it";
  const double seconds = StepClock::seconds_between(clock.origin(), *after);
  EXPECT_TRUE(stream.query()) << "seconds_between() returned before its end mark was reached";
  EXPECT_GE(seconds, 0.25);
  EXPECT_LT(seconds, 30.0);
}

}  // namespace
}  // namespace trainer
