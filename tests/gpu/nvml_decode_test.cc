// Layout rules for what NVML writes: process entry sizes per driver, pids out of a buffer, field
// values by type.
#include "gpu/nvml_decode.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stepwatch::gpu {
namespace {

using ::testing::ElementsAre;

TEST(NvmlDecodeTest, ProcessEntrySizeOfV3FollowsTheDriver) {
  EXPECT_EQ(ProcessEntrySizeOfV3("535.43.02"), 32u);
  EXPECT_EQ(ProcessEntrySizeOfV3("535.54.03"), 32u);
  EXPECT_EQ(ProcessEntrySizeOfV3("535.86.10"), 32u);
  EXPECT_EQ(ProcessEntrySizeOfV3("535.104.05"), 24u);
  EXPECT_EQ(ProcessEntrySizeOfV3("535.42"), 24u);
  EXPECT_EQ(ProcessEntrySizeOfV3("530.30.02"), 24u);
  EXPECT_EQ(ProcessEntrySizeOfV3("550.54.15"), 24u);
  EXPECT_EQ(ProcessEntrySizeOfV3("590.48.01"), 24u);
  EXPECT_EQ(ProcessEntrySizeOfV3(""), 24u);
  EXPECT_EQ(ProcessEntrySizeOfV3("fake"), 24u);
}

TEST(NvmlDecodeTest, PidsUseTheStrideAndStayInsideTheBuffer) {
  std::vector<unsigned char> buffer(3 * 32, 0xee);
  for (unsigned int i = 0; i < 3; ++i) {
    const unsigned int pid = 1000 + i;
    memcpy(buffer.data() + i * 32, &pid, sizeof(pid));
  }
  EXPECT_THAT(PidsFromProcessBuffer(buffer, 32, 3), ElementsAre(1000u, 1001u, 1002u));
  // A count beyond the buffer is cut at the buffer's end.
  EXPECT_EQ(PidsFromProcessBuffer(buffer, 32, 100).size(), 3u);
  EXPECT_EQ(PidsFromProcessBuffer(buffer, 24, 100).size(), 4u);
  EXPECT_TRUE(PidsFromProcessBuffer(buffer, 0, 3).empty());
}

nvml::FieldValue Field(int type, unsigned long long raw) {
  nvml::FieldValue v{};
  v.value_type = type;
  memcpy(&v.value, &raw, sizeof(raw));
  return v;
}

TEST(NvmlDecodeTest, FieldValuesAreReadByTheirType) {
  // Bytes beyond the member the type names are garbage: reading them would give a wrong value.
  const unsigned long long garbage_high = 0xdeadbeef00000000ull;
  EXPECT_EQ(FieldValueAsCounter(Field(nvml::kValueTypeUnsignedInt, garbage_high | 77)), 77u);
  EXPECT_EQ(FieldValueAsCounter(Field(nvml::kValueTypeUnsignedShort, 0xdeadbeefcafe0000ull | 513)),
            513u);
  EXPECT_EQ(FieldValueAsCounter(Field(nvml::kValueTypeSignedInt, garbage_high | 12)), 12u);
  EXPECT_EQ(FieldValueAsCounter(Field(nvml::kValueTypeUnsignedLongLong, 1ull << 40)), 1ull << 40);
  EXPECT_EQ(FieldValueAsCounter(Field(nvml::kValueTypeUnsignedLong, 1ull << 41)), 1ull << 41);
  EXPECT_EQ(FieldValueAsCounter(Field(nvml::kValueTypeSignedLongLong, 1ull << 42)), 1ull << 42);
  nvml::FieldValue d{};
  d.value_type = nvml::kValueTypeDouble;
  d.value.d_val = 1234.0;
  EXPECT_EQ(FieldValueAsCounter(d), 1234u);
  nvml::FieldValue negative{};
  negative.value_type = nvml::kValueTypeSignedInt;
  negative.value.si_val = -1;
  EXPECT_EQ(FieldValueAsCounter(negative), std::nullopt);
  EXPECT_EQ(FieldValueAsCounter(Field(7, 1)), std::nullopt);
}

}  // namespace
}  // namespace stepwatch::gpu
