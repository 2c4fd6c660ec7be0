#include "common/check.h"

#include <cstdlib>
#include <string>

#include "common/log.h"

namespace stepwatch::check_internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition)
    : file_(file), line_(line), condition_(condition) {}

CheckFailure::~CheckFailure() {
  std::string message = std::string("Check failed: ") + condition_;
  if (stream_.tellp() > 0) message += ": " + stream_.str();
  WriteLogLine(LogLevel::kError, file_, line_, message);
  std::abort();
}

}  // namespace stepwatch::check_internal
