// The ingest server's SOCK_SEQPACKET socket: one step event per packet over a connection per
// client, with the datagram socket's checks (mode, group, sender pid), a bounded number of
// connections, and the clients' own drop counts per job.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/ingest_server.h"
#include "gtest/gtest.h"
#include "tests/agent/test_util.h"
#include "tests/testing/received.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::agent {
namespace {

using testing::SendDatagram;
using testing::WaitFor;

std::string Event(const std::string& job, int rank, int64_t step, const std::string& extra = "") {
  return R"({"job":")" + job + R"(","rank":)" + std::to_string(rank) +
         R"(,"world_size":64,"step":)" + std::to_string(step) + R"(,"step_s":0.25)" + extra + "}";
}

// A client connection to the seqpacket socket; closes on destruction.
class Connection {
 public:
  explicit Connection(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~Connection() { Close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool connected() const { return fd_ >= 0; }
  // Non-blocking; true when the whole packet was queued.
  bool Send(const std::string& payload) {
    return fd_ >= 0 && ::send(fd_, payload.data(), payload.size(), MSG_DONTWAIT | MSG_NOSIGNAL) ==
                           static_cast<ssize_t>(payload.size());
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

using Received = test::Received<v1::StepEvent>;

class IngestSeqpacketTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.empty()); }
  IngestServerOptions Options() {
    IngestServerOptions o;
    o.socket_path = dir_ + "/agent.sock";
    o.seqpacket_path = SeqpacketPathFor(o.socket_path);
    return o;
  }
  test::TempDir temp_dir_{"stepwatch-agent-test"};
  const std::string dir_ = temp_dir_.path();
};

TEST_F(IngestSeqpacketTest, EachPacketIsOneMessageWithTheSendersPid) {
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(server);
  EXPECT_EQ((*server)->seqpacket_path(), dir_ + "/agent.sock.seq");
  Connection c((*server)->seqpacket_path());
  ASSERT_TRUE(c.connected());
  // Sent back to back: a byte stream would merge them; packets keep them apart.
  ASSERT_TRUE(c.Send(Event("j", 1, 1)));
  ASSERT_TRUE(c.Send("not json"));
  ASSERT_TRUE(c.Send(Event("j", 1, 2)));
  ASSERT_TRUE(c.Send(std::string(kMaxDatagramBytes + 1, ' ')));
  ASSERT_TRUE(c.Send(Event("j", 1, 3)));
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().seqpacket_messages_total == 5; }));
  const IngestStats s = (*server)->stats();
  EXPECT_EQ(s.datagrams_total, 0u);
  EXPECT_EQ(s.events_accepted_total, 3u);
  EXPECT_EQ(s.rejected_total[static_cast<int>(RejectReason::kNotJson)], 1u);
  EXPECT_EQ(s.rejected_total[static_cast<int>(RejectReason::kTooLarge)], 1u);
  EXPECT_EQ(s.connections_accepted_total, 1u);
  EXPECT_EQ(s.connections_open, 1u);
  const std::vector<v1::StepEvent> events = received.items();
  ASSERT_EQ(events.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(events[i].step(), i + 1);
    EXPECT_EQ(events[i].pid(), ::getpid());
  }
  // The datagram socket still works beside it.
  ASSERT_TRUE(SendDatagram((*server)->socket_path(), Event("j", 1, 4)));
  ASSERT_TRUE(WaitFor([&] { return received.size() == 4; }));
}

TEST_F(IngestSeqpacketTest, SocketHasTheDatagramSocketsModeAndGroup) {
  IngestServerOptions o = Options();
  o.socket_group = 65534;
  o.socket_mode = 0620;
  Received received;
  auto server = IngestServer::Start(o, received.Sink());
  ASSERT_OK(server);
  struct stat st;
  ASSERT_EQ(::stat(o.seqpacket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0620u);
  EXPECT_EQ(st.st_gid, 65534u);
}

TEST_F(IngestSeqpacketTest, ARankIsBoundToTheProcessOnTheOtherEnd) {
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(server);
  const std::string path = (*server)->seqpacket_path();
  Connection mine(path);
  ASSERT_TRUE(mine.Send(Event("j", 1, 1)));  // this process now owns rank 1
  ASSERT_TRUE(WaitFor([&] { return received.size() == 1; }));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Another process forges rank 1 on a connection of its own, then reports rank 0; then it
    // sends on the connection it inherited from its parent: the sender, not the connection's
    // opener, is who reports.
    Connection own(path);
    const bool ok =
        own.Send(Event("j", 1, 2)) && own.Send(Event("j", 0, 2)) && mine.Send(Event("j", 1, 3));
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().seqpacket_messages_total == 4; }));
  EXPECT_EQ((*server)->stats().rejected_total[static_cast<int>(RejectReason::kNotOwner)], 2u);
  const std::vector<v1::StepEvent> events = received.items();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].rank(), 0);
  EXPECT_EQ(events[1].pid(), child);
}

TEST_F(IngestSeqpacketTest, ConnectionsOverTheCapAreRefusedAndCounted) {
  IngestServerOptions o = Options();
  o.max_connections = 2;
  Received received;
  auto server = IngestServer::Start(o, received.Sink());
  ASSERT_OK(server);
  Connection a(o.seqpacket_path);
  Connection b(o.seqpacket_path);
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().connections_open == 2; }));
  Connection c(o.seqpacket_path);  // the kernel completes it; the server closes it
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().connections_refused_total == 1; }));
  EXPECT_FALSE(c.Send(Event("j", 3, 1)));
  EXPECT_TRUE(a.Send(Event("j", 1, 1)));
  EXPECT_TRUE(b.Send(Event("j", 2, 1)));
  ASSERT_TRUE(WaitFor([&] { return received.size() == 2; }));
  // A closed connection frees its place.
  a.Close();
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().connections_open == 1; }));
  Connection d(o.seqpacket_path);
  ASSERT_TRUE(d.Send(Event("j", 4, 1)));
  ASSERT_TRUE(WaitFor([&] { return received.size() == 3; }));
  EXPECT_EQ((*server)->stats().connections_refused_total, 1u);
  EXPECT_EQ((*server)->stats().connections_accepted_total, 3u);
}

TEST_F(IngestSeqpacketTest, AClientThatReconnectsKeepsWorking) {
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(server);
  for (int round = 0; round < 5; ++round) {
    Connection c((*server)->seqpacket_path());
    ASSERT_TRUE(c.Send(Event("j", 1, round)));
    c.Close();  // queued packets are still read after the close
    ASSERT_TRUE(WaitFor([&] { return received.size() == static_cast<size_t>(round + 1); }));
    ASSERT_TRUE(WaitFor([&] { return (*server)->stats().connections_open == 0; }));
  }
  EXPECT_EQ((*server)->stats().connections_accepted_total, 5u);
  EXPECT_EQ((*server)->stats().receive_errors_total, 0u);
}

TEST_F(IngestSeqpacketTest, ABurstFromManyConnectionsLosesNothing) {
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(server);
  constexpr int kRanks = 64;
  constexpr int kSteps = 20;
  std::vector<std::unique_ptr<Connection>> connections;
  for (int r = 0; r < kRanks; ++r) {
    connections.push_back(std::make_unique<Connection>((*server)->seqpacket_path()));
    ASSERT_TRUE(connections.back()->connected());
  }
  std::atomic<int> ready{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      ready.fetch_add(1);
      while (ready.load() < kRanks) std::this_thread::yield();  // all start at once
      for (int s = 0; s < kSteps; ++s) {
        if (!connections[r]->Send(Event("burst", r, s))) failed.fetch_add(1);
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(failed.load(), 0);
  ASSERT_TRUE(WaitFor([&] { return received.size() == kRanks * kSteps; })) << received.size();
  std::vector<int> per_rank(kRanks, 0);
  for (const auto& e : received.items()) ++per_rank[e.rank()];
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(per_rank[r], kSteps) << "rank " << r;
}

TEST_F(IngestSeqpacketTest, ClientDropsAreCountedPerJobForAcceptedEventsOnly) {
  IngestServerOptions o = Options();
  o.max_drop_jobs = 2;
  Received received;
  auto server = IngestServer::Start(o, received.Sink());
  ASSERT_OK(server);
  Connection c(o.seqpacket_path);
  ASSERT_TRUE(c.Send(Event("a", 1, 1, R"(,"dropped":5)")));
  ASSERT_TRUE(SendDatagram(o.socket_path, Event("a", 1, 2, R"(,"dropped":2)")));
  ASSERT_TRUE(c.Send(Event("b", 1, 1)));  // an old client: no field
  // Rejected events count nothing: rank 64 is out of range.
  ASSERT_TRUE(c.Send(Event("b", 64, 1, R"(,"dropped":100)")));
  ASSERT_TRUE(WaitFor([&] {
    const IngestStats s = (*server)->stats();
    return s.seqpacket_messages_total + s.datagrams_total == 4;
  }));
  using Drops = std::vector<std::pair<std::string, uint64_t>>;
  EXPECT_EQ((*server)->stats().client_dropped_by_job, (Drops{{"a", 7}, {"b", 0}}));
  // A third job forgets the least recently seen one ("a"): the series stay bounded.
  ASSERT_TRUE(c.Send(Event("b", 1, 2, R"(,"dropped":1)")));
  ASSERT_TRUE(c.Send(Event("c", 1, 1, R"(,"dropped":3)")));
  ASSERT_TRUE(WaitFor([&] { return received.size() == 5; }));
  EXPECT_EQ((*server)->stats().client_dropped_by_job, (Drops{{"b", 1}, {"c", 3}}));
}

TEST_F(IngestSeqpacketTest, StopClosesConnectionsAndRemovesBothSockets) {
  Received received;
  auto server = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(server);
  Connection c((*server)->seqpacket_path());
  ASSERT_TRUE(c.Send(Event("j", 1, 1)));
  ASSERT_TRUE(WaitFor([&] { return received.size() == 1; }));
  const auto start = std::chrono::steady_clock::now();
  (*server)->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  struct stat st;
  EXPECT_NE(::stat(Options().seqpacket_path.c_str(), &st), 0);
  EXPECT_NE(::stat(Options().socket_path.c_str(), &st), 0);
  EXPECT_FALSE(c.Send(Event("j", 1, 2)));  // the server's end is closed
  EXPECT_FALSE(Connection(Options().seqpacket_path).connected());
}

TEST_F(IngestSeqpacketTest, StaleSocketIsReplacedAndALiveOneIsNot) {
  Received received;
  {
    // A seqpacket socket file nobody listens on, as a crashed agent leaves it.
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, Options().seqpacket_path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  auto first = IngestServer::Start(Options(), received.Sink());
  ASSERT_OK(first);
  // The datagram path is free but the seqpacket one is live: refused, and the first server's
  // sockets are left alone.
  IngestServerOptions o = Options();
  o.socket_path = dir_ + "/other.sock";
  auto second = IngestServer::Start(o, received.Sink());
  ASSERT_THAT(second, test::StatusIs(absl::StatusCode::kAlreadyExists));
  struct stat st;
  EXPECT_NE(::stat(o.socket_path.c_str(), &st), 0) << "nothing is left behind";
  Connection c((*first)->seqpacket_path());
  ASSERT_TRUE(c.Send(Event("j", 1, 1)));
  EXPECT_TRUE(WaitFor([&] { return received.size() == 1; }));
}

TEST_F(IngestSeqpacketTest, DerivedPathIsEmptyWhenItWouldNotFit) {
  EXPECT_EQ(SeqpacketPathFor("/run/stepwatch/agent.sock"), "/run/stepwatch/agent.sock.seq");
  EXPECT_EQ(SeqpacketPathFor("/" + std::string(102, 'x')), "/" + std::string(102, 'x') + ".seq");
  EXPECT_EQ(SeqpacketPathFor("/" + std::string(103, 'x')), "");
}

}  // namespace
}  // namespace stepwatch::agent
