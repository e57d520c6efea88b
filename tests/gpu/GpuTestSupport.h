// What the GPU tests share: the device they run on, and the guard that skips
// a test where the build has CUDA but the machine shows no device.
#pragma once

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

namespace trainer::testing {

inline const torch::Device kCuda(torch::kCUDA, 0);

}  // namespace trainer::testing

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"
