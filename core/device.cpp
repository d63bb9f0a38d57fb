#include "core/device.h"

#include "core/error.h"

namespace tandem {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string idx = text.substr(5);
    bool digits = !idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos;
    TANDEM_CHECK(digits, "bad device '", text, "', expected cpu, cuda or cuda:N");
    return cuda(std::stoi(idx));
  }
  TANDEM_FAIL("bad device '", text, "', expected cpu, cuda or cuda:N");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace tandem
