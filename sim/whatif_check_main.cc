// stepwatch-whatif-check: the engine's what-ifs against the trace-driven simulator on every
// committed trace (sim/whatif_check.h); prints a Markdown table and exits 1 when one is off.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "common/flags.h"
#include "sim/whatif_check.h"

ABSL_FLAG(std::string, traces, "sim/traces", "Directory of the converted trace CSVs.");
ABSL_FLAG(std::string, pai, "../shared/data/pai-minibatch",
          "Directory of the Alibaba PAI job_N_norm.csv files (empty: leave them out).");
ABSL_FLAG(double, tolerance, 0.10, "Largest relative error of an estimate.");

int main(int argc, char** argv) {
  stepwatch::FlagsSpec spec;
  spec.program = "stepwatch-whatif-check";
  spec.usage =
      "compares the engine's what-if speed-ups with a trace-driven simulation of each trace.\n"
      "  stepwatch-whatif-check [--traces=sim/traces] [--pai=../shared/data/pai-minibatch]";
  spec.main_file = "sim/whatif_check_main.cc";
  stepwatch::ParseFlagsOrExit(argc, argv, spec);
  auto checks = stepwatch::sim::CheckAll(absl::GetFlag(FLAGS_traces), absl::GetFlag(FLAGS_pai),
                                         absl::GetFlag(FLAGS_tolerance));
  if (!checks.ok()) {
    std::fprintf(stderr, "stepwatch-whatif-check: %s\n",
                 std::string(checks.status().message()).c_str());
    return 2;
  }
  std::fputs(stepwatch::sim::MarkdownTable(*checks).c_str(), stdout);
  for (const auto& c : *checks) {
    for (const auto& r : c.rows) {
      if (!r.ok) return 1;
    }
  }
  return 0;
}
