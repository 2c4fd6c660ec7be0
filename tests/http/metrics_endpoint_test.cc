#include "http/metrics_endpoint.h"

#include <crypt.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "http/http_basic_auth.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "tests/http/http_test_client.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::http {
namespace {

using std::chrono::milliseconds;
using testing::Get;
using testing::TestConnection;

// One gauge; each Collect() is counted and may be made slow.
class CountingCollectable : public prometheus::Collectable {
 public:
  explicit CountingCollectable(milliseconds delay = milliseconds(0)) : delay_(delay) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::this_thread::sleep_for(delay_);
    prometheus::MetricFamily f;
    f.name = "test_collects";
    f.help = "Collect() calls.";
    f.type = prometheus::MetricType::Gauge;
    prometheus::ClientMetric m;
    m.gauge.value = static_cast<double>(++collects);
    f.metric.push_back(m);
    return {f};
  }
  mutable std::atomic<int> collects{0};

 private:
  const milliseconds delay_;
};

std::unique_ptr<MetricsEndpoint> StartEndpoint(std::shared_ptr<prometheus::Collectable> c,
                                               MetricsEndpointOptions options = {}) {
  options.listen = "127.0.0.1:0";
  auto endpoint = MetricsEndpoint::Start(options, c);
  EXPECT_OK(endpoint);
  return endpoint.ok() ? *std::move(endpoint) : nullptr;
}

std::string Fetch(int port, const std::string& request) {
  TestConnection c(port);
  if (!c.Send(request)) return "";
  return c.ReadResponse(milliseconds(10000));
}

TEST(MetricsEndpointTest, ServesTheCollectableAndItsOwnCounters) {
  auto collectable = std::make_shared<CountingCollectable>();
  auto endpoint = StartEndpoint(collectable);
  ASSERT_NE(endpoint, nullptr);
  Fetch(endpoint->port(), Get("/other"));
  const std::string response = Fetch(endpoint->port(), Get("/metrics"));
  EXPECT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response;
  EXPECT_NE(response.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos);
  EXPECT_NE(response.find("\ntest_collects 1\n"), std::string::npos) << response;
  EXPECT_NE(response.find("stepwatch_metrics_http_requests_total{code=\"404\"} 1"),
            std::string::npos)
      << response;
  EXPECT_NE(response.find("stepwatch_metrics_http_connections_closed_total{reason=\"evicted\"} 0"),
            std::string::npos);
}

TEST(MetricsEndpointTest, AnswersOtherPathsAndMethodsWithoutRendering) {
  auto collectable = std::make_shared<CountingCollectable>();
  auto endpoint = StartEndpoint(collectable);
  ASSERT_NE(endpoint, nullptr);
  EXPECT_EQ(Fetch(endpoint->port(), Get("/")).rfind("HTTP/1.1 404 ", 0), 0u);
  const std::string post =
      Fetch(endpoint->port(), "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405 ", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET, HEAD\r\n"), std::string::npos) << post;
  EXPECT_EQ(collectable->collects.load(), 0);
}

TEST(MetricsEndpointTest, ConcurrentScrapesShareRenders) {
  auto collectable = std::make_shared<CountingCollectable>(milliseconds(200));
  auto endpoint = StartEndpoint(collectable);
  ASSERT_NE(endpoint, nullptr);
  constexpr int kScrapers = 20;
  std::vector<std::unique_ptr<TestConnection>> clients;
  for (int i = 0; i < kScrapers; ++i) {
    clients.push_back(std::make_unique<TestConnection>(endpoint->port()));
    ASSERT_TRUE(clients.back()->Send(Get("/metrics")));
  }
  for (auto& c : clients) {
    EXPECT_EQ(c->ReadResponse(milliseconds(10000)).rfind("HTTP/1.1 200 OK", 0), 0u);
  }
  // One render for the first request, one (or a few, if the requests straddled renders) for all
  // the others: far fewer than one per scrape.
  EXPECT_LE(collectable->collects.load(), 4);
}

class MetricsEndpointAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    // Cost 4: a valid bcrypt hash that is quick to verify in a test.
    const char* salt = crypt_gensalt("$2b$", 4, nullptr, 0);
    ASSERT_NE(salt, nullptr);
    std::ofstream(users_) << "prometheus:" << crypt("scrape-secret", salt) << "\n";
  }
  static std::string Basic(const std::string& user_password) {
    return "Authorization: Basic " + absl::Base64Escape(user_password) + "\r\n";
  }
  const test::TempDir dir_{"stepwatch-metrics-endpoint"};
  const std::string users_ = dir_.File("users");
};

TEST_F(MetricsEndpointAuthTest, AsksForAPasswordAndChecksIt) {
  auto collectable = std::make_shared<CountingCollectable>();
  MetricsEndpointOptions options;
  options.basic_auth_file = users_;
  auto endpoint = StartEndpoint(collectable, options);
  ASSERT_NE(endpoint, nullptr);
  const std::string none = Fetch(endpoint->port(), Get("/metrics"));
  EXPECT_EQ(none.rfind("HTTP/1.1 401 ", 0), 0u) << none;
  EXPECT_NE(none.find("WWW-Authenticate: Basic realm=\"stepwatch\"\r\n"), std::string::npos);
  EXPECT_EQ(
      Fetch(endpoint->port(), Get("/metrics", Basic("prometheus:wrong"))).rfind("HTTP/1.1 401", 0),
      0u);
  EXPECT_EQ(Fetch(endpoint->port(), Get("/metrics", Basic("mallory:scrape-secret")))
                .rfind("HTTP/1.1 401", 0),
            0u);
  EXPECT_EQ(Fetch(endpoint->port(), Get("/metrics", "Authorization: Basic !!!\r\n"))
                .rfind("HTTP/1.1 401", 0),
            0u);
  EXPECT_EQ(collectable->collects.load(), 0);
  // Twice: the second time from the verified-password cache.
  for (int i = 0; i < 2; ++i) {
    const std::string ok =
        Fetch(endpoint->port(), Get("/metrics", Basic("prometheus:scrape-secret")));
    EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK", 0), 0u) << ok;
  }
  EXPECT_EQ(collectable->collects.load(), 2);
}

TEST_F(MetricsEndpointAuthTest, AVerifiedCredentialIsCachedUntilTheFileChanges) {
  BasicAuthUsers users(users_);
  ASSERT_OK(users.Load());
  const std::string good = "Basic " + absl::Base64Escape("prometheus:scrape-secret");
  const std::string bad = "Basic " + absl::Base64Escape("prometheus:wrong");
  EXPECT_FALSE(users.VerifyCached(good)) << "nothing verified yet";
  EXPECT_FALSE(users.Verify(bad));
  EXPECT_FALSE(users.VerifyCached(bad)) << "failures are never cached";
  EXPECT_TRUE(users.Verify(good));
  EXPECT_TRUE(users.VerifyCached(good));
  EXPECT_TRUE(users.VerifyCached(good));
  EXPECT_FALSE(users.VerifyCached("Basic " + absl::Base64Escape("prometheus:scrape-secreT")));
  BasicAuthUsers::Stats stats = users.stats();
  EXPECT_EQ(stats.cached, 2u);
  EXPECT_EQ(stats.verified, 1u);
  EXPECT_EQ(stats.refused, 1u);
  // A new file (the password rotated): the cached verdict is not trusted any more.
  const char* salt = crypt_gensalt("$2b$", 4, nullptr, 0);
  ASSERT_NE(salt, nullptr);
  const std::string hash = crypt("rotated-secret", salt);
  std::ofstream(users_ + ".tmp") << "prometheus:" << hash << "\n";
  ASSERT_EQ(std::rename((users_ + ".tmp").c_str(), users_.c_str()), 0);
  EXPECT_FALSE(users.VerifyCached(good));
  EXPECT_FALSE(users.Verify(good));
  EXPECT_FALSE(users.VerifyCached(good));
}

TEST_F(MetricsEndpointAuthTest, CachedScrapesDoNotWaitBehindAFloodOfWrongPasswords) {
  // Cost 12 (~0.25 s a hash here): one worker and a full queue of wrong passwords would hold a
  // scrape for seconds if it had to wait for them.
  const char* salt = crypt_gensalt("$2b$", 12, nullptr, 0);
  ASSERT_NE(salt, nullptr);
  std::ofstream(users_) << "prometheus:" << crypt("scrape-secret", salt) << "\n";
  auto collectable = std::make_shared<CountingCollectable>();
  MetricsEndpointOptions options;
  options.basic_auth_file = users_;
  options.threads = 1;
  auto endpoint = StartEndpoint(collectable, options);
  ASSERT_NE(endpoint, nullptr);
  const std::string good = Get("/metrics", Basic("prometheus:scrape-secret"));
  ASSERT_EQ(Fetch(endpoint->port(), good).rfind("HTTP/1.1 200 OK", 0), 0u);
  std::vector<std::unique_ptr<TestConnection>> flood;
  for (int i = 0; i < 8; ++i) {
    flood.push_back(std::make_unique<TestConnection>(endpoint->port()));
    ASSERT_TRUE(flood.back()->Send(Get("/metrics", Basic("prometheus:wrong"))));
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Fetch(endpoint->port(), good).rfind("HTTP/1.1 200 OK", 0), 0u);
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  // Eight queued hashes take about 2 s; cached answers need none of them.
  EXPECT_LT(elapsed, std::chrono::milliseconds(1500));
}

TEST_F(MetricsEndpointAuthTest, RefusesAFileWithoutBcryptHashes) {
  std::ofstream(users_) << "prometheus:plaintext\n";
  MetricsEndpointOptions options;
  options.listen = "127.0.0.1:0";
  options.basic_auth_file = users_;
  auto endpoint = MetricsEndpoint::Start(options, std::make_shared<CountingCollectable>());
  EXPECT_THAT(endpoint, test::StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(MetricsEndpointShutdownTest, StopsWithOpenAndBusyConnections) {
  auto collectable = std::make_shared<CountingCollectable>(milliseconds(300));
  auto endpoint = StartEndpoint(collectable);
  ASSERT_NE(endpoint, nullptr);
  std::vector<std::unique_ptr<TestConnection>> clients;
  for (int i = 0; i < 20; ++i) {
    clients.push_back(std::make_unique<TestConnection>(endpoint->port()));
    if (i % 2 == 0) {
      ASSERT_TRUE(clients.back()->Send(Get("/metrics")));
    }
  }
  std::this_thread::sleep_for(milliseconds(50));  // a render is running
  const auto start = std::chrono::steady_clock::now();
  endpoint.reset();
  // At most the render in progress is waited for.
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
}

}  // namespace
}  // namespace stepwatch::http
