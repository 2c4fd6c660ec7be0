// --help of every binary: the flags defined in its main file, spelled with dashes as the documented
// command lines spell them (--max-jobs; underscores work too), and without the source paths of the
// build machine that Abseil's own help prints.
#pragma once

#include <string>

#include "common/flags.h"

namespace stepwatch {

// spec.usage, then every flag defined in a file whose path ends with spec.main_file, sorted:
//   --name-with-dashes=TYPE  (default: VALUE)
//       help text, wrapped
// then a line on --help and --version.
std::string FormatFlagsHelp(const FlagsSpec& spec);

}  // namespace stepwatch
