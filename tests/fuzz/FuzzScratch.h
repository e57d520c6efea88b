// A file or directory of one fuzz process, /tmp/NAME-PID[SUFFIX], removed
// (with what it holds) when the process exits.
#pragma once

#include <unistd.h>

#include <string>

#include "util/Files.h"

namespace fuzz {

struct Scratch {
  explicit Scratch(const std::string& name, const std::string& suffix = "")
      : path("/tmp/" + name + "-" + std::to_string(getpid()) + suffix) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { trainer::remove_tree(path); }
  const std::string path;
};

}  // namespace fuzz
