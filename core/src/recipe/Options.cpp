// Typed access to a validated recipe table; every failure names where the
// value came from.
#include "trainer/Options.h"

#include <fmt/format.h>

#include "trainer/Errors.h"

namespace trainer {

namespace {
const char* type_name(const Value& value) {
  switch (value.index()) {
    case 0:
      return "a boolean";
    case 1:
      return "an integer";
    case 2:
      return "a float";
    default:
      return "a string";
  }
}
}  // namespace

Options::Options(std::string section, std::string file, std::vector<Entry> entries)
    : section_(std::move(section)), file_(std::move(file)), entries_(std::move(entries)) {}

const Options::Entry& Options::find(const std::string& key) const {
  for (const Entry& entry : entries_) {
    if (entry.key == key) return entry;
  }
  // A plugin asking for a key it did not declare is a bug in that plugin.
  throw std::logic_error(fmt::format("[{}] has no declared key '{}'", section_, key));
}

bool Options::boolean(const std::string& key) const {
  const Entry& entry = find(key);
  if (const bool* value = std::get_if<bool>(&entry.value)) return *value;
  fail(key, fmt::format("a boolean, got {}", type_name(entry.value)));
}

int64_t Options::integer(const std::string& key) const {
  const Entry& entry = find(key);
  if (const int64_t* value = std::get_if<int64_t>(&entry.value)) return *value;
  fail(key, fmt::format("an integer, got {}", type_name(entry.value)));
}

double Options::real(const std::string& key) const {
  const Entry& entry = find(key);
  if (const double* value = std::get_if<double>(&entry.value)) return *value;
  if (const int64_t* value = std::get_if<int64_t>(&entry.value)) return static_cast<double>(*value);
  fail(key, fmt::format("a number, got {}", type_name(entry.value)));
}

const std::string& Options::text(const std::string& key) const {
  const Entry& entry = find(key);
  if (const std::string* value = std::get_if<std::string>(&entry.value)) return *value;
  fail(key, fmt::format("a string, got {}", type_name(entry.value)));
}

bool Options::is_set(const std::string& key) const { return find(key).origin != "default"; }

void Options::fail(const std::string& key, const std::string& expected) const {
  std::string origin = file_;
  for (const Entry& entry : entries_) {
    if (entry.key == key && entry.origin != "default") origin = entry.origin;
  }
  throw InputError(fmt::format("{}: [{}] {}: expected {}", origin, section_, key, expected));
}

}  // namespace trainer
