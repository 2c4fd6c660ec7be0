// Command-line parsing shared by the binaries. The documented command lines spell flags with
// dashes (--metrics-listen); Abseil names them with underscores. Both spellings are accepted.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/version.h"

namespace stepwatch {

struct FlagsSpec {
  std::string program;  // e.g. "stepwatch-agent"
  std::string usage;    // first lines of --help
  // --help lists the flags defined in the file whose path ends with this (e.g. "agent/main.cc").
  std::string main_file;
  // Files of flags shared by several binaries (e.g. "http/metrics_endpoint_flags.cc") that this
  // one links and --help lists too.
  std::vector<std::string> shared_flag_files;
  // This binary's defaults for shared flags, (name, value): set before parsing, and shown by
  // --help as the default.
  std::vector<std::pair<std::string, std::string>> defaults;
  std::string version = kVersion;  // --version prints "<program> <version>"
};

// Exit status for a command-line mistake.
inline constexpr int kUsageExitCode = 2;

// Parses the command line into the Abseil flags. An unknown flag, a missing or malformed value, or
// an unexpected argument prints one line and exits with kUsageExitCode (Abseil alone would exit
// with 1). Returns the positional arguments (after the program name), when `allow_positional`.
std::vector<std::string> ParseFlagsOrExit(int argc, char** argv, const FlagsSpec& spec,
                                          bool allow_positional = false);

// Prints "<program>: <message>\nTry --help." to stderr and exits with kUsageExitCode.
[[noreturn]] void UsageError(absl::string_view program, absl::string_view message);

// Prints "<program>: <message>" to stderr and exits with status 1: the flags parse but the process
// cannot run with them (a port already in use, a directory it cannot write).
[[noreturn]] void StartupError(absl::string_view program, absl::string_view message);

}  // namespace stepwatch
