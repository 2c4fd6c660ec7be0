#include "common/help.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace stepwatch {
namespace {

constexpr size_t kWidth = 100;
constexpr char kIndent[] = "      ";

// What the value looks like, from the flag's C++ type.
std::string ValueName(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "";
  if (flag.IsOfType<int32_t>() || flag.IsOfType<int64_t>() || flag.IsOfType<uint32_t>() ||
      flag.IsOfType<uint64_t>()) {
    return "=INT";
  }
  if (flag.IsOfType<double>() || flag.IsOfType<float>()) return "=NUMBER";
  return "=TEXT";
}

// `text` wrapped at kWidth columns after kIndent.
void AppendWrapped(std::string* out, const std::string& text) {
  std::string line = kIndent;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line.size() > sizeof(kIndent) - 1 && line.size() + 1 + word.size() > kWidth) {
      absl::StrAppend(out, line, "\n");
      line = kIndent;
    }
    if (line.size() > sizeof(kIndent) - 1) line += ' ';
    absl::StrAppend(&line, word);
  }
  if (line.size() > sizeof(kIndent) - 1) absl::StrAppend(out, line, "\n");
}

// Help texts sometimes name flags the Abseil way (--max_jobs): say them with dashes.
std::string DashFlagNames(const std::string& text) {
  std::string out = text;
  for (size_t i = out.find("--"); i != std::string::npos; i = out.find("--", i)) {
    i += 2;
    for (; i < out.size() && (absl::ascii_isalnum(out[i]) || out[i] == '_'); ++i) {
      if (out[i] == '_') out[i] = '-';
    }
  }
  return out;
}

}  // namespace

bool ListsFlagsOf(const FlagsSpec& spec, absl::string_view file) {
  if (absl::EndsWith(file, spec.main_file)) return true;
  for (const std::string& shared : spec.shared_flag_files) {
    if (absl::EndsWith(file, shared)) return true;
  }
  return false;
}

std::string FormatFlagsHelp(const FlagsSpec& spec) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!flag->IsRetired() && ListsFlagsOf(spec, flag->Filename())) {
      flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  std::string out =
      absl::StrCat(spec.program, ": ", spec.usage,
                   "\n\nFlags (--flag-name=VALUE or --flag-name VALUE; underscores work too, "
                   "--flag_name):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string name = absl::StrReplaceAll(flag->Name(), {{"_", "-"}});
    // The current value before parsing is this binary's default (FlagsSpec::defaults).
    std::string value = flag->CurrentValue();
    if (flag->IsOfType<std::string>()) value = absl::StrCat("\"", value, "\"");
    absl::StrAppend(&out, "  --", name, ValueName(*flag), "  (default: ", value, ")\n");
    AppendWrapped(&out, DashFlagNames(flag->Help()));
  }
  absl::StrAppend(&out, "\n  --help  this text; --version  the version\n");
  return out;
}

}  // namespace stepwatch
