// The third-party headers most unit tests include, precompiled once for all of them
// (STEPWATCH_TEST_PCH in tests/CMakeLists.txt): parsing them was about half of each test's compile
// time. Only headers from outside stepwatch: a test must still include what it uses, and builds
// without the precompiled header (STEPWATCH_TEST_PCH=OFF) prove it does.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
