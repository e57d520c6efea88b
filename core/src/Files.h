// File-system helpers that must not go through std::filesystem::remove_all:
// the PyTorch wheel's libtorch.so exports its own copy of that symbol, which
// crashes when it wins symbol resolution (seen with LibTorch 2.11).
#pragma once

#include <ftw.h>
#include <stdio.h>

#include <string>

namespace trainer {

/// Removes `path` and everything below it; a missing path is not an error.
inline void remove_tree(const std::string& path) {
  nftw(
      path.c_str(), [](const char* file, const struct stat*, int, struct FTW*) { return ::remove(file); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

}  // namespace trainer
