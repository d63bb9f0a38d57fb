// Autocast state: one thread-local precision, set and restored by AutocastGuard.
// The ops that honour it live in nn/functional.cpp.
#include "nn/amp.h"

#include "core/error.h"

namespace tandem::amp {
namespace {
thread_local Precision t_precision = Precision::kOff;
}  // namespace

Precision parse_precision(const std::string& text) {
  if (text == "off" || text == "none" || text == "fp32") return Precision::kOff;
  if (text == "fp16" || text == "float16") return Precision::kFloat16;
  if (text == "bf16" || text == "bfloat16") return Precision::kBFloat16;
  TANDEM_FAIL("unknown mixed-precision mode '", text, "': expected off, fp16 or bf16");
}

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::kOff: return "off";
    case Precision::kFloat16: return "fp16";
    case Precision::kBFloat16: return "bf16";
  }
  return "off";
}

DType precision_dtype(Precision p) {
  switch (p) {
    case Precision::kFloat16: return kFloat16;
    case Precision::kBFloat16: return kBFloat16;
    case Precision::kOff: break;
  }
  return kFloat32;
}

AutocastGuard::AutocastGuard(Precision p) : previous_(t_precision) { t_precision = p; }
AutocastGuard::~AutocastGuard() { t_precision = previous_; }

Precision autocast_precision() { return t_precision; }

}  // namespace tandem::amp
