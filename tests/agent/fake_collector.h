// Test doubles shared by the collector-link and collector-router tests: a real gRPC Ingest server
// on a loopback port (FakeCollector) and fixed GPU and host sources.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gpu/gpu_source.h"
#include "host/host_sampler.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

// A real gRPC Ingest server on a loopback port that records what arrives and acknowledges it the
// way the collector does (highest contiguous seq, moved up to base_seq - 1).
class FakeCollector final : public v1::Ingest::Service {
 public:
  struct Behaviour {
    bool ack = true;
    // Ends each stream with UNAVAILABLE after this many batches (0: never).
    int drop_stream_after = 0;
  };

  ~FakeCollector() override { Shutdown(); }

  // Starts on `port` (0: any free port). Returns the bound port, or 0.
  int Start(int port, Behaviour behaviour) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      behaviour_ = behaviour;
    }
    grpc::ServerBuilder builder;
    int bound = 0;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                             &bound);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    return server_ ? bound : 0;
  }

  void Shutdown() {
    if (server_) {
      // No grace: open streams are cancelled at once, as when a collector dies.
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
      server_.reset();
    }
  }

  grpc::Status Report(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<v1::IngestAck, v1::ReportBatch>* stream) override {
    streams_.fetch_add(1);
    v1::ReportBatch batch;
    int on_this_stream = 0;
    while (stream->Read(&batch)) {
      v1::IngestAck ack;
      Behaviour b;
      {
        std::lock_guard<std::mutex> lock(mu_);
        b = behaviour_;
        all_.push_back(batch);
        uint64_t& w = watermark_[batch.boot_id()];
        if (batch.base_seq() > 0) w = std::max(w, batch.base_seq() - 1);
        auto& seen = seen_[batch.boot_id()];
        if (batch.seq() > w && seen.insert(batch.seq()).second) {
          for (const auto& s : batch.steps()) {
            unique_steps_.push_back(s.step());
            unique_job_steps_.emplace_back(s.job(), s.step());
          }
        }
        while (seen.count(w + 1)) ++w;
        ack.set_boot_id(batch.boot_id());
        ack.set_acked_seq(w);
      }
      if (b.ack && !stream->Write(ack)) break;
      if (b.drop_stream_after > 0 && ++on_this_stream >= b.drop_stream_after) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "dropping the stream on purpose");
      }
    }
    return grpc::Status::OK;
  }

  // Every job named in a batch's released_jobs, in arrival order.
  std::vector<std::string> released_jobs() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const v1::ReportBatch& b : all_) {
      for (const std::string& j : b.released_jobs()) out.push_back(j);
    }
    return out;
  }

  std::vector<v1::ReportBatch> batches() {
    std::lock_guard<std::mutex> lock(mu_);
    return all_;
  }
  // Step numbers of the events in distinct (boot_id, seq) batches, in arrival order.
  std::vector<int64_t> unique_steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return unique_steps_;
  }
  int streams() const { return streams_.load(); }
  // (job, step) of the events in distinct (boot_id, seq) batches: what a collector that dedupes
  // counts.
  std::vector<std::pair<std::string, int64_t>> unique_job_steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return unique_job_steps_;
  }
  // Batches (resends included) that carried GPU samples.
  size_t batches_with_gpus() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& b : all_) n += b.gpus_size() > 0 ? 1 : 0;
    return n;
  }
  // Rank exits in all batches, resends included.
  size_t rank_exits() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& b : all_) n += b.rank_exits_size();
    return n;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  Behaviour behaviour_;
  std::vector<v1::ReportBatch> all_;
  std::map<std::string, uint64_t> watermark_;
  std::map<std::string, std::set<uint64_t>> seen_;
  std::vector<int64_t> unique_steps_;
  std::vector<std::pair<std::string, int64_t>> unique_job_steps_;
  std::atomic<int> streams_{0};
};

class FakeGpus : public gpu::GpuSource {
 public:
  absl::StatusOr<std::vector<v1::GpuSample>> Sample(int64_t now) override {
    std::vector<v1::GpuSample> out(2);
    for (int i = 0; i < 2; ++i) {
      out[i].set_index(i);
      out[i].set_sampled_unix_nanos(now);
      out[i].set_utilization_gpu_ratio(0.5 + i * 0.25);
    }
    return out;
  }
  void DescribeNode(v1::NodeInfo* node) const override {
    node->set_nvml_available(true);
    node->set_gpu_count(2);
    node->set_driver_version("550.54.15");
  }
};

class FakeHost : public host::HostSampler {
 public:
  absl::StatusOr<v1::HostSample> Sample(int64_t now) override {
    v1::HostSample h;
    h.set_sampled_unix_nanos(now);
    h.set_cpu_count(16);
    h.set_cpu_utilization_ratio(0.3);
    return h;
  }
};

}  // namespace stepwatch::agent
