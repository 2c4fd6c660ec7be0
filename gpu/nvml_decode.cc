#include "gpu/nvml_decode.h"

#include <charconv>
#include <cstring>

namespace stepwatch::gpu {
namespace {

// Leading decimal number of `s`, advancing it past the digits; nullopt when there is none.
std::optional<unsigned int> TakeNumber(std::string_view* s) {
  unsigned int value = 0;
  const char* begin = s->data();
  const char* end = s->data() + s->size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr == begin) return std::nullopt;
  s->remove_prefix(static_cast<size_t>(ptr - begin));
  return value;
}

}  // namespace

size_t ProcessEntrySizeOfV3(std::string_view driver_version) {
  std::string_view rest = driver_version;
  std::optional<unsigned int> major = TakeNumber(&rest);
  if (!major || rest.empty() || rest.front() != '.') return sizeof(nvml::ProcessInfoV2);
  rest.remove_prefix(1);
  std::optional<unsigned int> minor = TakeNumber(&rest);
  if (!minor) return sizeof(nvml::ProcessInfoV2);
  // 535.43.02 introduced the 32-byte entry without a version bump; 535.98 removed _v3 and 535.104
  // restored the 24-byte entry, so every 535.x below 98 from 43 on writes 32 bytes.
  if (*major == 535 && *minor >= 43 && *minor < 98) return sizeof(nvml::ProcessInfoV3Cc);
  return sizeof(nvml::ProcessInfoV2);
}

std::vector<unsigned int> PidsFromProcessBuffer(const std::vector<unsigned char>& buffer,
                                                size_t entry_size, unsigned int count) {
  std::vector<unsigned int> pids;
  if (entry_size < sizeof(unsigned int)) return pids;
  for (size_t i = 0; i < count; ++i) {
    const size_t offset = i * entry_size;
    if (offset + entry_size > buffer.size()) break;
    unsigned int pid = 0;
    memcpy(&pid, buffer.data() + offset, sizeof(pid));
    pids.push_back(pid);
  }
  return pids;
}

std::optional<unsigned long long> FieldValueAsCounter(const nvml::FieldValue& v) {
  switch (v.value_type) {
    case nvml::kValueTypeDouble:
      if (!(v.value.d_val >= 0)) return std::nullopt;
      return static_cast<unsigned long long>(v.value.d_val);
    case nvml::kValueTypeUnsignedInt:
      return v.value.ui_val;
    case nvml::kValueTypeUnsignedLong:
      return v.value.ul_val;
    case nvml::kValueTypeUnsignedLongLong:
      return v.value.ull_val;
    case nvml::kValueTypeSignedLongLong:
      if (v.value.sll_val < 0) return std::nullopt;
      return static_cast<unsigned long long>(v.value.sll_val);
    case nvml::kValueTypeSignedInt:
      if (v.value.si_val < 0) return std::nullopt;
      return static_cast<unsigned long long>(v.value.si_val);
    case nvml::kValueTypeUnsignedShort:
      return v.value.us_val;
    default:
      return std::nullopt;
  }
}

}  // namespace stepwatch::gpu
