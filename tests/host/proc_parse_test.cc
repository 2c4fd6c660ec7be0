// Parsers on kernel output captured from real machines (testdata/ and inline strings).
#include "host/proc_parse.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::host {
namespace {

using test::StatusIs;

using ::testing::ElementsAre;
using ::testing::Pair;

std::string Fixture(const std::string& relative) {
  std::ifstream in(std::string(STEPWATCH_HOST_TESTDATA) + "/" + relative);
  std::ostringstream out;
  out << in.rdbuf();
  EXPECT_FALSE(out.str().empty()) << relative;
  return out.str();
}

TEST(ParseProcStatTest, CapturedTwoCpuMachine) {
  // cpu  24077 0 6997 108855 503 0 73 24 0 0
  absl::StatusOr<CpuTimes> t = ParseProcStat(Fixture("debian12-2cpu/proc/stat"));
  ASSERT_OK(t);
  EXPECT_EQ(t->cpu_count, 2u);
  EXPECT_EQ(t->total, 24077u + 6997 + 108855 + 503 + 73 + 24);
  EXPECT_EQ(t->busy, 24077u + 6997 + 73 + 24);
}

TEST(ParseProcStatTest, GuestTimeIsNotCountedTwice) {
  // Four CPUs, with guest time (already included in user and nice).
  const char kStat[] =
      "cpu  100 10 50 800 20 5 5 10 40 4\n"
      "cpu0 25 3 12 200 5 1 1 3 10 1\n"
      "cpu1 25 3 12 200 5 1 1 3 10 1\n"
      "cpu2 25 2 13 200 5 2 2 2 10 1\n"
      "cpu3 25 2 13 200 5 1 1 2 10 1\n"
      "intr 1 2 3\nctxt 99\nbtime 1700000000\nprocesses 5\n";
  absl::StatusOr<CpuTimes> t = ParseProcStat(kStat);
  ASSERT_OK(t);
  EXPECT_EQ(t->cpu_count, 4u);
  EXPECT_EQ(t->total, 1000u);
  EXPECT_EQ(t->busy, 180u);
}

TEST(ParseProcStatTest, RejectsBrokenInput) {
  EXPECT_THAT(ParseProcStat(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseProcStat("intr 1 2 3\n"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseProcStat("cpu  1 2 x 4 5\n"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseProcStat("cpu  1 2\n"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CpuUtilizationTest, FromDeltas) {
  CpuTimes a{100, 1000, 4};
  CpuTimes b{400, 2000, 4};
  ASSERT_TRUE(CpuUtilization(a, b).has_value());
  EXPECT_DOUBLE_EQ(*CpuUtilization(a, b), 0.3);
  EXPECT_FALSE(CpuUtilization(a, a).has_value());  // no time passed
  EXPECT_FALSE(CpuUtilization(b, a).has_value());  // counters went back
}

TEST(ParseMeminfoTest, CapturedMachine) {
  absl::StatusOr<MemInfo> m = ParseMeminfo(Fixture("debian12-2cpu/proc/meminfo"));
  ASSERT_OK(m);
  EXPECT_EQ(m->total_bytes, 24684096ull * 1024);
  ASSERT_TRUE(m->available_bytes.has_value());
  EXPECT_EQ(*m->available_bytes, 24096076ull * 1024);
}

TEST(ParseMeminfoTest, OldKernelWithoutMemAvailable) {
  absl::StatusOr<MemInfo> m = ParseMeminfo("MemTotal:  1024 kB\nMemFree:  512 kB\n");
  ASSERT_OK(m);
  EXPECT_EQ(m->total_bytes, 1024u * 1024);
  EXPECT_FALSE(m->available_bytes.has_value());
  EXPECT_THAT(ParseMeminfo("MemFree: 1 kB\n"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseMeminfo("MemTotal: lots kB\n"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ParseNetDevTest, CapturedMachineExcludesLoopback) {
  absl::StatusOr<NetTotals> n = ParseNetDev(Fixture("debian12-2cpu/proc/net/dev"));
  ASSERT_OK(n);
  EXPECT_EQ(n->receive_bytes, 109767542u);
  EXPECT_EQ(n->transmit_bytes, 90869u);
}

TEST(ParseNetDevTest, SumsInterfacesAndHandlesCountersTouchingTheColon) {
  const char kDev[] =
      "Inter-|   Receive                                                |  Transmit\n"
      " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs "
      "drop fifo colls carrier compressed\n"
      "    lo: 500 5 0 0 0 0 0 0 500 5 0 0 0 0 0 0\n"
      "  eth0:12345678901234 10 0 0 0 0 0 0 200 2 0 0 0 0 0 0\n"
      "ib0: 1000 1 0 0 0 0 0 0 3000 3 0 0 0 0 0 0\n";
  absl::StatusOr<NetTotals> n = ParseNetDev(kDev);
  ASSERT_OK(n);
  EXPECT_EQ(n->receive_bytes, 12345678901234u + 1000);
  EXPECT_EQ(n->transmit_bytes, 3200u);
  EXPECT_THAT(ParseNetDev(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseNetDev("eth0: 1 2 3\n"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ParseResctrlCounterTest, NumberOrUnavailable) {
  absl::StatusOr<uint64_t> v = ParseResctrlCounter("8231157760\n");
  ASSERT_OK(v);
  EXPECT_EQ(*v, 8231157760u);
  EXPECT_THAT(ParseResctrlCounter("Unavailable\n"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(ParseResctrlCounter(""), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(ParsePerfFormatTest, Ranges) {
  absl::StatusOr<PerfFormatField> f = ParsePerfFormat("config:0-7\n");
  ASSERT_OK(f);
  EXPECT_THAT(f->bit_ranges, ElementsAre(Pair(0, 7)));
  f = ParsePerfFormat("config:21");
  ASSERT_OK(f);
  EXPECT_THAT(f->bit_ranges, ElementsAre(Pair(21, 21)));
  f = ParsePerfFormat("config:0-7,32-35");
  ASSERT_OK(f);
  EXPECT_THAT(f->bit_ranges, ElementsAre(Pair(0, 7), Pair(32, 35)));
  EXPECT_THAT(ParsePerfFormat("config1:0-7"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePerfFormat("config:7-0"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePerfFormat("config:0-64"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ParsePerfEventConfigTest, PlacesTermsByFormat) {
  const std::vector<std::pair<std::string, std::string>> formats = {{"event", "config:0-7"},
                                                                    {"umask", "config:8-15"},
                                                                    {"edge", "config:18"},
                                                                    {"wide", "config:0-3,32-35"}};
  absl::StatusOr<uint64_t> c = ParsePerfEventConfig("event=0x04,umask=0x03\n", formats);
  ASSERT_OK(c);
  EXPECT_EQ(*c, 0x0304u);
  c = ParsePerfEventConfig("event=0x04,umask=0x0c,edge", formats);
  ASSERT_OK(c);
  EXPECT_EQ(*c, 0x0c04u | (1u << 18));
  c = ParsePerfEventConfig("wide=0xab", formats);
  ASSERT_OK(c);
  EXPECT_EQ(*c, 0xbull | (0xaull << 32));
  EXPECT_THAT(ParsePerfEventConfig("event=0x04,mystery=1", formats),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePerfEventConfig("event=zz", formats),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ParsePerfUnitBytesTest, Units) {
  EXPECT_DOUBLE_EQ(*ParsePerfUnitBytes("MiB\n"), 1048576.0);
  EXPECT_DOUBLE_EQ(*ParsePerfUnitBytes("B"), 1.0);
  EXPECT_THAT(ParsePerfUnitBytes("Joules"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ParseFirstCpuTest, Masks) {
  EXPECT_EQ(*ParseFirstCpu("0\n"), 0);
  EXPECT_EQ(*ParseFirstCpu("18,54"), 18);
  EXPECT_EQ(*ParseFirstCpu("4-7"), 4);
  EXPECT_THAT(ParseFirstCpu(""), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace stepwatch::host
