// --help of every binary: the flags defined in its main file, spelled with dashes as the documented
// command lines spell them (--max-jobs; underscores work too), and without the source paths of the
// build machine that Abseil's own help prints.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "common/flags.h"

namespace stepwatch {

// spec.usage, then every flag defined in a file whose path ends with spec.main_file or one of
// spec.shared_flag_files, sorted:
//   --name-with-dashes=TYPE  (default: VALUE)
//       help text, wrapped
// then a line on --help and --version.
std::string FormatFlagsHelp(const FlagsSpec& spec);

// Whether --help lists the flags defined in `file` (a path Abseil records).
bool ListsFlagsOf(const FlagsSpec& spec, absl::string_view file);

}  // namespace stepwatch
