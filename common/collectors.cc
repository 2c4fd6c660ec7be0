#include "common/collectors.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/net.h"

namespace stepwatch {
namespace {

absl::StatusOr<HostPort> ParseCollectorAddress(absl::string_view address) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok() || hp->host.empty() || hp->port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a collector must be HOST:PORT with a non-zero port, got \"", address, "\""));
  }
  return hp;
}

uint64_t Fnv1a(uint64_t h, absl::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// splitmix64's finalizer: FNV alone leaves the high bits of similar keys close together.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

absl::StatusOr<CollectorTargets> ParseCollectorTargets(absl::string_view flag) {
  CollectorTargets targets;
  absl::string_view rest = flag;
  if (absl::ConsumePrefix(&rest, "dns:///") || absl::ConsumePrefix(&rest, "dns:")) {
    if (absl::StrContains(rest, ',')) {
      return absl::InvalidArgumentError(
          absl::StrCat("dns:///NAME:PORT names one name, got \"", flag, "\""));
    }
    absl::StatusOr<HostPort> hp = ParseCollectorAddress(rest);
    if (!hp.ok()) return hp.status();
    targets.dns_name = hp->host;
    targets.dns_port = hp->port;
    return targets;
  }
  if (flag.empty()) return absl::InvalidArgumentError("no collector given");
  std::set<std::string> seen;
  for (absl::string_view entry : absl::StrSplit(flag, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (absl::StartsWith(entry, "dns:")) {
      return absl::InvalidArgumentError(
          "dns:///NAME:PORT cannot be mixed with other collector addresses");
    }
    absl::StatusOr<HostPort> hp = ParseCollectorAddress(entry);
    if (!hp.ok()) return hp.status();
    std::string address = JoinHostPort(*hp);
    if (seen.insert(address).second) targets.addresses.push_back(std::move(address));
  }
  return targets;
}

absl::StatusOr<std::vector<std::string>> ResolveCollectorTargets(const CollectorTargets& targets) {
  if (!targets.is_dns()) return targets.addresses;
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  const int rc = getaddrinfo(targets.dns_name.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    const std::string why = absl::StrCat("cannot resolve collector name \"", targets.dns_name,
                                         "\": ", gai_strerror(rc));
    return rc == EAI_NONAME ? absl::NotFoundError(why) : absl::UnavailableError(why);
  }
  std::set<std::string> addresses;
  for (const struct addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char host[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) !=
        0) {
      continue;
    }
    HostPort hp;
    hp.host = host;
    hp.port = targets.dns_port;
    addresses.insert(JoinHostPort(hp));
  }
  freeaddrinfo(found);
  if (addresses.empty()) {
    return absl::NotFoundError(
        absl::StrCat("collector name \"", targets.dns_name, "\" has no addresses"));
  }
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

uint64_t RendezvousScore(absl::string_view key, absl::string_view member) {
  uint64_t h = Fnv1a(1469598103934665603ull, key);
  h = Fnv1a(h ^ 0xff, member);  // a separator: ("ab","c") and ("a","bc") differ
  return Mix(h);
}

std::vector<std::string> RendezvousOrder(absl::string_view key,
                                         const std::vector<std::string>& members) {
  std::vector<std::pair<uint64_t, const std::string*>> scored;
  scored.reserve(members.size());
  for (const std::string& m : members) scored.emplace_back(RendezvousScore(key, m), &m);
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return *a.second < *b.second;
  });
  std::vector<std::string> order;
  order.reserve(scored.size());
  for (const auto& s : scored) order.push_back(*s.second);
  return order;
}

std::vector<std::string> RendezvousOwners(absl::string_view key,
                                          const std::vector<std::string>& members, int replicas) {
  std::vector<std::string> order = RendezvousOrder(key, members);
  if (replicas >= 0 && order.size() > static_cast<size_t>(replicas)) order.resize(replicas);
  return order;
}

std::string NodePlacementKey(absl::string_view node) { return absl::StrCat("node/", node); }

}  // namespace stepwatch
