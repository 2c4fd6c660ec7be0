// Invariant checks: for states the code itself rules out, never for what a peer sends (input is
// validated and answered with an absl::Status).
//
//   SW_CHECK(index < size) << "slot " << index;   // always on: logs file:line and aborts
//   SW_DCHECK(sorted) << "...";                   // compiled out under NDEBUG
//
// The message is evaluated only when the check fails; SW_DCHECK under NDEBUG evaluates neither the
// condition nor the message but still compiles both.
#pragma once

#include <sstream>

namespace stepwatch::check_internal {

// Collects the message of a failed check; its destructor logs it and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream stream_;
};

// Turns the streamed expression into void, so that both branches of the ?: in SW_CHECK match.
// `&` binds looser than `<<`, so the whole message is streamed first.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace stepwatch::check_internal

// A statement, never an expression (the switch makes it one), so the unparenthesised ?:, which the
// streamed message has to follow, cannot bind to operators around a use.
#define SW_CHECK(condition)                        \
  switch (0)                                       \
  case 0:                                          \
  default:                                         \
    (condition)                                    \
        ? static_cast<void>(0)                     \
        : ::stepwatch::check_internal::Voidify() & \
              ::stepwatch::check_internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#ifdef NDEBUG
#define SW_DCHECK(condition) \
  while (false) SW_CHECK(condition)
#else
#define SW_DCHECK(condition) SW_CHECK(condition)
#endif
