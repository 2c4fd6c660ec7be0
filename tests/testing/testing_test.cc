#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "tests/testing/net.h"
#include "tests/testing/received.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::StatusOr<int> Seven() { return 7; }
absl::StatusOr<int> Missing() { return absl::NotFoundError("no such thing"); }

TEST(StatusMatchersTest, IsOkMatchesOkStatusAndValue) {
  EXPECT_THAT(absl::OkStatus(), IsOk());
  EXPECT_THAT(Seven(), IsOk());
  EXPECT_THAT(absl::InternalError("x"), Not(IsOk()));
  EXPECT_THAT(Missing(), Not(IsOk()));
}

TEST(StatusMatchersTest, StatusIsMatchesCodeAndMessage) {
  EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound, "no such thing"));
  EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("such")));
  EXPECT_THAT(Missing(), Not(StatusIs(absl::StatusCode::kInternal)));
  EXPECT_THAT(Missing(), Not(StatusIs(absl::StatusCode::kNotFound, HasSubstr("other"))));
  EXPECT_THAT(absl::OkStatus(), StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(Seven(), Not(StatusIs(absl::StatusCode::kNotFound)));
}

TEST(StatusMatchersTest, OkMacrosFailOnError) {
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(absl::InvalidArgumentError("bad rank")), "bad rank");
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(Missing()), "no such thing");
  EXPECT_NONFATAL_FAILURE(
      EXPECT_THAT(Missing(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("other"))),
      "no such thing");
  EXPECT_FATAL_FAILURE(ASSERT_OK(absl::InternalError("broken")), "broken");
  EXPECT_OK(absl::OkStatus());
  ASSERT_OK(Seven());
}

TEST(StatusMatchersTest, AssertOkAndAssignMovesTheValue) {
  ASSERT_OK_AND_ASSIGN(const int seven, Seven());
  EXPECT_EQ(seven, 7);
  std::string text;
  ASSERT_OK_AND_ASSIGN(text, absl::StatusOr<std::string>("moved"));
  EXPECT_EQ(text, "moved");
}

void AssignMissing() { ASSERT_OK_AND_ASSIGN([[maybe_unused]] int unused, Missing()); }

TEST(StatusMatchersTest, AssertOkAndAssignFailsOnError) {
  EXPECT_FATAL_FAILURE(AssignMissing(), "no such thing");
}

TEST(TempDirTest, CreatesAndRemovesTheTree) {
  std::string path;
  {
    TempDir dir("stepwatch-testing");
    path = dir.path();
    ASSERT_FALSE(path.empty());
    ASSERT_EQ(mkdir(dir.File("sub").c_str(), 0700), 0);
    std::ofstream(dir.File("sub/file")) << "data";
    struct stat st;
    ASSERT_EQ(stat(dir.File("sub/file").c_str(), &st), 0);
  }
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0);
}

TEST(NetTest, FreeLoopbackPortAndHttpGetToAClosedPort) {
  ASSERT_OK_AND_ASSIGN(const int port, FreeLoopbackPort());
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
  // Nothing listens there now.
  EXPECT_THAT(HttpGet(port, "/metrics"), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(NetTest, HttpGetReadsStatusHeadAndBody) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  std::string request;
  std::thread server([&] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    char buffer[1024];
    while (request.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      request.append(buffer, static_cast<size_t>(n));
    }
    const std::string answer =
        "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n\r\nnone here";
    (void)!send(fd, answer.data(), answer.size(), MSG_NOSIGNAL);
    close(fd);
  });
  absl::StatusOr<HttpResponse> got = HttpGet(ntohs(address.sin_port), "/missing");
  server.join();
  close(listener);
  ASSERT_OK(got);
  EXPECT_EQ(got->status_code, 404);
  EXPECT_EQ(got->head, "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain");
  EXPECT_EQ(got->body, "none here");
  EXPECT_THAT(request, HasSubstr("GET /missing HTTP/1.0\r\n"));
}

TEST(ReceivedTest, KeepsWhatTheSinkIsGivenFromAnyThread) {
  Received<std::string> received;
  auto sink = received.Sink();
  std::thread other([&] { sink("a"); });
  other.join();
  sink("b");
  EXPECT_EQ(received.size(), 2u);
  EXPECT_THAT(received.items(), ::testing::ElementsAre("a", "b"));
}

}  // namespace
}  // namespace stepwatch::test
