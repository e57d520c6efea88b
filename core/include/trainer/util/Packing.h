// Packing documents into windows (dataset.pack): which documents share a
// window, the packed sample, and what becomes of a document longer than a
// window. Free of LibTorch: datasets and their fuzz targets use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/Dataset.h"

namespace trainer {

/// dataset.long_documents: a document of more tokens than a window holds
/// (seq_len + 1) keeps its first window's worth (truncate), becomes pieces
/// that overlap by one token, so every token but the document's first is
/// still predicted once (split), or stops the run naming it (refuse).
enum class LongDocuments { Truncate, Split, Refuse };

/// "truncate", "split" or "refuse" (what the datasets' KeySpec allows).
LongDocuments long_documents_from(const std::string& name);

/// Where a document of `length` tokens is cut under `policy` for windows
/// of `capacity` tokens: [first, first + count) each. Itself when it fits;
/// its first `capacity` tokens (truncate); pieces starting every
/// capacity - 1 tokens, each piece's first token the previous one's last
/// (split). Refuse: std::runtime_error saying how long it is (the caller
/// names the file and the document).
struct DocumentPiece {
  int64_t first, count;
};
std::vector<DocumentPiece> document_pieces(int64_t length, int64_t capacity, LongDocuments policy);

/// The pieces `document` becomes under `policy` in windows of `capacity`
/// tokens: itself when it fits; one truncated piece; overlapping pieces
/// (each piece's first token is not a target: the previous piece predicts
/// it). Refuse: std::runtime_error saying how long it is (the caller names
/// the file and the document).
std::vector<Sample> fit_document(Sample document, int64_t capacity, LongDocuments policy);

/// Windows of at most `capacity` tokens filled with whole documents of
/// these lengths (each at most `capacity`): each document, in order, goes
/// into the open window with the least room that still holds it (the
/// earliest of those), else into a new window (best fit). Within a window
/// the documents keep their order. Depends on the lengths alone.
std::vector<std::vector<int64_t>> pack_documents(const std::vector<int64_t>& lengths, int64_t capacity);

/// The documents back to back as one sample: document_starts where each
/// begins, and no target at any document's first token.
Sample concatenate_documents(const std::vector<const Sample*>& documents);

}  // namespace trainer
