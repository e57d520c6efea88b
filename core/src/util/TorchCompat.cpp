// LibTorch 1.13 / 2.x differences behind one interface.
#include "trainer/util/TorchCompat.h"

#include <ATen/CPUGeneratorImpl.h>

namespace trainer::compat {

at::Generator cpu_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

}  // namespace trainer::compat
