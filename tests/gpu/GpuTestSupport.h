// What the GPU tests share: the device they run on, and the guard that fails
// a test where the build has CUDA but the machine shows no device (these
// tests are built only with CUDA: a missing device is a broken machine or
// CUDA_VISIBLE_DEVICES, not a reason to pass).
#pragma once

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

namespace trainer::testing {

inline const torch::Device kCuda(torch::kCUDA, 0);

}  // namespace trainer::testing

#define REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) FAIL() << "a CUDA build, but this machine shows no CUDA device"
