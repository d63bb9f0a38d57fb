// Autocast (mixed precision) state, as PyTorch's torch.autocast.
// Owns: the thread-local autocast precision and the guard that sets it.
// Assumes: callers run forward on the thread that created the guard (backward
//   needs no autocast state: each cast records its own backward).
// Guarantees: under AutocastGuard(p) with p != kOff, F::conv2d and F::linear cast
//   input, weight and bias to p's dtype, compute, and return p-typed outputs whose
//   gradients flow back to the f32 master weights as f32. Ops that need f32
//   (batch_norm, log_softmax, nll_loss, losses) cast a half input up at entry (the batch norms
//   read a CPU bf16 input directly instead, with the same results).
//   Guards nest; the destructor restores the previous precision.
#pragma once

#include <string>

#include "core/dtype.h"

namespace tandem::amp {

enum class Precision { kOff, kFloat16, kBFloat16 };

// "off" | "fp16" | "bf16" (also "none", "float16", "bfloat16"); anything else throws
// tandem::Error naming the text and the accepted values.
Precision parse_precision(const std::string& text);
std::string precision_name(Precision p);  // "off" | "fp16" | "bf16"
DType precision_dtype(Precision p);       // kFloat32 for kOff, else kFloat16 / kBFloat16

class AutocastGuard {
 public:
  explicit AutocastGuard(Precision p);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  Precision previous_;
};

Precision autocast_precision();  // current, for this thread
inline bool autocast_enabled() { return autocast_precision() != Precision::kOff; }

}  // namespace tandem::amp
