// Reading metrics.jsonl back, and errors that name the line.
#include "tools/Metrics.h"

#include <gtest/gtest.h>

#include <cmath>

#include "TestSupport.h"
#include "trainer/Errors.h"

namespace trainer {
namespace {

TEST(Metrics, ReadsNumbersBooleansAndNull) {
  const std::string dir = testing::scratch_dir("Metrics");
  const std::string path = testing::write_file(
      dir + "/m.jsonl", "{\"step\":1,\"loss\":2.5,\"skipped\":false,\"name\":\"x\"}\n\n{\"step\":2,\"loss\":null}\n");
  const std::vector<MetricsRow> rows = read_metrics(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("loss"), 2.5);
  EXPECT_EQ(rows[0].at("skipped"), 0.0);
  EXPECT_EQ(rows[0].count("name"), 0u);
  EXPECT_TRUE(std::isnan(rows[1].at("loss")));
}

TEST(Metrics, MalformedLineIsNamed) {
  const std::string dir = testing::scratch_dir("MetricsBad");
  const std::string path = testing::write_file(dir + "/m.jsonl", "{\"step\":1}\n{\"step\":}\n");
  try {
    read_metrics(path);
    FAIL();
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("m.jsonl:2: malformed metrics record"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace trainer
