// An exception's message without LibTorch's C++ stack trace: c10::Error's
// what() appends one ("Exception raised from ... frame #0 ..."), which
// tells a user nothing and buries the message.
#pragma once

#include <exception>
#include <string>

#include <c10/util/Exception.h>

namespace trainer {

inline std::string brief_error(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

}  // namespace trainer
