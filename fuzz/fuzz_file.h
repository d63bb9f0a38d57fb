// Helper for fuzz targets whose reader takes a path: puts the fuzzer's bytes
// in an anonymous in-memory file (memfd) and hands out its /proc/self/fd path,
// so no disk is touched and nothing is left behind. One per process, reused.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace tandem::fuzz {

class MemFile {
 public:
  MemFile() : fd_(::memfd_create("tandem-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  // Replaces the file's contents with data[0, size).
  const std::string& fill(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace tandem::fuzz
