#include "tests/testing/temp_dir.h"

#include <stdlib.h>

#include <filesystem>
#include <system_error>

#include "gtest/gtest.h"

namespace stepwatch::test {

TempDir::TempDir(const std::string& prefix) {
  std::string base = ::testing::TempDir();
  if (!base.empty() && base.back() != '/') base.push_back('/');
  std::string templ = base + prefix + "-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << " failed";
    return;
  }
  path_ = templ;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code error;
  std::filesystem::remove_all(path_, error);
  // A test that made part of the tree unreadable (permission tests) still cleans up what it can.
  if (error) ADD_FAILURE() << "cannot remove " << path_ << ": " << error.message();
}

}  // namespace stepwatch::test
