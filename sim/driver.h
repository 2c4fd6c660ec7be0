// Drives real agents with a scenario: each rank's step events go through the agent's Unix socket
// as datagrams, exactly as a training process would send them, and each node's GPU readings are
// written to the fake NVML state file that the agent's NVML library re-reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "analysis/engine.h"
#include "sim/scenario.h"

namespace stepwatch::sim {

struct DriverOptions {
  // Node name -> agent socket path. A node missing here uses socket_dir/<node>.sock.
  std::map<std::string, std::string> sockets;
  std::string socket_dir;
  // Where <node>-nvml.json fake NVML state files are written; empty: no GPU state is written.
  std::string nvml_state_dir;
  // Simulated seconds per real second (2 runs twice as fast as the scenario says).
  double speed = 1.0;
  // Stop after this many steps (0: the scenario's length).
  int64_t max_steps = 0;
};

struct DriverStats {
  int64_t steps = 0;
  int64_t events_sent = 0;
  // Datagrams the socket refused (agent absent or its buffer full): a real client drops them too.
  int64_t events_dropped = 0;
  int64_t gpu_state_writes = 0;
};

// Encodes one sample as the step-event datagram (docs/step-event.md). A sample that breaks the
// rules is encoded as it is: the agent refuses it, as it would a real client's.
std::string EncodeStepEvent(const analysis::StepEvent& sample);

// Encodes one node's GPU readings as a fake NVML state document (docs/fake-nvml.md).
std::string EncodeFakeNvmlState(const std::vector<analysis::GpuSample>& gpus);

class Driver {
 public:
  Driver(Scenario scenario, DriverOptions options);
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // Runs until the scenario ends, max_steps, or Stop(); paced in real time by `speed`.
  absl::Status Run();
  // Safe from another thread or a signal-handling thread.
  void Stop() { stop_.store(true); }
  DriverStats stats() const { return stats_; }

 private:
  std::string SocketFor(const std::string& node) const;
  void Send(const std::string& node, const std::string& payload);
  absl::Status WriteGpuState(const Tick& tick);

  Scenario scenario_;
  DriverOptions options_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  DriverStats stats_;
  // Latest readings per node and GPU index, so each state file always lists every GPU.
  std::map<std::string, std::map<int, analysis::GpuSample>> gpu_state_;
};

}  // namespace stepwatch::sim
