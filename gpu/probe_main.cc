// stepwatch-gpu-probe: reads the GPUs and the host the way stepwatch-agent does and prints what it
// read, to check a machine's NVML (or the fake NVML) without a collector.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "common/flags.h"
#include "google/protobuf/text_format.h"
#include "gpu/gpu_source.h"
#include "host/host_sampler.h"

ABSL_FLAG(std::string, nvml_library, "libnvidia-ml.so.1",
          "NVML library to dlopen (a path, or a name the dynamic loader finds).");
ABSL_FLAG(int, samples, 3,
          "Number of readings to print (at least 2 to see NVLink rates, GPM metrics and CPU use).");
ABSL_FLAG(double, interval, 1.0, "Seconds between readings (fractions allowed).");
ABSL_FLAG(std::string, host_root, "", "Prefix for /proc and /sys paths (empty: this machine).");

namespace {

int64_t NowUnixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Text(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(m, &out);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  stepwatch::FlagsSpec spec;
  spec.program = "stepwatch-gpu-probe";
  spec.main_file = "gpu/probe_main.cc";
  spec.usage =
      "Prints what stepwatch reads from NVML and from the host.\n"
      "Usage: stepwatch-gpu-probe [--nvml-library=PATH] [--samples=N] [--interval=SECONDS]\n"
      "       [--host-root=DIR]  (flag names may use dashes or underscores)";
  stepwatch::ParseFlagsOrExit(argc, argv, spec);
  const int samples = absl::GetFlag(FLAGS_samples);
  const double interval = absl::GetFlag(FLAGS_interval);
  if (samples < 1 || samples > 3600 || !(interval > 0) || interval > 3600) {
    fprintf(stderr, "stepwatch-gpu-probe: --samples must be 1..3600, --interval 0..3600 s\n");
    return 2;
  }

  stepwatch::gpu::GpuSourceOptions gpu_options;
  gpu_options.nvml_library = absl::GetFlag(FLAGS_nvml_library);
  std::unique_ptr<stepwatch::gpu::GpuSource> gpus = stepwatch::gpu::OpenNvmlGpuSource(gpu_options);
  stepwatch::host::HostSamplerOptions host_options;
  host_options.root = absl::GetFlag(FLAGS_host_root);
  std::unique_ptr<stepwatch::host::HostSampler> host =
      stepwatch::host::MakeHostSampler(host_options);

  stepwatch::v1::NodeInfo node;
  gpus->DescribeNode(&node);
  printf("# node\n%s", Text(node).c_str());
  printf("# nvml_version %s\n", gpus->NvmlVersion().c_str());
  bool ok = node.nvml_available();
  for (int i = 0; i < samples; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(interval));
    const int64_t now = NowUnixNanos();
    auto gpu_samples = gpus->Sample(now);
    if (!gpu_samples.ok()) {
      printf("# sample %d: GPU error: %s\n", i,
             std::string(gpu_samples.status().message()).c_str());
      ok = false;
    } else {
      for (const auto& g : *gpu_samples)
        printf("# sample %d gpu %d\n%s", i, g.index(), Text(g).c_str());
    }
    auto h = host->Sample(now);
    if (h.ok()) {
      printf("# sample %d host\n%s", i, Text(*h).c_str());
    } else {
      printf("# sample %d: host error: %s\n", i, std::string(h.status().message()).c_str());
    }
  }
  fflush(stdout);
  return ok ? 0 : 1;
}
