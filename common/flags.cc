#include "common/flags.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/help.h"

namespace stepwatch {
namespace {

bool IsBuiltinFlag(const std::string& name) {
  static const std::set<std::string> kBuiltin = {
      "help",    "helpfull",        "helpshort", "helppackage", "helpon",     "helpmatch",
      "version", "only_check_args", "flagfile",  "fromenv",     "tryfromenv", "undefok"};
  return kBuiltin.count(name) > 0;
}

}  // namespace

void UsageError(absl::string_view program, absl::string_view message) {
  std::fprintf(stderr, "%s: %s\nTry --help.\n", std::string(program).c_str(),
               std::string(message).c_str());
  std::exit(kUsageExitCode);
}

void StartupError(absl::string_view program, absl::string_view message) {
  std::fprintf(stderr, "%s: %s\n", std::string(program).c_str(), std::string(message).c_str());
  std::exit(1);
}

namespace {

// Abseil's --help, --version and --helpon texts for `spec`'s program.
void ConfigureUsage(const FlagsSpec& spec) {
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [spec](absl::string_view file) {
    return ListsFlagsOf(spec, file);
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  // Abseil's --helpon and --helpmatch: "agent/main.cc", not the build machine's absolute path.
  usage_config.normalize_filename = [](absl::string_view file) {
    const size_t last = file.rfind('/');
    const size_t dir = last == absl::string_view::npos || last == 0 ? absl::string_view::npos
                                                                    : file.rfind('/', last - 1);
    return std::string(dir == absl::string_view::npos ? file : file.substr(dir + 1));
  };
  const std::string version = absl::StrCat(spec.program, " ", spec.version, "\n");
  usage_config.version_string = [version]() -> const std::string& { return version; };
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(spec.usage);
}

// Sets the program's own defaults (spec.defaults) before the command line overrides them.
void ApplyDefaults(const FlagsSpec& spec) {
  for (const auto& [name, value] : spec.defaults) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    // A default that does not parse is a mistake in the binary itself, not the user's.
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      StartupError(spec.program, absl::StrCat("bad built-in default for --", name, ": ", error));
    }
  }
}

}  // namespace

std::vector<std::string> ParseFlagsOrExit(int argc, char** argv, const FlagsSpec& spec,
                                          bool allow_positional) {
  ConfigureUsage(spec);
  ApplyDefaults(spec);

  // Rewrite dashed names and check every flag ourselves, so mistakes exit with status 2.
  std::vector<std::string> normalized = {argv[0]};
  std::vector<std::string> positional;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      if (!allow_positional) UsageError(spec.program, absl::StrCat("unexpected argument: ", arg));
      positional.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    const size_t dashes = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    std::string name =
        arg.substr(dashes, eq == std::string::npos ? std::string::npos : eq - dashes);
    for (char& c : name) {
      if (c == '-') c = '_';
    }
    const bool has_value = eq != std::string::npos;
    std::string value = has_value ? arg.substr(eq + 1) : std::string();
    if ((name == "help" || name == "helpshort" || name == "helpfull") && !has_value) {
      // Abseil exits with status 1 after --help; asking for help is not an error. Our own text:
      // Abseil's names flags with underscores and prints the build machine's source paths.
      std::cout << FormatFlagsHelp(spec);
      std::cout.flush();
      std::exit(0);
    }
    if (IsBuiltinFlag(name)) {
      normalized.push_back(absl::StrCat("--", name, has_value ? "=" : "", value));
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) UsageError(spec.program, absl::StrCat("unknown flag --", name));
    if (flag->IsOfType<bool>()) {
      if (negated) {
        if (has_value) UsageError(spec.program, absl::StrCat("--", name, " takes no value"));
        value = "false";
      } else if (!has_value) {
        value = "true";
      }
    } else if (!has_value) {
      if (i + 1 >= argc) UsageError(spec.program, absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      UsageError(spec.program, absl::StrCat("bad value for --", flag->Name(), ": ", error));
    }
    normalized.push_back(absl::StrCat("--", flag->Name(), "=", value));
  }

  std::vector<char*> args;
  args.reserve(normalized.size());
  for (std::string& a : normalized) args.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  return positional;
}

}  // namespace stepwatch
