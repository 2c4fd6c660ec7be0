// stepwatch-sim: plays a scenario file through real stepwatch agents (their Unix sockets and their
// fake NVML state files), so that the whole pipeline sees a training job with known faults.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/log.h"
#include "sim/driver.h"
#include "sim/scenario.h"

ABSL_FLAG(std::string, scenario, "", "Scenario JSON file to play (see sim/scenario.h).");
ABSL_FLAG(std::string, socket_dir, "",
          "Directory holding the agents' sockets, named <node>.sock (node-0, node-1, ...).");
ABSL_FLAG(std::vector<std::string>, sockets, {},
          "Explicit node=socket_path pairs, comma separated; they override --socket-dir.");
ABSL_FLAG(std::string, nvml_state_dir, "",
          "Directory where <node>-nvml.json fake NVML state files are written for the agents "
          "(empty: GPU readings are not simulated).");
ABSL_FLAG(double, speed, 1.0, "Simulated seconds per real second.");
ABSL_FLAG(int64_t, steps, 0, "Stop after this many steps (0: the scenario's length).");
ABSL_FLAG(std::string, job, "", "Override the scenario's job id.");

int main(int argc, char** argv) {
  // Block the stop signals before any thread starts; a dedicated thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  stepwatch::FlagsSpec spec;
  spec.program = "stepwatch-sim";
  spec.usage =
      "plays a stepwatch scenario through real agents: step events go to each node's agent socket, "
      "GPU readings to each node's fake NVML state file.\n"
      "  stepwatch-sim --scenario=sim/demo/demo.json --socket-dir=DIR --nvml-state-dir=DIR";
  spec.main_file = "sim/main.cc";
  stepwatch::ParseFlagsOrExit(argc, argv, spec);

  if (absl::GetFlag(FLAGS_scenario).empty()) {
    std::fprintf(stderr, "stepwatch-sim: --scenario is required (try --help)\n");
    return 2;
  }
  auto scenario = stepwatch::sim::LoadScenario(absl::GetFlag(FLAGS_scenario));
  if (!scenario.ok()) {
    std::fprintf(stderr, "stepwatch-sim: %s\n", std::string(scenario.status().message()).c_str());
    return 2;
  }
  if (!absl::GetFlag(FLAGS_job).empty()) scenario->job = absl::GetFlag(FLAGS_job);

  stepwatch::sim::DriverOptions options;
  options.socket_dir = absl::GetFlag(FLAGS_socket_dir);
  options.nvml_state_dir = absl::GetFlag(FLAGS_nvml_state_dir);
  options.speed = absl::GetFlag(FLAGS_speed);
  options.max_steps = absl::GetFlag(FLAGS_steps);
  for (const std::string& pair : absl::GetFlag(FLAGS_sockets)) {
    std::vector<std::string> parts = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      std::fprintf(stderr, "stepwatch-sim: --sockets entry \"%s\" is not node=path\n",
                   pair.c_str());
      return 2;
    }
    options.sockets[parts[0]] = parts[1];
  }
  if (options.socket_dir.empty() && options.sockets.empty()) {
    std::fprintf(stderr, "stepwatch-sim: give --socket-dir or --sockets\n");
    return 2;
  }
  if (options.speed <= 0) {
    std::fprintf(stderr, "stepwatch-sim: --speed must be > 0\n");
    return 2;
  }

  SW_LOG_INFO << "playing scenario \"" << scenario->name << "\" as job " << scenario->job << ": "
              << scenario->nodes << " nodes x " << scenario->gpus_per_node << " GPUs, "
              << scenario->steps << " steps of ~" << scenario->step_seconds << " s, speed "
              << options.speed;
  stepwatch::sim::Driver driver(*scenario, options);
  std::thread signal_thread([&driver, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    driver.Stop();
  });
  absl::Status status = driver.Run();
  // Wake the signal thread if the run ended on its own.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  stepwatch::sim::DriverStats stats = driver.stats();
  SW_LOG_INFO << "done: " << stats.steps << " steps, " << stats.events_sent << " events sent, "
              << stats.events_dropped << " dropped, " << stats.gpu_state_writes
              << " GPU state writes";
  if (!status.ok()) {
    SW_LOG_ERROR << status.message();
    return 1;
  }
  return 0;
}
