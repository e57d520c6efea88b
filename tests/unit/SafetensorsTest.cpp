// The safetensors reader: a file it refuses leaves nothing mapped (resolve()
// walks every corrupt candidate checkpoint, so a leak per file adds up).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "TestSupport.h"
#include "trainer/Errors.h"
#include "trainer/util/Safetensors.h"

namespace trainer {
namespace {

// Lines of /proc/self/maps that map `path`.
int mappings_of(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) count += line.find(path) != std::string::npos ? 1 : 0;
  return count;
}

TEST(Safetensors, ARefusedHeaderLeavesNothingMapped) {
  const std::string path = scratch_dir("SafetensorsLeak") + "/bad.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t header_bytes = 12;
    out.write(reinterpret_cast<const char*>(&header_bytes), 8);
    out << "{not json!!}" << std::string(64, '\0');
  }
  for (int i = 0; i < 3; ++i) EXPECT_THROW(SafetensorsReader reader(path), InputError);
  EXPECT_EQ(mappings_of(path), 0) << "each refused file stayed mapped";
}

}  // namespace
}  // namespace trainer
