// Packing documents into windows (see trainer/util/Packing.h).
#include "trainer/util/Packing.h"

#include <map>
#include <stdexcept>

#include <fmt/format.h>

namespace trainer {

LongDocuments long_documents_from(const std::string& name) {
  if (name == "truncate") return LongDocuments::Truncate;
  if (name == "split") return LongDocuments::Split;
  if (name == "refuse") return LongDocuments::Refuse;
  throw std::invalid_argument("long_documents: expected truncate, split or refuse, got '" + name + "'");
}

std::vector<DocumentPiece> document_pieces(int64_t length, int64_t capacity, LongDocuments policy) {
  if (length <= capacity) return {{0, length}};
  switch (policy) {
    case LongDocuments::Refuse:
      throw std::runtime_error(
          fmt::format("{} tokens, more than a window of seq_len + 1 = {} holds (long_documents = "
                      "\"refuse\"; \"split\" or \"truncate\" would take it)",
                      length, capacity));
    case LongDocuments::Truncate:
      return {{0, capacity}};
    case LongDocuments::Split:
      break;
  }
  std::vector<DocumentPiece> pieces;
  const int64_t stride = capacity > 1 ? capacity - 1 : 1;
  for (int64_t first = 0; first + 1 < length; first += stride) {
    pieces.push_back({first, std::min(capacity, length - first)});
  }
  return pieces;
}

std::vector<Sample> fit_document(Sample document, int64_t capacity, LongDocuments policy) {
  const int64_t length = static_cast<int64_t>(document.tokens.size());
  const std::vector<DocumentPiece> cuts = document_pieces(length, capacity, policy);
  if (cuts.size() == 1 && cuts[0].count == length) return {std::move(document)};
  std::vector<Sample> pieces;
  for (const DocumentPiece& cut : cuts) {
    Sample piece;
    piece.tokens.assign(document.tokens.begin() + cut.first, document.tokens.begin() + cut.first + cut.count);
    piece.target.assign(document.target.begin() + cut.first, document.target.begin() + cut.first + cut.count);
    // A split piece's first token is the previous piece's last, predicted there.
    if (policy == LongDocuments::Split) piece.target[0] = 0;
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

std::vector<std::vector<int64_t>> pack_documents(const std::vector<int64_t>& lengths, int64_t capacity) {
  std::vector<std::vector<int64_t>> windows;
  // Open windows by free room; among equal room, insertion order (a
  // multimap keeps it), so lower_bound finds the earliest best fit.
  std::multimap<int64_t, size_t> open;
  for (size_t d = 0; d < lengths.size(); ++d) {
    const int64_t length = lengths[d];
    if (length > capacity || length < 0) {
      throw std::invalid_argument(
          fmt::format("pack_documents: document {} has {} tokens, capacity {}", d, length, capacity));
    }
    auto fit = open.lower_bound(length);
    size_t window;
    int64_t room;
    if (fit == open.end()) {
      window = windows.size();
      windows.emplace_back();
      room = capacity;
    } else {
      window = fit->second;
      room = fit->first;
      open.erase(fit);
    }
    windows[window].push_back(static_cast<int64_t>(d));
    room -= length;
    if (room > 0) open.emplace(room, window);
  }
  return windows;
}

Sample concatenate_documents(const std::vector<const Sample*>& documents) {
  Sample packed;
  for (const Sample* document : documents) {
    if (document->tokens.empty()) throw std::invalid_argument("concatenate_documents: an empty document");
    packed.document_starts.push_back(static_cast<int64_t>(packed.tokens.size()));
    packed.tokens.insert(packed.tokens.end(), document->tokens.begin(), document->tokens.end());
    packed.target.insert(packed.target.end(), document->target.begin(), document->target.end());
    packed.target[static_cast<size_t>(packed.document_starts.back())] = 0;
  }
  return packed;
}

}  // namespace trainer
