// The collector's finished-job report files (protobuf JSON, one per job, loaded at start): the
// input is written as the report file of job "fuzz-job" and loaded into a fresh ReportStore, which
// is then listed, queried and flushed (a report past
// its retention is deleted). A file the store cannot use is skipped, never a crash.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "collector/report_store.h"

namespace {

// One scratch directory per process, removed at exit.
class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/stepwatch-fuzz-report-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ScratchDir dir;
  const std::string job = "fuzz-job";
  const std::string file = dir.path() + "/" + stepwatch::collector::ReportStore::FileName(job);
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  stepwatch::collector::ReportStoreOptions options;
  options.dir = dir.path();
  stepwatch::collector::ReportStore store(options);
  // "Now" is fixed so that a run is repeatable.
  if (!store.Load(1'700'000'000'000'000'000).ok()) std::abort();
  for (const auto& r : store.List()) (void)store.Get(r.job());
  (void)store.Flush();
  return 0;
}
