// Fuzz target: load_safetensors and load_safetensors_metadata on arbitrary
// bytes. Contract checked: every loaded tensor is contiguous and its byte size
// matches its shape and dtype, the two loads agree on success, or
// tandem::Error is thrown; anything else is a bug.
#include <cstdint>

#include "core/error.h"
#include "core/safetensors.h"
#include "fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile file;
  const std::string& path = file.fill(data, size);
  bool loaded = false;
  try {
    tandem::TensorMap m = tandem::load_safetensors(path);
    loaded = true;
    for (const auto& [name, t] : m) {
      int64_t numel = 1;
      for (int64_t s : t.shape()) numel *= s;
      if (name.empty() || t.numel() != numel || !t.is_contiguous() ||
          t.nbytes() != static_cast<size_t>(numel) * tandem::element_size(t.dtype()))
        __builtin_trap();
    }
  } catch (const tandem::Error&) {
  }
  try {
    tandem::load_safetensors_metadata(path);
  } catch (const tandem::Error&) {
    if (loaded) __builtin_trap();  // the metadata of a loadable file must load too
  }
  return 0;
}
