// The walk down a job's owners (AskOwners), with a scripted ask in place of gRPC; and
// CollectorClients against in-process Query servers: large replies, a dead collector, the token.
#include "ctl/fanout.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stepwatch::ctl {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

enum class Says { kKnows, kUnknown, kNotFound, kDown };

struct Script {
  std::map<std::string, Says> says;
  std::vector<std::vector<std::string>> rounds;  // what was asked, round by round

  std::vector<Answer<int>> operator()(const std::vector<std::string>& round) {
    rounds.push_back(round);
    std::vector<Answer<int>> out;
    for (const std::string& c : round) {
      Answer<int>& a = out.emplace_back();
      a.collector = c;
      switch (says.at(c)) {
        case Says::kKnows:
          a.response = 1;
          break;
        case Says::kUnknown:
          a.job_known = false;
          break;
        case Says::kNotFound:
          a.status = grpc::Status(grpc::StatusCode::NOT_FOUND, "no job named \"j\"");
          break;
        case Says::kDown:
          a.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused");
          break;
      }
    }
    return out;
  }
};

std::vector<std::string> Names(const std::vector<Answer<int>>& answers) {
  std::vector<std::string> out;
  for (const auto& a : answers) out.push_back(a.collector);
  return out;
}

OwnersAnswers<int> Walk(Script* script, const std::vector<std::string>& order, int replicas) {
  return AskOwners<int>(order, replicas, [script](const std::vector<std::string>& round) {
    return (*script)(round);
  });
}

TEST(AskOwnersTest, TheFirstROwnersAtOnceWhenTheyKnowTheJob) {
  Script s{{{"a", Says::kKnows}, {"b", Says::kKnows}, {"c", Says::kKnows}}, {}};
  const OwnersAnswers<int> got = Walk(&s, {"b", "a", "c"}, 2);
  EXPECT_THAT(s.rounds, ElementsAre(ElementsAre("b", "a")));
  EXPECT_THAT(Names(got.known), ElementsAre("b", "a"));
  EXPECT_THAT(got.failed, IsEmpty());
}

TEST(AskOwnersTest, GoesOnDownTheOrderPastADownOwner) {
  Script s{{{"a", Says::kDown}, {"b", Says::kKnows}, {"c", Says::kKnows}}, {}};
  const OwnersAnswers<int> got = Walk(&s, {"a", "b", "c"}, 2);
  EXPECT_THAT(s.rounds, ElementsAre(ElementsAre("a", "b"), ElementsAre("c")));
  EXPECT_THAT(Names(got.known), ElementsAre("b", "c"));
  EXPECT_THAT(Names(got.failed), ElementsAre("a"));
}

TEST(AskOwnersTest, PastOwnersThatDoNotKnowTheJobEitherWay) {
  Script s{
      {{"a", Says::kNotFound}, {"b", Says::kUnknown}, {"c", Says::kKnows}, {"d", Says::kKnows}},
      {}};
  const OwnersAnswers<int> got = Walk(&s, {"a", "b", "c", "d"}, 2);
  EXPECT_THAT(s.rounds, ElementsAre(ElementsAre("a", "b"), ElementsAre("c", "d")));
  EXPECT_THAT(Names(got.known), ElementsAre("c", "d"));
  EXPECT_THAT(Names(got.unknown), ElementsAre("a", "b"));
  EXPECT_THAT(got.failed, IsEmpty());
}

TEST(AskOwnersTest, StopsAtTheEndOfTheOrder) {
  Script s{{{"a", Says::kDown}, {"b", Says::kNotFound}, {"c", Says::kKnows}}, {}};
  const OwnersAnswers<int> got = Walk(&s, {"a", "b", "c"}, 3);
  EXPECT_THAT(s.rounds, ElementsAre(ElementsAre("a", "b", "c")));
  EXPECT_THAT(Names(got.known), ElementsAre("c"));
  EXPECT_THAT(Names(got.unknown), ElementsAre("b"));
  EXPECT_THAT(Names(got.failed), ElementsAre("a"));
}

TEST(AskOwnersTest, NobodyAnswers) {
  Script s{{{"a", Says::kDown}, {"b", Says::kDown}}, {}};
  const OwnersAnswers<int> got = Walk(&s, {"a", "b"}, 1);
  EXPECT_THAT(s.rounds, ElementsAre(ElementsAre("a"), ElementsAre("b")));
  EXPECT_THAT(got.known, IsEmpty());
  EXPECT_THAT(Names(got.failed), ElementsAre("a", "b"));
}

// A collector's Query service answering explain with a job of `ranks` ranks.
class FakeQuery final : public v1::Query::Service {
 public:
  explicit FakeQuery(int ranks) : ranks_(ranks) {}

  grpc::Status Explain(grpc::ServerContext* context, const v1::ExplainRequest* request,
                       v1::ExplainResponse* response) override {
    auto auth = context->client_metadata().find("authorization");
    if (auth == context->client_metadata().end() || auth->second != "Bearer t0ken") {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no token");
    }
    response->mutable_job()->set_job(request->job());
    response->mutable_job()->set_world_size(ranks_);
    for (int r = 0; r < ranks_; ++r) {
      v1::RankRow* row = response->add_ranks();
      row->set_rank(r);
      row->set_node(absl::StrCat("node-", r / 8));
      row->set_gpu(r % 8);
      row->set_busy_seconds(0.2 + r * 1e-7);
      row->set_compute_seconds(0.15 + r * 1e-7);
      row->set_data_seconds(0.01 + r * 1e-7);
      row->set_comm_seconds(0.04 + r * 1e-7);
      row->set_busy_vs_median_ratio(1 + r * 1e-7);
      row->set_comparable(true);
    }
    return grpc::Status::OK;
  }

 private:
  const int ranks_;
};

struct FakeCollector {
  explicit FakeCollector(int ranks) : service(ranks) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~FakeCollector() { server->Shutdown(); }

  FakeQuery service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

// A port nothing listens on while it lives: bound, never listened on.
class DeadPort {
 public:
  DeadPort() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
    }
  }
  ~DeadPort() {
    if (fd_ >= 0) close(fd_);
  }
  const std::string& address() const { return address_; }

 private:
  const int fd_;
  std::string address_;
};

const CollectorClients::AsyncCall<v1::ExplainRequest, v1::ExplainResponse> kExplain =
    [](v1::Query::StubInterface::async_interface* stub, grpc::ClientContext* c,
       const v1::ExplainRequest* r, v1::ExplainResponse* out,
       std::function<void(grpc::Status)> done) { stub->Explain(c, r, out, std::move(done)); };

TEST(CollectorClientsTest, ExplainOfA100000RankJobFromSeveralCollectors) {
  FakeCollector a(100000), b(100000);
  const CollectorClients clients({a.address, b.address}, grpc::InsecureChannelCredentials(),
                                 QueryChannelArguments(""), "Bearer t0ken", absl::Seconds(30));
  v1::ExplainRequest request;
  request.set_job("huge");
  const std::vector<Answer<v1::ExplainResponse>> answers =
      clients.Ask({a.address, b.address}, request, kExplain);
  ASSERT_EQ(answers.size(), 2u);
  for (const Answer<v1::ExplainResponse>& answer : answers) {
    ASSERT_TRUE(answer.status.ok()) << answer.collector << ": " << answer.status.error_message();
    EXPECT_EQ(answer.response.ranks_size(), 100000);
    // Over gRPC's default 4 MiB, so that this tests the limit.
    EXPECT_GT(answer.response.ByteSizeLong(), size_t{4} << 20);
  }
  EXPECT_EQ(answers[0].collector, a.address);
  EXPECT_EQ(answers[1].collector, b.address);
}

TEST(CollectorClientsTest, GrpcDefaultsWouldRefuseTheSameReply) {
  FakeCollector a(100000);
  const CollectorClients clients({a.address}, grpc::InsecureChannelCredentials(),
                                 grpc::ChannelArguments(), "Bearer t0ken", absl::Seconds(30));
  v1::ExplainRequest request;
  request.set_job("huge");
  const auto answers = clients.Ask({a.address}, request, kExplain);
  EXPECT_EQ(answers[0].status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST(CollectorClientsTest, ADeadCollectorFailsAloneAndTheTokenIsSent) {
  FakeCollector a(8);
  const DeadPort dead_port;
  const std::string& dead = dead_port.address();
  ASSERT_FALSE(dead.empty());
  const CollectorClients clients({dead, a.address}, grpc::InsecureChannelCredentials(),
                                 QueryChannelArguments(""), "Bearer t0ken", absl::Seconds(5));
  v1::ExplainRequest request;
  request.set_job("small");
  const auto answers = clients.Ask({dead, a.address}, request, kExplain);
  EXPECT_TRUE(answers[0].Failed());
  EXPECT_EQ(answers[0].status.error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE(answers[1].status.ok()) << answers[1].status.error_message();
  EXPECT_EQ(answers[1].response.job().job(), "small");

  const CollectorClients no_token({a.address}, grpc::InsecureChannelCredentials(),
                                  QueryChannelArguments(""), "", absl::Seconds(5));
  EXPECT_EQ(no_token.Ask({a.address}, request, kExplain)[0].status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace stepwatch::ctl
