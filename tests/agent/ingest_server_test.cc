#include "agent/ingest_server.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/agent/test_util.h"
#include "tests/testing/received.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::agent {
namespace {

using testing::SendDatagram;
using testing::WaitFor;

constexpr char kEvent[] = R"({"job":"j","rank":1,"world_size":2,"step":7,"step_s":0.25})";

using Received = test::Received<v1::StepEvent>;

uint64_t Rejected(const IngestServer& s, RejectReason r) {
  return s.stats().rejected_total[static_cast<int>(r)];
}

class IngestServerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.empty()); }
  IngestServerOptions Options(const std::string& name = "agent.sock") {
    IngestServerOptions o;
    o.socket_path = dir_ + "/" + name;
    o.clock = &clock_;
    return o;
  }
  test::TempDir temp_dir_{"stepwatch-agent-test"};
  const std::string dir_ = temp_dir_.path();
  SimulatedClock clock_;
};

TEST_F(IngestServerTest, ReceivesValidEventsWithSenderPidAndTime) {
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(server);
  ASSERT_TRUE(SendDatagram((*server)->socket_path(), kEvent));
  ASSERT_TRUE(WaitFor([&] { return received.size() == 1; }));
  const v1::StepEvent e = received.items()[0];
  EXPECT_EQ(e.job(), "j");
  EXPECT_EQ(e.step(), 7);
  EXPECT_EQ(e.pid(), ::getpid());
  EXPECT_EQ(e.received_unix_nanos(), clock_.NowUnixNanos());
  EXPECT_EQ((*server)->stats().events_accepted_total, 1u);
  EXPECT_EQ((*server)->stats().datagrams_total, 1u);
}

TEST_F(IngestServerTest, SocketIsNotWorldWritableAndParentIsCreated) {
  IngestServerOptions o = Options();
  o.socket_path = dir_ + "/run/stepwatch/agent.sock";
  o.socket_group = 65534;  // nogroup: the training users' group
  Received received;
  auto server = IngestServer::Start(o, received.Sink());
  ASSERT_OK(server);
  struct stat st;
  ASSERT_EQ(::stat(o.socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, 65534u);
  ASSERT_EQ(::stat((dir_ + "/run/stepwatch").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST_F(IngestServerTest, CountsEveryKindOfBadInputAndKeepsRunning) {
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(server);
  const std::string path = (*server)->socket_path();
  ASSERT_TRUE(SendDatagram(path, "not json at all"));
  ASSERT_TRUE(SendDatagram(path, ""));
  ASSERT_TRUE(SendDatagram(path, "[1,2,3]"));
  ASSERT_TRUE(SendDatagram(path, R"({"job":"j"})"));
  ASSERT_TRUE(SendDatagram(path, R"({"job":"j","rank":"1","world_size":2,"step":1,"step_s":1})"));
  ASSERT_TRUE(SendDatagram(path, R"({"job":"j","rank":2,"world_size":2,"step":1,"step_s":1})"));
  ASSERT_TRUE(SendDatagram(path, std::string(kMaxDatagramBytes + 1, ' ')));
  ASSERT_TRUE(SendDatagram(path, std::string("\0\xff\xfe", 3)));
  ASSERT_TRUE(SendDatagram(path, kEvent));
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().datagrams_total == 9; }));
  const IngestServer& s = **server;
  EXPECT_EQ(Rejected(s, RejectReason::kNotJson), 3u);
  EXPECT_EQ(Rejected(s, RejectReason::kNotObject), 1u);
  EXPECT_EQ(Rejected(s, RejectReason::kMissingField), 1u);
  EXPECT_EQ(Rejected(s, RejectReason::kWrongType), 1u);
  EXPECT_EQ(Rejected(s, RejectReason::kOutOfRange), 1u);
  EXPECT_EQ(Rejected(s, RejectReason::kTooLarge), 1u);
  EXPECT_EQ(s.stats().events_accepted_total, 1u);
  EXPECT_EQ(received.size(), 1u);
}

TEST_F(IngestServerTest, ARankIsBoundToTheProcessThatReportsIt) {
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(server);
  const std::string path = (*server)->socket_path();
  ASSERT_TRUE(SendDatagram(path, kEvent));  // this process now owns rank 1 of job j
  ASSERT_TRUE(WaitFor([&] { return received.size() == 1; }));
  // Another process forges rank 1 while this one runs, then reports a rank of its own.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const bool sent =
        SendDatagram(path, R"({"job":"j","rank":1,"world_size":2,"step":8,"step_s":9.5})") &&
        SendDatagram(path, R"({"job":"j","rank":0,"world_size":2,"step":8,"step_s":0.25})");
    ::_exit(sent ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().datagrams_total == 3; }));
  EXPECT_EQ(Rejected(**server, RejectReason::kNotOwner), 1u);
  ASSERT_EQ(received.size(), 2u);
  EXPECT_EQ(received.items()[1].rank(), 0);
  EXPECT_EQ(received.items()[1].pid(), child);
  // The child is gone: its rank 0 may be taken over (a restarted rank).
  ASSERT_TRUE(SendDatagram(path, R"({"job":"j","rank":0,"world_size":2,"step":9,"step_s":0.25})"));
  ASSERT_TRUE(WaitFor([&] { return received.size() == 3; }));
}

// One process, then one user, fills its own share of the (job, rank) table; the refusals are
// tenant_limit, counted under its uid, and another user's new job still gets in.
TEST_F(IngestServerTest, TenantBoundsRefuseOneUserAndAdmitAnother) {
  Received received;
  IngestServerOptions o = Options();
  o.owners.max_per_process = 3;
  o.owners.max_per_user = 4;
  o.socket_mode = 0666;
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  auto server = IngestServer::Start(o, received.Sink());
  ASSERT_OK(server);
  const std::string path = (*server)->socket_path();
  auto event = [](const std::string& job, int rank) {
    return absl::StrCat(R"({"job":")", job, R"(","rank":)", rank,
                        R"(,"world_size":64,"step":1,"step_s":0.25})");
  };
  for (int r = 0; r < 5; ++r) ASSERT_TRUE(SendDatagram(path, event("flood", r)));
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().datagrams_total == 5; }));
  EXPECT_EQ(received.size(), 3u);
  EXPECT_EQ(Rejected(**server, RejectReason::kTenantLimit), 2u);
  // A second process of the same user: one more rank, up to the user's bound. Each sender lives
  // until its messages are handled (a gone process's bindings may be swept).
  struct Sender {
    pid_t pid = -1;
    int release = -1;
  };
  auto start_as = [&](uid_t uid, const std::vector<std::string>& messages) {
    int fds[2];
    if (::pipe(fds) != 0) return Sender{};
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(fds[1]);
      if (uid != ::getuid() && ::setuid(uid) != 0) ::_exit(2);
      for (const std::string& m : messages) {
        if (!SendDatagram(path, m)) ::_exit(1);
      }
      char c;
      (void)!::read(fds[0], &c, 1);  // until the parent closes its end
      ::_exit(0);
    }
    ::close(fds[0]);
    return Sender{child, fds[1]};
  };
  auto finish = [](Sender s) {
    ::close(s.release);
    int status = 0;
    return s.pid > 0 && ::waitpid(s.pid, &status, 0) == s.pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
  };
  Sender same = start_as(::getuid(), {event("flood", 5), event("flood", 6)});
  ASSERT_GT(same.pid, 0);
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().datagrams_total == 7; }));
  ASSERT_TRUE(finish(same));
  EXPECT_EQ(received.size(), 4u);
  EXPECT_EQ(Rejected(**server, RejectReason::kTenantLimit), 3u);
  const std::vector<std::pair<std::string, uint64_t>> by_uid = {{absl::StrCat(::getuid()), 3}};
  EXPECT_EQ((*server)->stats().tenant_refusals_by_uid, by_uid);
  if (::getuid() != 0) GTEST_SKIP() << "another uid needs root";
  Sender other = start_as(65534, {event("theirs", 0)});
  ASSERT_GT(other.pid, 0);
  ASSERT_TRUE(WaitFor([&] { return received.size() == 5; }));
  ASSERT_TRUE(finish(other));
  EXPECT_EQ(received.items().back().job(), "theirs");
  EXPECT_EQ(Rejected(**server, RejectReason::kTenantLimit), 3u);
}

TEST(PidNamespaceTest, NestedWhenNSpidListsSeveralPids) {
  EXPECT_EQ(PidNamespaceNested("Name:\tx\nNSpid:\t4242\nNSpgid:\t1\n"), false);
  EXPECT_EQ(PidNamespaceNested("Name:\tx\nNSpid:\t4242\t7\n"), true);
  EXPECT_EQ(PidNamespaceNested("NSpid: 9 8 1"), true);
  EXPECT_EQ(PidNamespaceNested("Name:\tx\n"), std::nullopt);
}

TEST_F(IngestServerTest, ReportsItsOwnPidNamespace) {
  const std::string status = dir_ + "/status";
  {
    std::ofstream out(status);
    out << "Name:\tstepwatch-agent\nNSpid:\t31337\t1\n";
  }
  Received received;
  IngestServerOptions o = Options();
  o.proc_self_status = status;
  auto nested = IngestServer::Start(o, received.Sink());
  ASSERT_OK(nested);
  EXPECT_TRUE((*nested)->stats().own_pid_namespace);
  (*nested)->Stop();
  auto host = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(host);
  // The test itself runs in the initial pid namespace (or the check is moot).
  const bool here = PidNamespaceNested([] {
                      std::ifstream in("/proc/self/status");
                      std::stringstream ss;
                      ss << in.rdbuf();
                      return ss.str();
                    }())
                        .value_or(false);
  EXPECT_EQ((*host)->stats().own_pid_namespace, here);
  EXPECT_EQ((*host)->stats().unknown_sender_events_total, 0u);
}

TEST_F(IngestServerTest, ReplacesStaleSocketFile) {
  Received received;
  {
    auto first = IngestServer::Start(Options(), received.Sink());
    ASSERT_OK(first);
    // Leave a socket file behind with nobody reading it, as a crashed agent would.
    const int fd = ::socket(AF_UNIX, SOCK_DGRAM, 0);
    (*first)->Stop();
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = Options().socket_path;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
  }
  auto second = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(second);
  ASSERT_TRUE(SendDatagram((*second)->socket_path(), kEvent));
  EXPECT_TRUE(WaitFor([&] { return received.size() == 1; }));
}

TEST_F(IngestServerTest, RefusesSocketInUseByAnotherAgent) {
  Received received;
  auto first = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(first);
  auto second = IngestServer::Start(Options(), received.Sink());
  ASSERT_THAT(second, test::StatusIs(absl::StatusCode::kAlreadyExists));
  // The first one still works.
  ASSERT_TRUE(SendDatagram((*first)->socket_path(), kEvent));
  EXPECT_TRUE(WaitFor([&] { return received.size() == 1; }));
}

TEST_F(IngestServerTest, RefusesToReplaceARegularFile) {
  const std::string path = Options().socket_path;
  std::ofstream(path) << "precious";
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_THAT(server, test::StatusIs(absl::StatusCode::kFailedPrecondition));
  std::ifstream in(path);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "precious");
}

TEST_F(IngestServerTest, RejectsOverlongPath) {
  IngestServerOptions o = Options();
  o.socket_path = dir_ + "/" + std::string(200, 'x');
  Received received;
  auto server = IngestServer::Start(o, received.Sink());
  ASSERT_THAT(server, test::StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(IngestServerTest, StopRemovesSocketAndIsIdempotent) {
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(server);
  const std::string path = (*server)->socket_path();
  const auto start = std::chrono::steady_clock::now();
  (*server)->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  (*server)->Stop();
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0);
  EXPECT_FALSE(SendDatagram(path, kEvent));
}

TEST_F(IngestServerTest, ManyEventsFromSeveralSendersAllArrive) {
  Received received;
  IngestServerOptions o = Options();
  auto server = IngestServer::Start(o, received.Sink());
  ASSERT_OK(server);
  constexpr int kSenders = 4;
  constexpr int kPerSender = 500;
  std::vector<std::thread> senders;
  for (int t = 0; t < kSenders; ++t) {
    senders.emplace_back([&, t] {
      for (int i = 0; i < kPerSender; ++i) {
        const std::string e = R"({"job":"j","rank":)" + std::to_string(t) +
                              R"(,"world_size":4,"step":)" + std::to_string(i) +
                              R"(,"step_s":0.1})";
        // A full receive buffer makes a blocking sender wait; the count must still match.
        SendDatagram((*server)->socket_path(), e);
      }
    });
  }
  for (auto& s : senders) s.join();
  ASSERT_TRUE(WaitFor([&] { return received.size() == kSenders * kPerSender; })) << received.size();
  std::vector<int> per_rank(kSenders, 0);
  for (const auto& e : received.items()) ++per_rank[e.rank()];
  for (int t = 0; t < kSenders; ++t) EXPECT_EQ(per_rank[t], kPerSender);
}

}  // namespace
}  // namespace stepwatch::agent
