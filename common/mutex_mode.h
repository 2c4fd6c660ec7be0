// Abseil's mutex deadlock detection records every lock acquisition in a graph (GraphCycles) and
// is on wherever Abseil itself was built without NDEBUG, as Debian's is: a few percent of a busy
// collector's CPU. Release builds of stepwatch turn it off; debug builds keep Abseil's default.
#pragma once

#include "absl/synchronization/mutex.h"

namespace stepwatch {

// Call first thing in main, before any thread starts.
inline void DisableMutexDeadlockDetectionInReleaseBuilds() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace stepwatch
