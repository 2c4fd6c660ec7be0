// The scenario format (sim/scenario.h): any bytes parse or give an error, never a crash. A small
// scenario that parses is also played for a few steps through the generator.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sim/scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<stepwatch::sim::Scenario> sc = stepwatch::sim::ParseScenario(text);
  if (!sc.ok()) return 0;
  // Large jobs are valid but would make one run slow; the parser is what is under test.
  int64_t nodes = sc->nodes;
  for (const auto& f : sc->faults) nodes = std::max<int64_t>(nodes, f.nodes);  // rescale
  if (nodes * (sc->gpus_per_node + sc->idle_gpus_per_node) > 64) return 0;
  stepwatch::sim::Generator gen(*sc);
  stepwatch::sim::Tick tick;
  for (int i = 0; i < 16 && gen.Next(&tick); ++i) {
  }
  return 0;
}
