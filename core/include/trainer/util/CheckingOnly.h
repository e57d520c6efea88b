// Whether a component is being created only to check its options.
#pragma once

namespace trainer {

/// True while `trainer validate` creates a component only to check its
/// options: a model then checks its configuration (and any file it reads
/// for it, such as a Hugging Face config.json) and returns from its
/// constructor without allocating or loading weights; nothing of it is
/// called afterwards but its destructor. False during runs.
bool checking_only();

}  // namespace trainer
