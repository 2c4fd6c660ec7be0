// Checks a daemon makes before it says "ready", so that a mistake in its flags (a port already in
// use, a state directory it cannot write) stops it at once with one clear line instead of library
// noise or failures much later.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace stepwatch {

// Binds, then closes, a TCP socket on every address HOST:PORT resolves to, the way a listener
// would (SO_REUSEADDR, no SO_REUSEPORT). Port 0 always succeeds. The error message is the reason
// alone, e.g. "address already in use".
absl::Status CheckCanListen(absl::string_view address);

// Creates `dir` with its parents when missing and checks that a file can be created in it.
absl::Status EnsureWritableDirectory(const std::string& dir);

}  // namespace stepwatch
