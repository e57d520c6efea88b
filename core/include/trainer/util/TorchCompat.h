// The LibTorch calls whose spelling differs between 1.13 (Debian, CPU) and
// 2.x (the GPU build) that plugins need; the ops (trainer/ops/) keep their
// own version differences beside their kernels.
#pragma once

#include <cstdint>

#include <torch/types.h>
#include <torch/version.h>

namespace trainer::compat {

/// A CPU generator seeded with `seed`: parameter init happens on the CPU so
/// that it is the same whatever the run's device.
at::Generator cpu_generator(uint64_t seed);

}  // namespace trainer::compat
