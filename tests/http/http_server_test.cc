#include "http/http_server.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/http/http_test_client.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::http {
namespace {

using std::chrono::milliseconds;
using testing::Get;
using testing::TestConnection;

size_t Closed(const HttpServerStats& s, CloseReason reason) {
  return s.closed[static_cast<size_t>(reason)];
}

// Answers "path" for every request, on the loop thread.
std::unique_ptr<HttpServer> EchoServer(HttpServerOptions options) {
  options.listen = "127.0.0.1:0";
  auto server = HttpServer::Start(options, [](const HttpRequest& r, HttpResponder responder) {
    HttpResponse response;
    response.body = std::make_shared<const std::string>(r.method + " " + r.path);
    responder.Send(std::move(response));
  });
  EXPECT_OK(server);
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(HttpServerTest, ServesKeepAliveAndPipelinedRequestsOnOneConnection) {
  auto server = EchoServer({});
  ASSERT_NE(server, nullptr);
  TestConnection c(server->port());
  ASSERT_TRUE(c.ok()) << "could not connect";
  ASSERT_TRUE(c.Send(Get("/a")));
  std::string response = c.ReadResponse(milliseconds(5000));
  EXPECT_NE(response.find("HTTP/1.1 200 OK\r\n"), std::string::npos) << response;
  EXPECT_NE(response.find("Connection: keep-alive"), std::string::npos) << response;
  EXPECT_NE(response.find("\r\n\r\nGET /a"), std::string::npos) << response;
  // Two requests in one write: both answered, in order.
  ASSERT_TRUE(c.Send(Get("/b") + Get("/c", "Connection: close\r\n")));
  EXPECT_NE(c.ReadResponse(milliseconds(5000)).find("GET /b"), std::string::npos);
  response = c.ReadResponse(milliseconds(5000));
  EXPECT_NE(response.find("GET /c"), std::string::npos) << response;
  EXPECT_NE(response.find("Connection: close"), std::string::npos) << response;
  bool closed = false;
  c.ReadUntilClose(milliseconds(5000), &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(server->stats().responses.at(200), 3u);
  EXPECT_EQ(server->stats().accepted, 1u);
}

TEST(HttpServerTest, HeadGetsTheLengthButNoBody) {
  auto server = EchoServer({});
  ASSERT_NE(server, nullptr);
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send("HEAD /x HTTP/1.1\r\nHost: h\r\n\r\n" + Get("/y")));
  const std::string head = c.ReadResponse(milliseconds(5000), /*head_only=*/true);
  EXPECT_NE(head.find("Content-Length: 7\r\n"), std::string::npos) << head;
  // The next response follows the head at once: no body was sent in between.
  const std::string next = c.ReadResponse(milliseconds(5000));
  EXPECT_EQ(next.rfind("HTTP/1.1 200 OK", 0), 0u) << next;
  EXPECT_NE(next.find("GET /y"), std::string::npos) << next;
}

TEST(HttpServerTest, MalformedAndOversizedHeadsAreAnsweredAndClosed) {
  HttpServerOptions options;
  options.max_head_bytes = 1024;
  auto server = EchoServer(options);
  ASSERT_NE(server, nullptr);
  {
    TestConnection c(server->port());
    ASSERT_TRUE(c.Send("GET / HTTP/1.1\r\nHost: x\r\nX: " + std::string(2000, 'a')));
    bool closed = false;
    const std::string response = c.ReadUntilClose(milliseconds(5000), &closed);
    EXPECT_EQ(response.rfind("HTTP/1.1 431 ", 0), 0u) << response;
    EXPECT_TRUE(closed);
  }
  {
    TestConnection c(server->port());
    ASSERT_TRUE(c.Send("GET / HTTP/1.1\r\nBad Header: x\r\n\r\n"));
    bool closed = false;
    const std::string response = c.ReadUntilClose(milliseconds(5000), &closed);
    EXPECT_EQ(response.rfind("HTTP/1.1 400 ", 0), 0u) << response;
    EXPECT_TRUE(closed);
  }
  EXPECT_EQ(server->stats().responses.at(431), 1u);
  EXPECT_EQ(server->stats().responses.at(400), 1u);
}

TEST(HttpServerTest, ClosesConnectionsThatDoNotSendAHeadInTime) {
  HttpServerOptions options;
  options.header_timeout = absl::Milliseconds(300);
  auto server = EchoServer(options);
  ASSERT_NE(server, nullptr);
  TestConnection idle(server->port());
  TestConnection slow(server->port());
  const auto start = std::chrono::steady_clock::now();
  // A slow client sending a byte every 50 ms never completes its head: closed all the same.
  const std::string request = Get("/slow");
  bool slow_closed = false;
  for (size_t i = 0; i < request.size() && !slow_closed; ++i) {
    if (!slow.Send(request.substr(i, 1))) break;
    slow.ReadUntilClose(milliseconds(50), &slow_closed);
  }
  bool closed = false;
  idle.ReadUntilClose(milliseconds(5000), &closed);
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
  if (!slow_closed) slow.ReadUntilClose(milliseconds(5000), &slow_closed);
  EXPECT_TRUE(slow_closed);
  EXPECT_EQ(Closed(server->stats(), CloseReason::kHeaderTimeout), 2u);
  // Meanwhile a prompt client is served.
  TestConnection prompt(server->port());
  ASSERT_TRUE(prompt.Send(Get("/ok")));
  EXPECT_NE(prompt.ReadResponse(milliseconds(5000)).find("GET /ok"), std::string::npos);
}

TEST(HttpServerTest, ClosesKeptAliveConnectionsAfterTheIdleTimeout) {
  HttpServerOptions options;
  options.idle_timeout = absl::Milliseconds(300);
  auto server = EchoServer(options);
  ASSERT_NE(server, nullptr);
  TestConnection c(server->port());
  ASSERT_TRUE(c.Send(Get("/")));
  ASSERT_FALSE(c.ReadResponse(milliseconds(5000)).empty());
  bool closed = false;
  c.ReadUntilClose(milliseconds(5000), &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(Closed(server->stats(), CloseReason::kIdleTimeout), 1u);
}

TEST(HttpServerTest, ClosesConnectionsThatDoNotTakeTheResponseInTime) {
  HttpServerOptions options;
  options.listen = "127.0.0.1:0";
  options.write_timeout = absl::Milliseconds(300);
  // Far more than the socket buffers of both ends hold.
  auto body = std::make_shared<const std::string>(64 << 20, 'x');
  auto server = HttpServer::Start(options, [body](const HttpRequest&, HttpResponder responder) {
    HttpResponse response;
    response.body = body;
    responder.Send(std::move(response));
  });
  ASSERT_OK(server);
  TestConnection reader((*server)->port(), /*receive_buffer=*/4096);
  ASSERT_TRUE(reader.Send(Get("/")));
  for (int i = 0; i < 300 && Closed((*server)->stats(), CloseReason::kWriteTimeout) == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(Closed((*server)->stats(), CloseReason::kWriteTimeout), 1u);
  EXPECT_EQ((*server)->stats().open, 0u);
}

TEST(HttpServerTest, AtTheCapTheOldestIdleConnectionMakesRoom) {
  HttpServerOptions options;
  options.max_connections = 4;
  auto server = EchoServer(options);
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<TestConnection>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<TestConnection>(server->port()));
  // Let the server accept them all, oldest first.
  for (int i = 0; i < 50 && server->stats().open < 4; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  ASSERT_EQ(server->stats().open, 4u);
  TestConnection scraper(server->port());
  ASSERT_TRUE(scraper.Send(Get("/metrics")));
  EXPECT_NE(scraper.ReadResponse(milliseconds(5000)).find("GET /metrics"), std::string::npos);
  bool closed = false;
  idle[0]->ReadUntilClose(milliseconds(2000), &closed);
  EXPECT_TRUE(closed) << "the oldest idle connection was not the one closed";
  EXPECT_EQ(Closed(server->stats(), CloseReason::kEvicted), 1u);
  EXPECT_EQ(server->stats().refused, 0u);
}

TEST(HttpServerTest, AtTheCapWithEveryRequestInProgressNewConnectionsAreRefused) {
  // A handler that never answers keeps every connection busy.
  absl::Mutex mu;
  std::vector<HttpResponder> held;  // under mu
  HttpServerOptions options;
  options.listen = "127.0.0.1:0";
  options.max_connections = 2;
  auto server = HttpServer::Start(options, [&](const HttpRequest&, HttpResponder r) {
    absl::MutexLock lock(&mu);
    held.push_back(r);
  });
  ASSERT_OK(server);
  TestConnection a((*server)->port());
  TestConnection b((*server)->port());
  ASSERT_TRUE(a.Send(Get("/")) && b.Send(Get("/")));
  {
    absl::MutexLock lock(&mu);
    const auto both_held = [&held] { return held.size() == 2; };
    mu.AwaitWithTimeout(absl::Condition(&both_held), absl::Seconds(1));
  }
  TestConnection refused((*server)->port());
  bool closed = false;
  refused.ReadUntilClose(milliseconds(5000), &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ((*server)->stats().refused, 1u);
  // Answers from another thread reach the held connections.
  std::thread answer([&] {
    absl::MutexLock lock(&mu);
    for (HttpResponder& r : held) r.Send(HttpResponse{});
  });
  answer.join();
  EXPECT_EQ(a.ReadResponse(milliseconds(5000)).rfind("HTTP/1.1 200 OK", 0), 0u);
  EXPECT_EQ(b.ReadResponse(milliseconds(5000)).rfind("HTTP/1.1 200 OK", 0), 0u);
}

TEST(HttpServerTest, StopsPromptlyWithOpenConnections) {
  std::vector<HttpResponder> held;
  HttpServerOptions options;
  options.listen = "127.0.0.1:0";
  auto server =
      HttpServer::Start(options, [&](const HttpRequest&, HttpResponder r) { held.push_back(r); });
  ASSERT_OK(server);
  std::vector<std::unique_ptr<TestConnection>> clients;
  for (int i = 0; i < 50; ++i)
    clients.push_back(std::make_unique<TestConnection>((*server)->port()));
  ASSERT_TRUE(clients[0]->Send(Get("/")));  // one with a request in progress
  TestConnection partial((*server)->port());
  ASSERT_TRUE(partial.Send("GET / HT"));
  std::this_thread::sleep_for(milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
  for (auto& c : clients) {
    bool closed = false;
    c->ReadUntilClose(milliseconds(2000), &closed);
    EXPECT_TRUE(closed);
  }
}

TEST(HttpServerTest, RefusesAnAddressInUse) {
  auto first = EchoServer({});
  ASSERT_NE(first, nullptr);
  HttpServerOptions options;
  options.listen = "127.0.0.1:" + std::to_string(first->port());
  auto second = HttpServer::Start(options, [](const HttpRequest&, HttpResponder) {});
  EXPECT_THAT(second, test::StatusIs(absl::StatusCode::kUnavailable));
  options.listen = "not an address";
  EXPECT_FALSE(HttpServer::Start(options, [](const HttpRequest&, HttpResponder) {}).ok());
}

}  // namespace
}  // namespace stepwatch::http
