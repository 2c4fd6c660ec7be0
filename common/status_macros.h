// Small status helpers: Debian's Abseil 20220623 ships no status macros.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SW_STATUS_CONCAT_INNER(a, b) a##b
#define SW_STATUS_CONCAT(a, b) SW_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define SW_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status sw_status_ = (expr);      \
    if (!sw_status_.ok()) return sw_status_; \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status from the enclosing
// function.
#define SW_ASSIGN_OR_RETURN(lhs, rexpr) \
  SW_ASSIGN_OR_RETURN_IMPL(SW_STATUS_CONCAT(sw_statusor_, __LINE__), lhs, rexpr)
#define SW_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                             \
  if (!statusor.ok()) return statusor.status();        \
  lhs = std::move(statusor).value()
