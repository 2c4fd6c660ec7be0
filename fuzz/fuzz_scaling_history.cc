// The scaling-history state file the collector saves and loads at start: any bytes load or give
// an error, never a crash; what loads is written back in a form that loads to the same text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "analysis/engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  stepwatch::analysis::Engine engine{stepwatch::analysis::EngineOptions{}};
  if (!engine.LoadScalingHistory(text).ok()) return 0;
  const std::string saved = engine.SerializeScalingHistory();
  stepwatch::analysis::Engine again{stepwatch::analysis::EngineOptions{}};
  if (!again.LoadScalingHistory(saved).ok()) std::abort();
  if (again.SerializeScalingHistory() != saved) std::abort();
  return 0;
}
