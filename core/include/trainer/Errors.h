// Error types of the SDK. The CLI maps them to exit codes: InputError is bad
// input (exit 2), TrainingError a failure while training (exit 1).
#pragma once

#include <stdexcept>
#include <string>

namespace trainer {

/// Bad input from the user: a recipe, data file, checkpoint or plugin file.
/// The message names the file (and key or line) and what was expected.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A failure while training: a non-finite gradient under on_nonfinite =
/// "error", a lost peer, a device error.
class TrainingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace trainer
