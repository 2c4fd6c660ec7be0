#include "agent/peer_strings.h"

#include <utility>
#include <vector>

namespace stepwatch::agent {
namespace {

// Length of the printable UTF-8 character at s[i], 0 when there is none (a control character or
// an invalid, overlong or surrogate sequence).
size_t PrintableCharAt(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c >= 0x20 && c < 0x7f) return 1;
  size_t len = 0;
  uint32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
  if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  if (cp >= 0x80 && cp < 0xa0) return 0;  // C1 controls, e.g. U+009B (CSI)
  return len;
}

void Bound(std::string* s, PeerStringField field, PeerStringCounts* counts) {
  if (BoundPeerString(s, PeerStringLimit(field))) ++(*counts)[static_cast<int>(field)];
}

}  // namespace

const char* PeerStringFieldName(PeerStringField field) {
  switch (field) {
    case PeerStringField::kGpuName:
      return "gpu_name";
    case PeerStringField::kGpuUuid:
      return "gpu_uuid";
    case PeerStringField::kDriverVersion:
      return "driver_version";
    case PeerStringField::kNvmlError:
      return "nvml_error";
    case PeerStringField::kUnavailableMetric:
      return "unavailable_metric";
    case PeerStringField::kHostname:
      return "hostname";
  }
  return "unknown";
}

size_t PeerStringLimit(PeerStringField field) {
  switch (field) {
    case PeerStringField::kGpuName:
      return 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
    case PeerStringField::kGpuUuid:
      return 80;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE
    case PeerStringField::kDriverVersion:
      return 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
    case PeerStringField::kNvmlError:
    case PeerStringField::kUnavailableMetric:
      return 256;
    case PeerStringField::kHostname:
      return 253;  // a DNS name
  }
  return 64;
}

bool BoundPeerString(std::string* s, size_t max_bytes) {
  std::string out;
  bool changed = false;
  for (size_t i = 0; i < s->size();) {
    const size_t len = PrintableCharAt(*s, i);
    const size_t keep = len == 0 ? 1 : len;
    if (out.size() + keep > max_bytes) {
      changed = true;
      break;
    }
    if (len == 0) {
      out.push_back('?');
      changed = true;
    } else {
      out.append(*s, i, len);
    }
    i += keep;
  }
  if (changed) *s = std::move(out);
  return changed;
}

void BoundPeerStrings(v1::NodeInfo* node, std::vector<v1::GpuSample>* gpus,
                      PeerStringCounts* counts) {
  if (node != nullptr) {
    Bound(node->mutable_hostname(), PeerStringField::kHostname, counts);
    Bound(node->mutable_driver_version(), PeerStringField::kDriverVersion, counts);
    Bound(node->mutable_nvml_error(), PeerStringField::kNvmlError, counts);
  }
  if (gpus == nullptr) return;
  for (v1::GpuSample& g : *gpus) {
    Bound(g.mutable_name(), PeerStringField::kGpuName, counts);
    Bound(g.mutable_uuid(), PeerStringField::kGpuUuid, counts);
    auto* unavailable = g.mutable_unavailable_metrics();
    // Keys are the agent's own metric names; a value is the driver's text.
    bool rebuild = false;
    for (auto& [key, value] : *unavailable) {
      std::string k = key;
      if (BoundPeerString(&k, PeerStringLimit(PeerStringField::kUnavailableMetric))) rebuild = true;
      Bound(&value, PeerStringField::kUnavailableMetric, counts);
    }
    if (rebuild) {
      google::protobuf::Map<std::string, std::string> bounded;
      for (const auto& [key, value] : *unavailable) {
        std::string k = key;
        Bound(&k, PeerStringField::kUnavailableMetric, counts);
        bounded[k] = value;
      }
      *unavailable = std::move(bounded);
    }
  }
}

}  // namespace stepwatch::agent
