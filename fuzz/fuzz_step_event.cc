// The agent's step-event datagram parser: any bytes give a verdict, never a crash, and the fast
// path agrees with the general JSON parser on every input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "absl/strings/string_view.h"
#include "agent/step_event_parser.h"
#include "google/protobuf/util/message_differencer.h"
#include "stepwatch/v1/stepwatch.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view datagram(reinterpret_cast<const char*>(data), size);
  stepwatch::v1::StepEvent fast, general;
  std::optional<stepwatch::agent::Rejection> a = stepwatch::agent::ParseStepEvent(datagram, &fast);
  std::optional<stepwatch::agent::Rejection> b =
      stepwatch::agent::ParseStepEventWithoutFastPath(datagram, &general);
  // Both accept or both reject for the same reason; an accepted event is the same either way
  // (compared by content: a map such as sections serializes in no fixed order).
  if (a.has_value() != b.has_value()) std::abort();
  if (a.has_value() && a->reason != b->reason) std::abort();
  if (!a.has_value() && !google::protobuf::util::MessageDifferencer::Equals(fast, general)) {
    std::abort();
  }
  return 0;
}
