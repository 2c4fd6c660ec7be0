#include "collector/pod_index.h"

#include <algorithm>
#include <utility>

#include "common/text.h"

namespace stepwatch::collector {
namespace {

// A rank's entry beside its names' heap: the map slot (key, PodNames of three strings).
constexpr int64_t kRankPodEntryBytes = 112;

bool NameOk(absl::string_view name) {
  return name.size() <= kMaxKubernetesNameBytes &&
         FindControlCharacter(name) == absl::string_view::npos;
}

int64_t KeptBytes(const PodNames& p) {
  return StringHeapBytes(p.namespace_name) + StringHeapBytes(p.pod) + StringHeapBytes(p.container);
}

}  // namespace

std::optional<FieldProblem> CheckKubernetesPod(const v1::KubernetesPod& pod, const char* field) {
  for (const std::string* name : {&pod.namespace_(), &pod.pod(), &pod.container()}) {
    if (name->size() > kMaxKubernetesNameBytes) return FieldProblem{field, "too_long"};
    if (!NameOk(*name)) return FieldProblem{field, "control_character"};
  }
  return std::nullopt;
}

int64_t KeptBytes(const v1::KubernetesPod& pod) {
  return StringHeapBytes(pod.namespace_()) + StringHeapBytes(pod.pod()) +
         StringHeapBytes(pod.container());
}

PodNames NamesOf(const v1::KubernetesPod& pod) {
  return PodNames{pod.namespace_(), pod.pod(), pod.container()};
}

void SetKubernetesPod(const PodNames& names, v1::KubernetesPod* out) {
  out->set_namespace_(names.namespace_name);
  out->set_pod(names.pod);
  out->set_container(names.container);
}

int64_t PodIndex::BytesIfSet(const std::string& job, int rank, const PodNames& pod) const {
  const PodNames* old = OfRank(job, rank);
  const int64_t before = old == nullptr ? 0 : kRankPodEntryBytes + KeptBytes(*old);
  const int64_t after = pod.empty() ? 0 : kRankPodEntryBytes + KeptBytes(pod);
  return after - before;
}

bool PodIndex::SetRank(const std::string& job, int rank, PodNames pod) {
  if (pod.empty()) {
    auto j = jobs_.find(job);
    if (j == jobs_.end() || j->second.erase(rank) == 0) return false;
    if (j->second.empty()) jobs_.erase(j);
    return true;
  }
  PodNames& slot = jobs_[job][rank];
  if (slot == pod) return false;
  slot = std::move(pod);
  return true;
}

void PodIndex::EraseJob(const std::string& job) { jobs_.erase(job); }

const PodNames* PodIndex::OfRank(absl::string_view job, int rank) const {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return nullptr;
  auto r = j->second.find(rank);
  return r == j->second.end() ? nullptr : &r->second;
}

PodNames PodIndex::Shared(absl::string_view job, const std::vector<int>& ranks) const {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return {};
  bool first = true;
  PodNames shared;
  auto meet = [&](const PodNames* p) {
    if (p == nullptr) {
      shared = PodNames{};
      return false;
    }
    if (first) {
      shared = *p;
      first = false;
      return true;
    }
    if (shared.namespace_name != p->namespace_name) shared.namespace_name.clear();
    if (shared.pod != p->pod) shared.pod.clear();
    if (shared.container != p->container) shared.container.clear();
    return !shared.empty();
  };
  if (ranks.empty()) {
    for (const auto& [rank, pod] : j->second) {
      if (!meet(&pod)) break;
    }
  } else {
    for (int rank : ranks) {
      auto r = j->second.find(rank);
      if (!meet(r == j->second.end() ? nullptr : &r->second)) break;
    }
  }
  // A pod name means nothing without its namespace, a container without its pod.
  if (shared.namespace_name.empty()) shared.pod.clear();
  if (shared.pod.empty()) shared.container.clear();
  return shared;
}

GpuPodLookup GpuPodsOf(const std::vector<NodeSnapshot>& nodes) {
  return [&nodes](absl::string_view node, int gpu) -> const v1::KubernetesPod* {
    auto it = std::lower_bound(
        nodes.begin(), nodes.end(), node,
        [](const NodeSnapshot& n, absl::string_view name) { return n.node < name; });
    if (it == nodes.end() || it->node != node) return nullptr;
    for (const v1::GpuSample& g : it->gpus) {
      if (g.index() == gpu) return g.has_kubernetes_pod() ? &g.kubernetes_pod() : nullptr;
    }
    return nullptr;
  };
}

PodNames AttributeFinding(const analysis::Finding& f, const PodIndex* ranks,
                          const GpuPodLookup& gpus) {
  if (ranks != nullptr && f.rank >= 0) {
    if (const PodNames* p = ranks->OfRank(f.job, f.rank)) return *p;
  }
  if (f.gpu >= 0 && !f.node.empty() && gpus) {
    if (const v1::KubernetesPod* p = gpus(f.node, f.gpu)) return NamesOf(*p);
  }
  if (ranks == nullptr || f.job.empty()) return {};
  if (f.rank >= 0) return ranks->Shared(f.job, {f.rank});
  return ranks->Shared(f.job, f.ranks);
}

}  // namespace stepwatch::collector
