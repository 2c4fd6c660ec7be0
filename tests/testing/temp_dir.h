// A private temporary directory for one test, removed with everything in it at the end.
#pragma once

#include <string>

namespace stepwatch::test {

class TempDir {
 public:
  // Creates $TEST_TMPDIR/<prefix>-XXXXXX (gtest's ::testing::TempDir(), usually /tmp); the test
  // fails (non-fatally) and path() is empty when it cannot.
  explicit TempDir(const std::string& prefix = "stepwatch-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name.
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace stepwatch::test
