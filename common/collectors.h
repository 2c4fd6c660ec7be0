// Which collectors hold a job: the collector list the binaries take (--collector) and the
// rendezvous hashing that places each job (and each idle node) on R of them. The agent, the load
// generator and stepwatchctl all place keys with this one function, so they agree on the owners.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stepwatch {

// --collector as given: either a list of HOST:PORT addresses, or one dns:///NAME:PORT whose every
// address (A and AAAA records; a Kubernetes headless Service) is a collector.
struct CollectorTargets {
  // HOST:PORT as written (IPv6 hosts in brackets), in flag order, without duplicates.
  std::vector<std::string> addresses;
  // dns:///NAME:PORT: the name to resolve, and the port every address is given.
  std::string dns_name;
  int dns_port = 0;

  bool is_dns() const { return !dns_name.empty(); }
};

// Parses "HOST:PORT[,HOST:PORT...]" or "dns:///NAME:PORT" (also "dns:NAME:PORT"). Every port must
// be 1..65535; an empty list, an empty entry or a mix of dns and plain addresses is an error.
absl::StatusOr<CollectorTargets> ParseCollectorTargets(absl::string_view flag);

// The collectors now: the addresses as given, or for dns every address NAME resolves to as
// "IP:PORT" ("[V6]:PORT"), sorted, without duplicates. NotFound/Unavailable when the name does
// not resolve (yet).
absl::StatusOr<std::vector<std::string>> ResolveCollectorTargets(const CollectorTargets& targets);

// The rendezvous (highest random weight) score of `member` for `key`: the same in every process,
// release and platform (FNV-1a over both, then a 64-bit finalizer).
uint64_t RendezvousScore(absl::string_view key, absl::string_view member);

// `members` ordered from the owner of `key` down: by decreasing score, ties by name. The first R
// that are reachable hold the key; when one drops out only the keys it held move, each to the next
// member in its own order, and they move back when it returns.
std::vector<std::string> RendezvousOrder(absl::string_view key,
                                         const std::vector<std::string>& members);

// The first `replicas` of RendezvousOrder(key, members) (all of them when fewer).
std::vector<std::string> RendezvousOwners(absl::string_view key,
                                          const std::vector<std::string>& members, int replicas);

// The key a node's own GPU and host samples are placed by when no job runs on it.
std::string NodePlacementKey(absl::string_view node);

}  // namespace stepwatch
