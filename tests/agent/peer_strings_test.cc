#include "agent/peer_strings.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stepwatch::agent {
namespace {

TEST(PeerStringsTest, PrintableStringsWithinTheirBoundAreKept) {
  std::string s = "NVIDIA H100 80GB HBM3 \xc3\xa9";
  const std::string before = s;
  EXPECT_FALSE(BoundPeerString(&s, 96));
  EXPECT_EQ(s, before);
}

TEST(PeerStringsTest, LongStringsAreCutAtACharacterBoundary) {
  std::string s = std::string(10, 'a') + "\xc3\xa9";  // 12 bytes, the last character is 2
  EXPECT_TRUE(BoundPeerString(&s, 11));
  EXPECT_EQ(s, std::string(10, 'a'));
  std::string big(1 << 20, 'x');
  EXPECT_TRUE(BoundPeerString(&big, 96));
  EXPECT_EQ(big.size(), 96u);
}

TEST(PeerStringsTest, ControlsEscapesAndInvalidUtf8AreReplaced) {
  std::string s =
      "GPU\x1b[2J\x07\x7f\xc2\x9b"
      "31m\xff\xc0\xaf\xed\xa0\x80ok";
  EXPECT_TRUE(BoundPeerString(&s, 256));
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    EXPECT_TRUE(u >= 0x20 && u < 0x7f) << static_cast<int>(u);
  }
  EXPECT_EQ(s.substr(0, 4), "GPU?");
  EXPECT_EQ(s.substr(s.size() - 2), "ok");
}

TEST(PeerStringsTest, EveryPeerChosenStringOfANodeIsBoundedAndCounted) {
  v1::NodeInfo node;
  node.set_hostname(std::string(300, 'h'));
  node.set_driver_version("550.54\n");
  node.set_nvml_error("fine");
  std::vector<v1::GpuSample> gpus(2);
  gpus[0].set_name(std::string(4096, 'n'));
  gpus[0].set_uuid("GPU-\x1b]0;pwned\x07");
  (*gpus[0].mutable_unavailable_metrics())["power"] = std::string(1000, 'e');
  gpus[1].set_name("NVIDIA A100");
  gpus[1].set_uuid("GPU-1234");
  PeerStringCounts counts{};
  BoundPeerStrings(&node, &gpus, &counts);
  EXPECT_EQ(node.hostname().size(), PeerStringLimit(PeerStringField::kHostname));
  EXPECT_EQ(node.driver_version(), "550.54?");
  EXPECT_EQ(gpus[0].name().size(), PeerStringLimit(PeerStringField::kGpuName));
  EXPECT_EQ(gpus[0].uuid().find('\x1b'), std::string::npos);
  EXPECT_EQ(gpus[0].unavailable_metrics().at("power").size(), 256u);
  EXPECT_EQ(gpus[1].name(), "NVIDIA A100");
  EXPECT_EQ(counts[static_cast<int>(PeerStringField::kHostname)], 1u);
  EXPECT_EQ(counts[static_cast<int>(PeerStringField::kDriverVersion)], 1u);
  EXPECT_EQ(counts[static_cast<int>(PeerStringField::kNvmlError)], 0u);
  EXPECT_EQ(counts[static_cast<int>(PeerStringField::kGpuName)], 1u);
  EXPECT_EQ(counts[static_cast<int>(PeerStringField::kGpuUuid)], 1u);
  EXPECT_EQ(counts[static_cast<int>(PeerStringField::kUnavailableMetric)], 1u);
}

TEST(PeerStringsTest, FieldNamesAreDistinctSnakeCase) {
  std::set<std::string> names;
  for (int i = 0; i < kPeerStringFieldCount; ++i) {
    const std::string name = PeerStringFieldName(static_cast<PeerStringField>(i));
    EXPECT_NE(name, "unknown");
    for (char c : name) EXPECT_TRUE(c == '_' || (c >= 'a' && c <= 'z')) << name;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kPeerStringFieldCount));
}

}  // namespace
}  // namespace stepwatch::agent
