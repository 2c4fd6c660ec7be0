#include "common/collectors.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch {
namespace {

using test::StatusIs;

TEST(CollectorTargetsTest, ParsesListsAndDnsNames) {
  absl::StatusOr<CollectorTargets> t = ParseCollectorTargets("a:1, b:2,[::1]:3,a:1");
  ASSERT_OK(t);
  EXPECT_FALSE(t->is_dns());
  EXPECT_EQ(t->addresses, (std::vector<std::string>{"a:1", "b:2", "[::1]:3"}));

  t = ParseCollectorTargets("dns:///stepwatch-collector.ns.svc:7070");
  ASSERT_OK(t);
  EXPECT_TRUE(t->is_dns());
  EXPECT_EQ(t->dns_name, "stepwatch-collector.ns.svc");
  EXPECT_EQ(t->dns_port, 7070);
  EXPECT_OK(ParseCollectorTargets("dns:localhost:7070"));
}

TEST(CollectorTargetsTest, RefusesBadLists) {
  for (const char* bad : {"", "a", "a:0", "a:1,,b:2", "a:1,dns:///b:2", "dns:///a:1,b:2",
                          "dns:///a", ":7070", "a:99999"}) {
    EXPECT_THAT(ParseCollectorTargets(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(CollectorTargetsTest, ResolvesEveryAddressOfAName) {
  absl::StatusOr<CollectorTargets> t = ParseCollectorTargets("dns:///localhost:7070");
  ASSERT_OK(t);
  absl::StatusOr<std::vector<std::string>> got = ResolveCollectorTargets(*t);
  ASSERT_OK(got);
  ASSERT_FALSE(got->empty());
  const std::set<std::string> set(got->begin(), got->end());
  EXPECT_EQ(set.size(), got->size());
  EXPECT_TRUE(set.count("127.0.0.1:7070") || set.count("[::1]:7070")) << (*got)[0];

  t = ParseCollectorTargets("dns:///no-such-collector.invalid:7070");
  ASSERT_OK(t);
  EXPECT_FALSE(ResolveCollectorTargets(*t).ok());
  // A list is taken as it is.
  t = ParseCollectorTargets("b:1,a:1");
  EXPECT_EQ(*ResolveCollectorTargets(*t), (std::vector<std::string>{"b:1", "a:1"}));
}

TEST(RendezvousTest, ScoresAreStableAcrossReleases) {
  // Agents, stepwatchctl and load generators of different releases must agree on owners.
  EXPECT_EQ(RendezvousScore("job-a", "10.0.0.1:7070"), RendezvousScore("job-a", "10.0.0.1:7070"));
  EXPECT_NE(RendezvousScore("ab", "c"), RendezvousScore("a", "bc"));
  // Pinned values, computed independently (FNV-1a 64 of key, xor 0xff, FNV-1a on of member, then
  // splitmix64's finalizer): changing the function would move jobs between collectors whenever
  // agents of two releases run side by side.
  EXPECT_EQ(RendezvousScore("", ""), 0xc19752eb5aae2f62ull);
  EXPECT_EQ(RendezvousScore("job-a", "10.0.0.1:7070"), 0xa27c199d4c0b75dfull);
}

TEST(RendezvousTest, OwnersAreTheTopOfTheOrder) {
  const std::vector<std::string> members = {"c1:1", "c2:1", "c3:1"};
  const std::vector<std::string> order = RendezvousOrder("job", members);
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(std::set<std::string>(order.begin(), order.end()),
            std::set<std::string>(members.begin(), members.end()));
  EXPECT_EQ(RendezvousOwners("job", members, 2), (std::vector<std::string>{order[0], order[1]}));
  EXPECT_EQ(RendezvousOwners("job", members, 5), order);
  // The order does not depend on the order members are listed in.
  EXPECT_EQ(RendezvousOrder("job", {"c3:1", "c1:1", "c2:1"}), order);
}

TEST(RendezvousTest, SpreadsKeysEvenlyAndMovesOnlyTheLostMembersKeys) {
  std::vector<std::string> members;
  for (int i = 0; i < 5; ++i) members.push_back(absl::StrCat("10.0.0.", i, ":7070"));
  std::map<std::string, int> held;
  std::map<std::string, std::string> owner;
  const int keys = 10000;
  for (int k = 0; k < keys; ++k) {
    const std::string key = absl::StrCat("job-", k);
    owner[key] = RendezvousOwners(key, members, 1)[0];
    ++held[owner[key]];
  }
  for (const std::string& m : members) {
    EXPECT_GT(held[m], keys / 5 * 0.9) << m;
    EXPECT_LT(held[m], keys / 5 * 1.1) << m;
  }
  // Without member 2, only its keys move; each goes to its own second choice.
  std::vector<std::string> fewer = members;
  fewer.erase(fewer.begin() + 2);
  std::map<std::string, int> took;
  for (const auto& [key, was] : owner) {
    const std::string now = RendezvousOwners(key, fewer, 1)[0];
    if (was != members[2]) {
      EXPECT_EQ(now, was) << key;
    } else {
      EXPECT_EQ(now, RendezvousOrder(key, members)[1]) << key;
      ++took[now];
    }
  }
  // The lost member's keys spread over all the survivors.
  EXPECT_EQ(took.size(), 4u);
}

TEST(RendezvousTest, NodeKeysDoNotCollideWithJobIds) {
  EXPECT_EQ(NodePlacementKey("n1"), "node/n1");
}

}  // namespace
}  // namespace stepwatch
