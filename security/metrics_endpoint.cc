#include "security/metrics_endpoint.h"

#include <crypt.h>

#include <memory>
#include <map>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/log.h"
#include "common/net.h"
#include "prometheus/exposer.h"
#include "security/tokens.h"

namespace stepwatch::security {

// Users of the basic-auth file, re-read when it changes. A password that verified once is
// remembered (per user, until the file changes), so that bcrypt's cost is paid once, not per
// scrape.
class BasicAuthUsers {
 public:
  explicit BasicAuthUsers(std::string path) : path_(std::move(path)) {}

  absl::Status Load() {
    std::lock_guard<std::mutex> lock(mu_);
    return LoadLocked();
  }

  bool Verify(const std::string& user, const std::string& password) {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = LoadLocked(); !s.ok()) {
      uint64_t suppressed = 0;
      if (log_limiter_.Allow(&suppressed)) {
        SW_LOG_WARNING << "metrics basic auth file not reloaded, previous users stay: " << s;
      }
    }
    auto it = users_.find(user);
    if (it == users_.end()) return false;
    User& u = it->second;
    if (!u.verified.empty()) return ConstantTimeEquals(u.verified, password);
    // crypt_data is 32 KiB: on the heap, not on a web-server worker's stack.
    auto data = std::make_unique<crypt_data>();
    const char* hashed = crypt_r(password.c_str(), u.hash.c_str(), data.get());
    if (hashed == nullptr || hashed[0] == '*' || !ConstantTimeEquals(hashed, u.hash)) return false;
    u.verified = password;
    return true;
  }

 private:
  struct User {
    std::string hash;
    std::string verified;
  };

  absl::Status LoadLocked() {
    absl::StatusOr<std::string> text = ReadFile(path_, 1 << 20);
    if (!text.ok()) return text.status();
    if (*text == loaded_text_) return absl::OkStatus();
    std::map<std::string, User> users;
    int line_number = 0;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      ++line_number;
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line[0] == '#') continue;
      const size_t colon = line.find(':');
      // bcrypt only: "$2b$", "$2y$" or "$2a$" hashes. Plain passwords are refused.
      if (colon == absl::string_view::npos || colon == 0 || line.substr(colon + 1, 2) != "$2" ||
          line.size() - colon - 1 < 59) {
        return absl::InvalidArgumentError(
            absl::StrCat(path_, " line ", line_number, ": expected USER:BCRYPT_HASH"));
      }
      users[std::string(line.substr(0, colon))].hash = std::string(line.substr(colon + 1));
    }
    if (users.empty()) return absl::InvalidArgumentError(absl::StrCat(path_, ": no users"));
    users_ = std::move(users);
    loaded_text_ = *std::move(text);
    return absl::OkStatus();
  }

  const std::string path_;
  std::mutex mu_;
  std::string loaded_text_;
  std::map<std::string, User> users_;
  LogRateLimiter log_limiter_{1, std::chrono::minutes(1)};
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const MetricsEndpointOptions& o, std::weak_ptr<prometheus::Collectable> collectable) {
  absl::StatusOr<HostPort> hp = ParseHostPort(o.listen);
  if (!hp.ok()) return hp.status();
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  if (!o.basic_auth_file.empty()) {
    endpoint->users_ = std::make_unique<BasicAuthUsers>(o.basic_auth_file);
    if (absl::Status s = endpoint->users_->Load(); !s.ok()) return s;
  }
  std::vector<std::string> civet_options = {
      "listening_ports",    JoinHostPort(*hp),
      "num_threads",        absl::StrCat(std::max(2, o.threads)),
      "request_timeout_ms", absl::StrCat(std::max(100, o.request_timeout_ms))};
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(civet_options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.listen, ": ", e.what()));
  }
  if (endpoint->users_ != nullptr) {
    BasicAuthUsers* users = endpoint->users_.get();
    endpoint->exposer_->RegisterAuth(
        [users](const std::string& user, const std::string& password) {
          return users->Verify(user, password);
        },
        "stepwatch");
  }
  endpoint->exposer_->RegisterCollectable(collectable);
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  endpoint->port_ = ports.empty() ? 0 : ports.front();
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  // The server's threads may call into users_: stop them first.
  exposer_.reset();
}

}  // namespace stepwatch::security
