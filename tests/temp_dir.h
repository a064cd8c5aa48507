// A fresh directory for one test's files, removed after it.
#pragma once

#include <filesystem>
#include <string>
#include <unistd.h>

namespace loom::test {

class TempDir {
 public:
  // <system temp>/loom_<name>_<pid>, emptied first.
  explicit TempDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("loom_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& file) const { return (path_ / file).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace loom::test
