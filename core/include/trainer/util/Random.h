// splitmix64: a small, fully specified random generator, so that sampling and
// synthetic data are the same on every platform, compiler and library version.
#pragma once

#include <cstdint>

namespace trainer {

/// Advances `state` and returns the next 64 random bits.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// An unbiased integer in [0, bound), bound > 0 (Lemire's multiply-and-reject).
inline uint64_t uniform_below(uint64_t& state, uint64_t bound) {
  unsigned __int128 product = static_cast<unsigned __int128>(splitmix64(state)) * bound;
  uint64_t low = static_cast<uint64_t>(product);
  if (low < bound) {
    const uint64_t threshold = -bound % bound;
    while (low < threshold) {
      product = static_cast<unsigned __int128>(splitmix64(state)) * bound;
      low = static_cast<uint64_t>(product);
    }
  }
  return static_cast<uint64_t>(product >> 64);
}

}  // namespace trainer
