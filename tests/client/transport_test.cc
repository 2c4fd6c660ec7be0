// The C++ client's choice of transport (the agent's seqpacket socket, else its datagram socket),
// its reconnects, and the "dropped" field that reports its own losses.
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/json.h"
#include "gtest/gtest.h"
#include "stepwatch/client.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch {
namespace {

int BindUnix(int type, const std::string& path) {
  const int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ::unlink(path.c_str());
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
  if (type == SOCK_SEQPACKET) {
    EXPECT_EQ(::listen(fd, 16), 0);
  }
  return fd;
}

// The next message on `fd`, or "" when none arrives within timeout_ms.
std::string RecvOn(int fd, int timeout_ms) {
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[65536];
  const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// An agent with a datagram socket and, optionally, the seqpacket socket beside it.
class FakeAgent {
 public:
  explicit FakeAgent(bool seqpacket) {
    char tmpl[] = "/tmp/sw-transport-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/agent.sock";
    dgram_ = BindUnix(SOCK_DGRAM, path_);
    if (seqpacket) listener_ = BindUnix(SOCK_SEQPACKET, path_ + ".seq");
  }
  ~FakeAgent() {
    CloseSeqpacket();
    ::close(dgram_);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  const std::string& path() const { return path_; }

  // The next message on the accepted connection (accepting it first), "" if none in time.
  std::string RecvSeqpacket(int timeout_ms = 5000) {
    if (conn_ < 0) {
      timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
      ::setsockopt(listener_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      conn_ = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn_ < 0) return "";
    }
    return RecvOn(conn_, timeout_ms);
  }
  std::string RecvDatagram(int timeout_ms = 5000) { return RecvOn(dgram_, timeout_ms); }
  std::vector<std::string> DrainSeqpacket() {
    std::vector<std::string> out;
    for (std::string s = RecvSeqpacket(50); !s.empty(); s = RecvSeqpacket(50)) out.push_back(s);
    return out;
  }
  // As a restarting agent: every connection and the listening socket go away...
  void CloseSeqpacket() {
    if (conn_ >= 0) ::close(conn_);
    if (listener_ >= 0) ::close(listener_);
    conn_ = listener_ = -1;
    ::unlink((path_ + ".seq").c_str());
  }
  // ...and come back.
  void ReopenSeqpacket() { listener_ = BindUnix(SOCK_SEQPACKET, path_ + ".seq"); }

 private:
  std::string dir_;
  std::string path_;
  int dgram_ = -1;
  int listener_ = -1;
  int conn_ = -1;
};

ReporterOptions Options(const FakeAgent& agent) {
  ReporterOptions o;
  o.job = "job1";
  o.rank = 1;
  o.world_size = 4;
  o.socket_path = agent.path();
  o.use_environment = false;
  o.background = false;
  o.warn_on_stderr = false;
  o.reconnect_interval = std::chrono::milliseconds(0);
  return o;
}

StepRecord Step(int64_t step) {
  StepRecord r;
  r.step = step;
  r.step_s = 0.5;
  return r;
}

// The "dropped" field of a message; -1 when absent.
int64_t DroppedField(const std::string& text) {
  auto parsed = json::Parse(text);
  EXPECT_OK(parsed) << text;
  if (!parsed.ok()) return -2;
  const json::Value* d = parsed->Find("dropped");
  return d == nullptr ? -1 : d->as_int64();
}

int64_t StepField(const std::string& text) {
  auto parsed = json::Parse(text);
  return parsed.ok() && parsed->Find("step") ? parsed->Find("step")->as_int64() : -1;
}

TEST(ClientTransportTest, UsesTheSeqpacketSocketWhenTheAgentHasOne) {
  FakeAgent agent(/*seqpacket=*/true);
  Reporter reporter(Options(agent));
  EXPECT_EQ(reporter.transport(), Transport::kNone);  // connects lazily
  ASSERT_TRUE(reporter.Send(Step(3)));
  EXPECT_EQ(reporter.transport(), Transport::kSeqpacket);
  const std::string text = agent.RecvSeqpacket();
  EXPECT_EQ(text, R"({"job":"job1","rank":1,"world_size":4,"step":3,"step_s":0.5})");
  EXPECT_EQ(agent.RecvDatagram(50), "");
}

TEST(ClientTransportTest, FallsBackToDatagramsForAnOlderAgent) {
  FakeAgent agent(/*seqpacket=*/false);
  Reporter reporter(Options(agent));
  ASSERT_TRUE(reporter.Send(Step(4)));
  EXPECT_EQ(reporter.transport(), Transport::kDatagram);
  EXPECT_EQ(StepField(agent.RecvDatagram()), 4);
}

TEST(ClientTransportTest, ReconnectsWhenTheAgentRestartsAndReportsTheLoss) {
  FakeAgent agent(/*seqpacket=*/true);
  Reporter reporter(Options(agent));
  ASSERT_TRUE(reporter.Send(Step(0)));
  ASSERT_EQ(StepField(agent.RecvSeqpacket()), 0);
  agent.CloseSeqpacket();
  // The connection is gone: the event is dropped (EPIPE), counted, and the next one reconnects.
  EXPECT_FALSE(reporter.Send(Step(1)));
  EXPECT_EQ(reporter.dropped(), 1u);
  agent.ReopenSeqpacket();
  ASSERT_TRUE(reporter.Send(Step(2)));
  EXPECT_EQ(reporter.transport(), Transport::kSeqpacket);
  const std::string text = agent.RecvSeqpacket();
  EXPECT_EQ(StepField(text), 2);
  EXPECT_EQ(DroppedField(text), 1);
  // Reported once: the next message has no field.
  ASSERT_TRUE(reporter.Send(Step(3)));
  EXPECT_EQ(DroppedField(agent.RecvSeqpacket()), -1);
}

TEST(ClientTransportTest, AFullConnectionDropsWithoutBlockingAndReportsTheDrops) {
  FakeAgent agent(/*seqpacket=*/true);
  Reporter reporter(Options(agent));
  // The agent reads nothing: the connection's buffer fills and sends fail with EAGAIN.
  const auto start = std::chrono::steady_clock::now();
  int64_t step = 0;
  for (; step < 200000 && reporter.dropped() < 100; ++step) reporter.Send(Step(step));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ASSERT_GE(reporter.dropped(), 100u);
  EXPECT_EQ(reporter.sent() + reporter.dropped(), static_cast<uint64_t>(step));
  const uint64_t sent_before = reporter.sent();
  const std::vector<std::string> queued = agent.DrainSeqpacket();
  EXPECT_EQ(queued.size(), sent_before);
  // The next message that leaves tells how many were lost since the previous one that left.
  ASSERT_TRUE(reporter.Send(Step(step)));
  const std::string text = agent.RecvSeqpacket();
  EXPECT_EQ(StepField(text), step);
  EXPECT_EQ(DroppedField(text), static_cast<int64_t>(reporter.dropped()));
}

TEST(ClientTransportTest, DatagramDropsAreReportedToo) {
  FakeAgent agent(/*seqpacket=*/false);
  Reporter reporter(Options(agent));
  int64_t step = 0;
  for (; step < 100000 && reporter.dropped() < 5; ++step) reporter.Send(Step(step));
  ASSERT_GE(reporter.dropped(), 5u);
  while (!agent.RecvDatagram(50).empty()) {
  }
  ASSERT_TRUE(reporter.Send(Step(step)));
  EXPECT_EQ(DroppedField(agent.RecvDatagram()), static_cast<int64_t>(reporter.dropped()));
}

}  // namespace
}  // namespace stepwatch
