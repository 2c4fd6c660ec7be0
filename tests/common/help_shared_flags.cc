// A flag defined outside the test's main file, as the binaries' shared flags are (http/,
// security/).
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, shared_test_listen, "", "Where to listen; empty: nowhere.");
