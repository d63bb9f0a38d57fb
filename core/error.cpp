#include "core/error.h"

#include <cstring>

namespace tandem::detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  // Keep only the path below the source root so messages stay short.
  const char* base = std::strrchr(file, '/');
  std::string where = base ? std::string(base + 1) : std::string(file);
  std::string text = msg.empty() ? std::string("check failed: ") + (cond ? cond : "") : msg;
  throw Error(text, where + ":" + std::to_string(line));
}

}  // namespace tandem::detail
