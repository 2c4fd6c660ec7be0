#include "stepwatch/client.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch {
namespace {

// A bound Unix datagram socket in a fresh directory: stands in for the agent.
class FakeAgent {
 public:
  FakeAgent() {
    char tmpl[] = "/tmp/sw-client-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/agent.sock";
    Bind();
  }
  ~FakeAgent() {
    Unbind();
    ::rmdir(dir_.c_str());
  }

  void Bind() {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path_.c_str());
    ::unlink(path_.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  void Unbind() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ::unlink(path_.c_str());
  }

  // The next datagram, or "" when none arrives within timeout_ms.
  std::string Recv(int timeout_ms = 5000) {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, n) : std::string();
  }
  // Every datagram queued now.
  std::vector<std::string> Drain() {
    std::vector<std::string> out;
    for (std::string s = Recv(50); !s.empty(); s = Recv(50)) out.push_back(s);
    return out;
  }

  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
  int fd_ = -1;
};

json::Value ParseEvent(const std::string& text) {
  auto parsed = json::Parse(text);
  EXPECT_OK(parsed) << " in " << text;
  return parsed.ok() ? *parsed : json::Value();
}

ReporterOptions Options(const FakeAgent& agent, bool background = false) {
  ReporterOptions o;
  o.job = "job1";
  o.rank = 1;
  o.world_size = 4;
  o.socket_path = agent.path();
  o.use_environment = false;
  o.background = background;
  o.warn_on_stderr = false;
  return o;
}

TEST(ClientReporterTest, SendsTheDocumentedJson) {
  FakeAgent agent;
  ReporterOptions o = Options(agent);
  o.local_rank = 1;
  o.gpu = 2;
  o.dp_rank = 1;
  o.pp_stage = 0;
  o.tp_rank = 3;
  Reporter reporter(o);
  ASSERT_TRUE(reporter.ok()) << reporter.error();
  StepRecord r;
  r.step = 7;
  r.step_s = 0.25;
  r.data_s = 0.01;
  r.compute_s = 0.2;
  r.comm_s = 0.04;
  r.samples = 64;
  EXPECT_TRUE(reporter.Send(r));
  const std::string text = agent.Recv();
  EXPECT_EQ(text,
            R"({"job":"job1","rank":1,"world_size":4,"local_rank":1,"gpu":2,"dp_rank":1,)"
            R"("pp_stage":0,"tp_rank":3,"step":7,"step_s":0.25,"data_s":0.01,"compute_s":0.2,)"
            R"("comm_s":0.04,"samples":64})");
  json::Value v = ParseEvent(text);
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.Find("step")->as_int64(), 7);
  EXPECT_DOUBLE_EQ(v.Find("compute_s")->as_double(), 0.2);
  EXPECT_EQ(reporter.sent(), 1u);
  EXPECT_EQ(reporter.dropped(), 0u);
}

TEST(ClientReporterTest, LeavesOutAbsentFieldsAndRoundTripsDoubles) {
  FakeAgent agent;
  Reporter reporter(Options(agent));
  StepRecord r;
  r.step = 0;
  r.step_s = 1.0 / 3.0;
  ASSERT_TRUE(reporter.Send(r));
  json::Value v = ParseEvent(agent.Recv());
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.as_object().size(), 5u);
  EXPECT_EQ(v.Find("data_s"), nullptr);
  EXPECT_EQ(v.Find("samples"), nullptr);
  EXPECT_EQ(v.Find("step_s")->as_double(), 1.0 / 3.0);  // shortest form, exact round trip
}

TEST(ClientReporterTest, EscapesTheJobId) {
  FakeAgent agent;
  ReporterOptions o = Options(agent);
  o.job = "a \"quoted\"\\job/mod\xc3\xa8le";
  Reporter reporter(o);
  StepRecord r;
  r.step_s = 0.5;
  ASSERT_TRUE(reporter.Send(r));
  json::Value v = ParseEvent(agent.Recv());
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.Find("job")->as_string(), o.job);
  // Control characters the agent would refuse (docs/step-event.md): refused here, said why.
  o.job = std::string("job\n\x01", 5);
  Reporter refused(o);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error().find("control character"), std::string::npos) << refused.error();
}

TEST(ClientReporterTest, DropsInvalidRecordsWithoutSending) {
  FakeAgent agent;
  Reporter reporter(Options(agent));
  auto record = [](double step_s) {
    StepRecord r;
    r.step = 1;
    r.step_s = step_s;
    return r;
  };
  EXPECT_FALSE(reporter.Send(record(0)));
  EXPECT_FALSE(reporter.Send(record(std::nan(""))));
  EXPECT_FALSE(reporter.Send(record(INFINITY)));
  StepRecord r = record(0.1);
  r.step = -1;
  EXPECT_FALSE(reporter.Send(r));
  r = record(0.1);
  r.data_s = -0.5;
  EXPECT_FALSE(reporter.Send(r));
  r = record(0.1);
  r.comm_s = std::nan("");
  EXPECT_FALSE(reporter.Send(r));
  r = record(0.1);
  r.samples = -3;
  EXPECT_FALSE(reporter.Send(r));
  EXPECT_EQ(reporter.dropped(), 7u);
  EXPECT_EQ(reporter.sent(), 0u);
  EXPECT_NE(reporter.last_error().find("invalid"), std::string::npos);
  EXPECT_EQ(agent.Recv(50), "");
}

TEST(ClientReporterTest, AbsentAgentDropsCountsAndWarnsOnce) {
  FakeAgent agent;
  agent.Unbind();
  ReporterOptions o = Options(agent);
  o.warn_on_stderr = true;
  o.reconnect_interval = std::chrono::milliseconds(0);
  testing::internal::CaptureStderr();
  {
    Reporter reporter(o);
    StepRecord r;
    r.step_s = 0.1;
    for (int i = 0; i < 20; ++i) EXPECT_FALSE(reporter.Send(r));
    EXPECT_EQ(reporter.dropped(), 20u);
    EXPECT_NE(reporter.last_error().find(agent.path()), std::string::npos) << reporter.last_error();
  }
  const std::string err = testing::internal::GetCapturedStderr();
  size_t count = 0;
  for (size_t pos = err.find("stepwatch:"); pos != std::string::npos;
       pos = err.find("stepwatch:", pos + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 1u) << err;
}

TEST(ClientReporterTest, RateLimitsConnectAttempts) {
  FakeAgent agent;
  agent.Unbind();
  ReporterOptions o = Options(agent);
  o.reconnect_interval = std::chrono::hours(1);
  Reporter reporter(o);
  StepRecord r;
  r.step_s = 0.1;
  EXPECT_FALSE(reporter.Send(r));
  agent.Bind();
  // The agent is back, but the next attempt is an hour away: dropped, not sent.
  EXPECT_FALSE(reporter.Send(r));
  EXPECT_EQ(reporter.dropped(), 2u);
  EXPECT_EQ(agent.Recv(50), "");
}

TEST(ClientReporterTest, ReconnectsAfterAgentRestart) {
  FakeAgent agent;
  ReporterOptions o = Options(agent);
  o.reconnect_interval = std::chrono::milliseconds(10);
  Reporter reporter(o);
  StepRecord r;
  r.step_s = 0.1;
  ASSERT_TRUE(reporter.Send(r));
  EXPECT_FALSE(agent.Recv().empty());
  agent.Unbind();
  agent.Bind();
  bool delivered = false;
  for (int i = 0; i < 500 && !delivered; ++i) {
    r.step = i + 1;
    delivered = reporter.Send(r);
    if (!delivered) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(delivered);
  json::Value v = ParseEvent(agent.Recv());
  EXPECT_EQ(v.Find("step")->as_int64(), r.step);
  EXPECT_GE(reporter.dropped(), 1u);
}

TEST(ClientReporterTest, FullAgentQueueNeverBlocks) {
  FakeAgent agent;  // reads nothing until the end
  Reporter reporter(Options(agent));
  StepRecord r;
  r.step_s = 0.1;
  const int n = 5000;
  for (int i = 0; i < n; ++i) {
    r.step = i;
    reporter.Send(r);
  }
  EXPECT_EQ(reporter.sent() + reporter.dropped(), static_cast<uint64_t>(n));
  EXPECT_GT(reporter.dropped(), 0u);
  EXPECT_GT(reporter.sent(), 0u);
  std::vector<std::string> got = agent.Drain();
  ASSERT_EQ(got.size(), reporter.sent());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(ParseEvent(got[i]).Find("step")->as_int64(), static_cast<int64_t>(i));
  }
}

TEST(ClientReporterTest, BackgroundSenderDeliversInOrder) {
  FakeAgent agent;
  ReporterOptions o = Options(agent, /*background=*/true);
  o.flush_interval = std::chrono::milliseconds(1);
  Reporter reporter(o);
  ASSERT_TRUE(reporter.background());
  std::vector<std::string> got;
  StepRecord r;
  r.step_s = 0.1;
  // In rounds below the agent socket's queue length, so nothing is lost to a full socket.
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < 5; ++i) {
      r.step = round * 5 + i;
      EXPECT_TRUE(reporter.Send(r));
    }
    EXPECT_TRUE(reporter.Flush());
    for (std::string s : agent.Drain()) got.push_back(s);
  }
  ASSERT_EQ(got.size(), 50u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(ParseEvent(got[i]).Find("step")->as_int64(), static_cast<int64_t>(i));
  }
  EXPECT_EQ(reporter.sent(), 50u);
}

TEST(ClientReporterTest, DestructorSendsWhatIsQueued) {
  FakeAgent agent;
  {
    ReporterOptions o = Options(agent, /*background=*/true);
    o.flush_interval = std::chrono::hours(1);  // only the destructor sends
    Reporter reporter(o);
    StepRecord r;
    r.step_s = 0.1;
    for (int i = 0; i < 5; ++i) reporter.Send(r);
    EXPECT_EQ(reporter.sent(), 0u);
  }
  EXPECT_EQ(agent.Drain().size(), 5u);
}

TEST(ClientReporterTest, FullClientQueueDrops) {
  FakeAgent agent;
  agent.Unbind();  // every send fails fast
  ReporterOptions o = Options(agent, /*background=*/true);
  o.queue_capacity = 2;
  Reporter reporter(o);
  StepRecord r;
  r.step_s = 0.1;
  const int n = 10000;
  int accepted = 0;
  for (int i = 0; i < n; ++i) accepted += reporter.Send(r) ? 1 : 0;
  EXPECT_TRUE(reporter.Flush());
  // Accepted events were dropped by the sender (no agent); the rest by the full queue.
  EXPECT_EQ(reporter.dropped(), static_cast<uint64_t>(n));
  EXPECT_LT(accepted, n);
  EXPECT_EQ(reporter.sent(), 0u);
}

TEST(ClientReporterTest, ConcurrentSendersLoseNothingSilently) {
  FakeAgent agent;
  Reporter reporter(Options(agent, /*background=*/true));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> received{0};
  std::thread reader([&] {
    while (!stop.load()) {
      if (!agent.Recv(20).empty()) received.fetch_add(1);
    }
    received.fetch_add(agent.Drain().size());
  });
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t) {
    senders.emplace_back([&reporter, t] {
      StepRecord r;
      r.step_s = 0.1;
      for (int i = 0; i < 1000; ++i) {
        r.step = t * 1000 + i;
        reporter.Send(r);
      }
    });
  }
  for (auto& s : senders) s.join();
  EXPECT_TRUE(reporter.Flush(std::chrono::seconds(10)));
  const uint64_t sent = reporter.sent();
  for (int i = 0; i < 500 && received.load() < sent; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop.store(true);
  reader.join();
  EXPECT_EQ(sent + reporter.dropped(), 4000u);
  EXPECT_EQ(received.load(), sent);
}

// comm_s is exposed communication: a collective running on another thread while the step computes
// costs the step nothing; only the time the step then waits for it is comm_s.
TEST(ClientScopeTest, CommIsTheWaitNotTheOverlappedCollective) {
  FakeAgent agent;
  Reporter reporter(Options(agent));
  using std::chrono::milliseconds;
  for (const bool overlapped : {true, false}) {
    std::atomic<bool> done{false};
    {
      StepScope step(reporter);
      std::thread collective([&done] {
        std::this_thread::sleep_for(milliseconds(200));
        done = true;
      });
      {
        PhaseScope compute(step, Phase::kCompute);
        std::this_thread::sleep_for(milliseconds(overlapped ? 300 : 20));
      }
      {
        PhaseScope comm(step, Phase::kComm);
        collective.join();  // the step blocks here until the collective is done
      }
    }
    ASSERT_TRUE(done);
    json::Value v = ParseEvent(agent.Recv());
    ASSERT_TRUE(v.is_object());
    const double comm_s = v.Find("comm_s") != nullptr ? v.Find("comm_s")->as_double() : 0;
    if (overlapped) {
      EXPECT_LT(comm_s, 0.1);
      EXPECT_GE(v.Find("compute_s")->as_double(), 0.3);
    } else {
      EXPECT_GT(comm_s, 0.15);
    }
  }
}

TEST(ClientScopeTest, TimesStepAndNestedPhases) {
  FakeAgent agent;
  Reporter reporter(Options(agent));
  using std::chrono::milliseconds;
  {
    StepScope step(reporter, /*samples=*/32);
    {
      PhaseScope data(step, Phase::kData);
      std::this_thread::sleep_for(milliseconds(10));
    }
    PhaseScope compute(step, Phase::kCompute);
    std::this_thread::sleep_for(milliseconds(10));
    {
      PhaseScope comm(step, Phase::kComm);
      std::this_thread::sleep_for(milliseconds(20));
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  json::Value v = ParseEvent(agent.Recv());
  ASSERT_TRUE(v.is_object());
  const double step_s = v.Find("step_s")->as_double();
  const double data_s = v.Find("data_s")->as_double();
  const double compute_s = v.Find("compute_s")->as_double();
  const double comm_s = v.Find("comm_s")->as_double();
  EXPECT_EQ(v.Find("step")->as_int64(), 0);
  EXPECT_EQ(v.Find("samples")->as_int64(), 32);
  EXPECT_GE(data_s, 0.010);
  EXPECT_GE(compute_s, 0.020);
  EXPECT_GE(comm_s, 0.020);
  // Communication inside compute is not compute: the phases partition the step.
  EXPECT_LE(data_s + compute_s + comm_s, step_s + 1e-9);
  EXPECT_LT(compute_s, step_s - comm_s - data_s + 1e-9);
}

TEST(ClientScopeTest, NumbersStepsAndCancels) {
  FakeAgent agent;
  Reporter reporter(Options(agent));
  for (int i = 0; i < 3; ++i) StepScope step(reporter);
  { StepScope step(reporter, /*step=*/100, /*samples=*/-1); }
  {
    StepScope step(reporter);
    step.Cancel();
  }
  { StepScope step(reporter); }
  std::vector<int64_t> steps;
  for (const std::string& s : agent.Drain()) {
    json::Value v = ParseEvent(s);
    steps.push_back(v.Find("step")->as_int64());
    EXPECT_EQ(v.Find("data_s"), nullptr);
    EXPECT_EQ(v.Find("samples"), nullptr);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 100, 101}));
}

TEST(ClientReporterTest, SerialisesSections) {
  FakeAgent agent;
  Reporter reporter(Options(agent));
  const int forward = reporter.SectionId("forward");
  const int backward = reporter.SectionId("backward");
  EXPECT_EQ(forward, 0);
  EXPECT_EQ(backward, 1);
  EXPECT_EQ(reporter.SectionId("forward"), 0);  // registered once
  StepRecord r;
  r.step = 7;
  r.step_s = 0.25;
  r.compute_s = 0.2;
  r.samples = 64;
  r.SetSection(backward, 0.02);
  r.SetSection(forward, 0.012);
  ASSERT_TRUE(reporter.Send(r));
  const std::string text = agent.Recv();
  EXPECT_EQ(text, R"({"job":"job1","rank":1,"world_size":4,"step":7,"step_s":0.25,"compute_s":0.2,)"
                  R"("samples":64,"sections":{"forward":0.012,"backward":0.02}})");
  json::Value v = ParseEvent(text);
  ASSERT_TRUE(v.is_object());
  EXPECT_DOUBLE_EQ(v.Find("sections")->Find("backward")->as_double(), 0.02);
  // A record without sections has no "sections" member.
  StepRecord plain;
  plain.step = 8;
  plain.step_s = 0.25;
  ASSERT_TRUE(reporter.Send(plain));
  EXPECT_EQ(ParseEvent(agent.Recv()).Find("sections"), nullptr);
  EXPECT_EQ(reporter.dropped(), 0u);
}

TEST(ClientReporterTest, SectionNamesFollowTheRules) {
  for (const char* ok : {"forward", "Data", "layer_1.attn:qkv/fwd-0", "x"}) {
    EXPECT_EQ(ValidateSectionName(ok), nullptr) << ok;
  }
  EXPECT_EQ(ValidateSectionName(std::string(kMaxSectionNameBytes, 'n')), nullptr);
  for (const std::string& bad :
       {std::string(), std::string(kMaxSectionNameBytes + 1, 'n'), std::string("a b"),
        std::string("fwd\""), std::string("r\xc3\xa9"), std::string("a\0b", 3), std::string("data"),
        std::string("compute"), std::string("comm")}) {
    EXPECT_NE(ValidateSectionName(bad), nullptr) << bad;
  }
  FakeAgent agent;
  Reporter reporter(Options(agent));
  const char* why = nullptr;
  EXPECT_EQ(reporter.SectionId("a b", &why), -1);
  EXPECT_STREQ(why, "section name has a character other than A-Za-z0-9_.:/-");
  EXPECT_EQ(reporter.SectionId("comm", &why), -1);
  for (int i = 0; i < kMaxSections; ++i) {
    EXPECT_EQ(reporter.SectionId("s" + std::to_string(i)), i);
  }
  EXPECT_EQ(reporter.SectionId("one-more", &why), -1);
  EXPECT_STREQ(why, "more than 16 section names on one reporter");
  EXPECT_EQ(reporter.SectionId("s3"), 3);  // the registered ones still work
  EXPECT_EQ(reporter.section_count(), kMaxSections);
  EXPECT_EQ(reporter.section_name(15), "s15");
}

TEST(ClientReporterTest, DropsRecordsWithBadSections) {
  FakeAgent agent;
  Reporter reporter(Options(agent));
  const int id = reporter.SectionId("forward");
  for (double bad : {-0.001, std::nan(""), HUGE_VAL, kMaxSeconds * 2}) {
    StepRecord r;
    r.step_s = 0.1;
    r.SetSection(id, bad);
    EXPECT_NE(ValidateStepRecord(r), nullptr) << bad;
    EXPECT_FALSE(reporter.Send(r)) << bad;
  }
  StepRecord unknown;
  unknown.step_s = 0.1;
  unknown.SetSection(5, 0.01);  // never given out by this reporter
  EXPECT_FALSE(reporter.Send(unknown));
  EXPECT_EQ(reporter.dropped(), 5u);
  EXPECT_EQ(agent.Recv(100), "");
  StepRecord edge;
  edge.step_s = 0.1;
  edge.SetSection(id, kMaxSeconds);
  edge.SetSection(-1, 1);  // ignored
  edge.SetSection(kMaxSections, 1);
  EXPECT_TRUE(reporter.Send(edge));
}

// Named sections count as compute unless inside data or comm; a section's own time leaves out the
// data and comm phases inside it; uses of one name add up; the phases still partition the step.
TEST(ClientScopeTest, SectionsCountAsComputeAndLeaveOutPhasesInsideThem) {
  FakeAgent agent;
  Reporter reporter(Options(agent));
  using std::chrono::milliseconds;
  {
    StepScope step(reporter);
    {
      PhaseScope forward(step, "forward");
      EXPECT_TRUE(forward.ok());
      std::this_thread::sleep_for(milliseconds(20));
    }
    {
      PhaseScope backward(step, std::string("backward"));
      std::this_thread::sleep_for(milliseconds(10));
      {
        PhaseScope comm(step, Phase::kComm);  // waiting for other ranks: not backward
        std::this_thread::sleep_for(milliseconds(30));
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    {
      PhaseScope data(step, "data");  // the built-in phase by name
      PhaseScope load(step, "load");  // a section inside data: data time, and its own
      std::this_thread::sleep_for(milliseconds(10));
    }
    {
      PhaseScope backward(step, "backward");  // again: adds up
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  json::Value v = ParseEvent(agent.Recv());
  ASSERT_TRUE(v.is_object());
  const json::Value* sections = v.Find("sections");
  ASSERT_NE(sections, nullptr);
  ASSERT_EQ(sections->as_object().size(), 3u);
  const double forward = sections->Find("forward")->as_double();
  const double backward = sections->Find("backward")->as_double();
  const double load = sections->Find("load")->as_double();
  const double compute_s = v.Find("compute_s")->as_double();
  const double comm_s = v.Find("comm_s")->as_double();
  const double data_s = v.Find("data_s")->as_double();
  const double step_s = v.Find("step_s")->as_double();
  EXPECT_GE(forward, 0.020);
  EXPECT_GE(backward, 0.030);
  EXPECT_GE(comm_s, 0.030);
  EXPECT_GE(load, 0.010);
  // All compute was inside the two sections, and their times are exactly that compute: a
  // backward that held its comm phase would exceed it.
  EXPECT_NEAR(compute_s, forward + backward, 1e-6);
  // The section inside data is data time (all of it but the moments before and after it).
  EXPECT_LE(load, data_s + 1e-9);
  EXPECT_GT(load, data_s - 0.002);
  EXPECT_LE(data_s + compute_s + comm_s, step_s + 1e-9);
}

TEST(ClientScopeTest, SectionInsideItselfCountsOnceAndBadNamesTimeNothing) {
  FakeAgent agent;
  Reporter reporter(Options(agent));
  using std::chrono::milliseconds;
  {
    StepScope step(reporter);
    PhaseScope outer(step, "fwd");
    {
      PhaseScope inner(step, "fwd");
      EXPECT_TRUE(inner.ok());
      std::this_thread::sleep_for(milliseconds(20));
    }
    PhaseScope bad(step, "not a name");
    EXPECT_FALSE(bad.ok());
    PhaseScope reserved(step, std::string_view("comm\0", 5));
    EXPECT_FALSE(reserved.ok());
  }
  json::Value v = ParseEvent(agent.Recv());
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.Find("sections")->as_object().size(), 1u);
  EXPECT_NEAR(v.Find("sections")->Find("fwd")->as_double(), v.Find("compute_s")->as_double(), 1e-6);
  EXPECT_GE(v.Find("compute_s")->as_double(), 0.020);
  EXPECT_EQ(v.Find("comm_s"), nullptr);
  EXPECT_EQ(reporter.section_count(), 1);
  EXPECT_EQ(reporter.dropped(), 0u);  // a refused name drops nothing

  // Without sections in a step, the event has none, even though the reporter knows some.
  { StepScope step(reporter); }
  EXPECT_EQ(ParseEvent(agent.Recv()).Find("sections"), nullptr);
}

// Sets environment variables for one test and restores them.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : kNames) {
      const char* old = std::getenv(name);
      saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }

 private:
  static constexpr const char* kNames[] = {
      "RANK",         "WORLD_SIZE",         "LOCAL_RANK",   "STEPWATCH_JOB", "STEPWATCH_SOCKET",
      "SLURM_JOB_ID", "SLURM_PROCID",       "SLURM_NTASKS", "SLURM_LOCALID", "MASTER_ADDR",
      "MASTER_PORT",  "TORCHELASTIC_RUN_ID"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

ReporterOptions EnvOptions() {
  ReporterOptions o;
  o.background = false;
  o.warn_on_stderr = false;
  return o;
}

TEST(ClientEnvironmentTest, PlainTorchLaunch) {
  FakeAgent agent;
  ScopedEnv env({{"RANK", "3"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"},
                 {"MASTER_ADDR", "10.0.0.1"},
                 {"MASTER_PORT", "29500"},
                 {"STEPWATCH_SOCKET", agent.path().c_str()}});
  Reporter reporter(EnvOptions());
  ASSERT_TRUE(reporter.ok()) << reporter.error();
  EXPECT_EQ(reporter.job(), "torch-10.0.0.1-29500");
  EXPECT_EQ(reporter.rank(), 3);
  EXPECT_EQ(reporter.world_size(), 8);
  EXPECT_EQ(reporter.socket_path(), agent.path());
  StepRecord r;
  r.step_s = 0.1;
  ASSERT_TRUE(reporter.Send(r));
  json::Value v = ParseEvent(agent.Recv());
  EXPECT_EQ(v.Find("local_rank")->as_int64(), 1);
  EXPECT_EQ(v.Find("rank")->as_int64(), 3);
}

TEST(ClientEnvironmentTest, JobIdPrecedence) {
  {
    ScopedEnv env({{"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"TORCHELASTIC_RUN_ID", "run42"},
                   {"SLURM_JOB_ID", "9"}});
    EXPECT_EQ(Reporter(EnvOptions()).job(), "run42");
  }
  {
    ScopedEnv env({{"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"TORCHELASTIC_RUN_ID", "none"},
                   {"SLURM_JOB_ID", "9"}});
    EXPECT_EQ(Reporter(EnvOptions()).job(), "slurm-9");
  }
  {
    ScopedEnv env({{"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"TORCHELASTIC_RUN_ID", "run42"},
                   {"STEPWATCH_JOB", "mine"}});
    EXPECT_EQ(Reporter(EnvOptions()).job(), "mine");
    ReporterOptions o = EnvOptions();
    o.job = "explicit";
    EXPECT_EQ(Reporter(o).job(), "explicit");
  }
  {
    ScopedEnv env({{"SLURM_JOB_ID", "5"}, {"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "16"}});
    Reporter reporter(EnvOptions());
    EXPECT_EQ(reporter.rank(), 6);
    EXPECT_EQ(reporter.world_size(), 16);
  }
  {
    ScopedEnv env({});
    Reporter reporter(EnvOptions());
    EXPECT_TRUE(reporter.ok());
    EXPECT_EQ(reporter.job().rfind("local-", 0), 0u) << reporter.job();
    EXPECT_EQ(reporter.socket_path(), kDefaultSocketPath);
  }
}

TEST(ClientEnvironmentTest, InvalidIdentityDisablesWithAClearError) {
  {
    ScopedEnv env({{"RANK", "abc"}, {"WORLD_SIZE", "2"}, {"STEPWATCH_JOB", "j"}});
    Reporter reporter(EnvOptions());
    EXPECT_FALSE(reporter.ok());
    EXPECT_NE(reporter.error().find("RANK"), std::string::npos) << reporter.error();
    StepRecord r;
    r.step_s = 0.1;
    EXPECT_FALSE(reporter.Send(r));
    EXPECT_EQ(reporter.dropped(), 1u);
  }
  {
    ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"STEPWATCH_JOB", "j"}});
    Reporter reporter(EnvOptions());
    EXPECT_FALSE(reporter.ok());
    EXPECT_NE(reporter.error().find("not below"), std::string::npos) << reporter.error();
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
    Reporter reporter(EnvOptions());
    EXPECT_FALSE(reporter.ok());
    EXPECT_NE(reporter.error().find("STEPWATCH_JOB"), std::string::npos) << reporter.error();
  }
}

}  // namespace
}  // namespace stepwatch
