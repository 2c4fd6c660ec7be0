// The strict JSON parser: any bytes parse or give an error, never a crash; every string it
// returns is written back by AppendQuoted as JSON that parses to the same string.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/json.h"

namespace {

void CheckStrings(const stepwatch::json::Value& v) {
  using stepwatch::json::Value;
  switch (v.type()) {
    case Value::Type::kString: {
      absl::StatusOr<Value> back = stepwatch::json::Parse(stepwatch::json::Quote(v.as_string()));
      if (!back.ok() || !back->is_string() || back->as_string() != v.as_string()) std::abort();
      break;
    }
    case Value::Type::kArray:
      for (const Value& e : v.as_array()) CheckStrings(e);
      break;
    case Value::Type::kObject:
      for (const auto& [key, e] : v.as_object()) CheckStrings(e);
      break;
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<stepwatch::json::Value> v = stepwatch::json::Parse(text);
  if (v.ok()) CheckStrings(*v);
  return 0;
}
