// `trainer export`: weights for Hugging Face, from a finished run or a checkpoint.
#pragma once

#include <string>

namespace trainer {

/// Copies RUN_DIR's model.safetensors and config.json into `to` (created),
/// after checking the safetensors file reads back; or, when RUN_DIR is a
/// checkpoint, consolidates its shards. InputError if missing or corrupt,
/// or when `to` holds either file already or another export is writing
/// into it. An export that fails writes nothing (a `to` it made is removed
/// again); one killed part-way leaves files of its own beside them, which
/// the next export into `to` removes.
void export_run(const std::string& run_dir, const std::string& to);

/// Consolidates a verified checkpoint's fp32 weights into `to`
/// (model.safetensors, Hugging Face names, plus config.json), whatever world
/// size wrote it.
void export_checkpoint(const std::string& dir, const std::string& to);

}  // namespace trainer
