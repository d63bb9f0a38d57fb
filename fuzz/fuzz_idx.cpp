// Fuzz target: data::read_idx on arbitrary bytes (raw IDX, or gzip when the
// bytes start 1f 8b). Contract checked: it returns a uint8 tensor whose
// element count matches its shape, or throws tandem::Error; anything else (a
// crash, a sanitizer report, another exception type, a huge allocation) is a bug.
#include <cstdint>

#include "core/error.h"
#include "data/idx.h"
#include "fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile file;
  const std::string& path = file.fill(data, size);
  try {
    tandem::Tensor t = tandem::data::read_idx(path);
    int64_t numel = 1;
    for (int64_t s : t.shape()) numel *= s;
    if (t.dtype() != tandem::kUInt8 || t.numel() != numel || !t.is_contiguous()) __builtin_trap();
  } catch (const tandem::Error&) {
  }
  return 0;
}
