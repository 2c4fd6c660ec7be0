// Small status helpers: Debian's Abseil 20220623 ships no status macros.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define SW_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status sw_status_ = (expr);      \
    if (!sw_status_.ok()) return sw_status_; \
  } while (0)
