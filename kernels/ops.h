// The op table. TANDEM_OPS lists each table op once, with the signature its kernels share; every
// backend fills a Backend (a function pointer per op) in one registration file
// (kernels/cpu/ops.cpp, kernels/cuda/ops.cpp), and one entry point per op, in kernels/<family>.cpp
// with the same signature, checks its operands, opens the profiler scope, picks the fast path (a
// kernel of TANDEM_OPS_FAST_PATHS, which have no entry point of their own) and calls the kernel of
// the operands' backend through kernel_for (never the backend's namespace).
// tests/kernels/backend_ops_test.cpp runs a list of cases per op on every backend present and
// fails on an op a backend registers without a case list.
//
// Adding an op: one line in TANDEM_OPS; the kernel, named as the op, in each backend's namespace
// (kernels/cpu/<family>.cpp, kernels/cuda/<family>.cu: the declarations come from this list); its
// entry point (declared in kernels/<family>.h, defined in kernels/<family>.cpp); its cases in
// tests/kernels/backend_ops_cases.h. docs/architecture.md ("The op table") walks through cumsum.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/activation.h"
#include "kernels/amp.h"
#include "kernels/attention.h"
#include "kernels/avg_pool.h"
#include "kernels/batch_norm.h"
#include "kernels/batch_norm_pool.h"
#include "kernels/conv.h"
#include "kernels/conv_bn_pool.h"
#include "kernels/conv_pair.h"
#include "kernels/index.h"
#include "kernels/layer_norm.h"
#include "kernels/linear.h"
#include "kernels/loss.h"
#include "kernels/optim.h"
#include "kernels/pointwise.h"
#include "kernels/pool.h"
#include "kernels/reduce.h"
#include "kernels/scan.h"

// X(op, signature): the kernels of `op` have type `signature` (a function type), as its entry point.
// TANDEM_OPS is every op: those each backend has (TANDEM_OPS_EVERY_BACKEND: the general ops of
// TANDEM_OPS_GENERAL and the fast paths of TANDEM_OPS_FAST_PATHS, which have no entry point of their
// own) and those only the CPU has (TANDEM_OPS_CPU_ONLY: fused fast paths, whose entry points compose
// the plain ops elsewhere). TANDEM_OPS_ENTRY_POINTS is every op with an entry point of its own.
#define TANDEM_OPS(X) TANDEM_OPS_EVERY_BACKEND(X) TANDEM_OPS_CPU_ONLY(X)
#define TANDEM_OPS_ENTRY_POINTS(X) TANDEM_OPS_GENERAL(X) TANDEM_OPS_CPU_ONLY(X)

// A family's ops may sit in a list of their own, named in TANDEM_OPS_EVERY_BACKEND (docs/embedding.md
// quotes this one as the example of adding an op).
// [op-declare]
// kernels/activation.h: relu, and its backward from the output y (y > 0 exactly where x > 0).
#define TANDEM_OPS_ACTIVATION(X)           \
  X(relu_forward, Tensor(const Tensor& x)) \
  X(relu_backward, Tensor(const Tensor& grad_out, const Tensor& y))
// [op-declare]

// Fast paths every backend has, with no entry point of their own: a general op's entry point takes
// one where its operands allow (the same values, but for the order of a sum's additions) and
// counts it in fast_path_count.
#define TANDEM_OPS_FAST_PATHS(X)                                                                           \
  /* binary (same-shape Add, Sub, Mul) and binary with a scalar (Mul): no broadcasting, no stride walk */ \
  X(add, Tensor(const Tensor& a, const Tensor& b))                                                         \
  X(sub, Tensor(const Tensor& a, const Tensor& b))                                                         \
  X(mul, Tensor(const Tensor& a, const Tensor& b))                                                         \
  X(scale, Tensor(const Tensor& a, double s))                                                              \
  /* sum_dims over every dimension; argmax_dim of [N, C] over dim 1 */                                     \
  X(sum, Tensor(const Tensor& a))                                                                          \
  X(argmax, Tensor(const Tensor& a))                                                                       \
  /* softmax_forward/backward with log over dim 1 of [N, C]: one pass per row */                           \
  X(log_softmax_forward, Tensor(const Tensor& x))                                                          \
  X(log_softmax_backward, Tensor(const Tensor& grad_out, const Tensor& y))                                 \
  /* nll_loss_forward/backward of [N, C] rows, reduction "mean", no class weights: one pass */            \
  X(nll_loss_mean_forward, Tensor(const Tensor& log_probs, const Tensor& target, int64_t ignore_index))   \
  X(nll_loss_mean_backward,                                                                                \
    Tensor(const Tensor& grad_out, const Tensor& log_probs, const Tensor& target, int64_t ignore_index))

#define TANDEM_OPS_EVERY_BACKEND(X) TANDEM_OPS_FAST_PATHS(X) TANDEM_OPS_GENERAL(X)

// The ops with an entry point each (kernels/<family>.h), filled by every backend.
#define TANDEM_OPS_GENERAL(X)                                                                              \
  /* kernels/pointwise.h: broadcasting binary ops and their backward, comparisons, where, unary math */    \
  X(binary, Tensor(BinaryOp op, const Tensor& a, const Tensor& b))                                         \
  X(binary_backward,                                                                                       \
    Tensor(BinaryOp op, int which, const Tensor& grad, const Tensor& a, const Tensor& b, const Tensor& y)) \
  X(compare, Tensor(CompareOp op, const Tensor& a, const Tensor& b))                                       \
  X(where, Tensor(const Tensor& cond, const Tensor& a, const Tensor& b))                                   \
  X(unary, Tensor(UnaryOp op, const Tensor& x))                                                            \
  X(unary_backward, Tensor(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y))              \
  /* kernels/reduce.h: reductions over dimensions (wrapped, sorted, distinct), softmax */                  \
  X(sum_dims, Tensor(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim))                     \
  X(max_dim, MaxResult(const Tensor& x, int64_t dim, bool keepdim))                                        \
  X(amax, Tensor(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim))                         \
  X(softmax_forward, Tensor(const Tensor& x, int64_t dim, bool log))                                       \
  X(softmax_backward, Tensor(const Tensor& grad, const Tensor& y, int64_t dim, bool log))                  \
  /* kernels/scan.h: products, cumulative sums and sorting along one (wrapped) dimension */                \
  X(prod_dim, Tensor(const Tensor& x, int64_t dim, bool keepdim))                                          \
  X(prod_dim_backward, Tensor(const Tensor& grad, const Tensor& x, int64_t dim))                           \
  X(cumsum, Tensor(const Tensor& x, int64_t dim, bool reverse))                                           \
  X(argsort, Tensor(const Tensor& x, int64_t dim, bool descending))                                       \
  /* kernels/pool.h, kernels/avg_pool.h: pooling over [N, C, H, W]. The average pools' entry points */    \
  /* (avg_pool2d_*, adaptive_avg_pool2d_*) turn their arguments into the windows (PoolGeometry) */         \
  X(max_pool2d_forward, MaxPool2dForward(const Tensor& x, const MaxPool2dArgs& args))                      \
  X(max_pool2d_backward, Tensor(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape))   \
  X(avg_pool_forward, Tensor(const Tensor& x, const PoolGeometry& geometry))                               \
  X(avg_pool_backward, Tensor(const Tensor& grad_out, const Shape& input_shape, const PoolGeometry& geometry)) \
  /* kernels/index.h: indexing along a dimension (indices checked by the entry points), batched GEMM */    \
  X(index_select, Tensor(const Tensor& x, int64_t dim, const Tensor& index))                               \
  X(index_add, Tensor(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src, int64_t skip)) \
  X(gather, Tensor(const Tensor& x, int64_t dim, const Tensor& index))                                     \
  X(scatter_add, Tensor(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src))          \
  X(bmm, Tensor(const Tensor& a, const Tensor& b))                                                         \
  /* kernels/linear.h: x [M, K] W^T + b and its backward; 2-D matmul */                                    \
  X(linear_forward, Tensor(const Tensor& x, const Tensor& weight, const Tensor& bias))                     \
  X(linear_backward, LinearGrads(const Tensor& grad_out, const Tensor& x, const Tensor& weight, bool need_input, \
                                 bool need_weight, bool need_bias))                                        \
  X(matmul, Tensor(const Tensor& a, const Tensor& b))                                                      \
  /* kernels/loss.h: the class-target pass (nll_loss's general path and cross_entropy) */                 \
  X(class_targets, ClassTargets(const Tensor& target, int64_t C, int64_t ignore_index, DType keep_dtype))  \
  /* kernels/layer_norm.h: normalisation over the last norm_size elements of each row */                    \
  X(layer_norm_forward,                                                                                    \
    LayerNormForward(const Tensor& x, int64_t norm_size, const Tensor& weight, const Tensor& bias, double eps)) \
  X(layer_norm_backward, LayerNormGrads(const Tensor& grad_out, const Tensor& x, const Tensor& mean,        \
                                        const Tensor& rstd, const Tensor& weight, bool need_input,         \
                                        bool need_weight, bool need_bias))                                 \
  TANDEM_OPS_ACTIVATION(X)                                                                                 \
  /* kernels/batch_norm.h: batch_norm over the channels of [N, C, ...] */                                  \
  X(batch_norm_forward, BatchNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,        \
                                         const Tensor& running_mean, const Tensor& running_var,            \
                                         bool training, double momentum, double eps))                      \
  X(batch_norm_backward, BatchNormGrads(const Tensor& grad_out, const Tensor& x, const Tensor& weight,     \
                                        const Tensor& save_mean, const Tensor& save_invstd, bool training, \
                                        bool need_input, bool need_weight, bool need_bias))                \
  /* kernels/conv.h: conv2d and its backward */                                                            \
  X(conv2d_forward, Tensor(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args)) \
  X(conv2d_backward, Conv2dGrads(const Tensor& grad_out, const Tensor& x, const Tensor& weight,            \
                                 const Conv2dArgs& args, bool need_input, bool need_weight, bool need_bias)) \
  /* kernels/optim.h: the optimizers' fused updates, in place */                                           \
  X(sgd_update, void(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& step)) \
  X(adadelta_update, void(const Tensor& param, const Tensor& grad, const Tensor& square_avg,               \
                          const Tensor& acc_delta, const AdadeltaStep& step))                              \
  X(adam_update, void(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,                      \
                      const Tensor& exp_avg_sq, const AdamStep& step))                                     \
  /* kernels/amp.h: dtype casts, GradScaler's unscale + non-finite check (in place) */                     \
  X(cast, Tensor(const Tensor& x, DType to))                                                               \
  X(unscale_and_check_, void(const Tensor& grad, const Tensor& found_inf, double inv_scale))               \
  /* kernels/pointwise.h: dropout's scaled keep mask */                                                    \
  X(dropout_mask, Tensor(const Shape& shape, double p, DType dtype, Device device, Generator& gen))

// Fast paths only the CPU has; on other backends their entry points compose the plain ops (or refuse).
#define TANDEM_OPS_CPU_ONLY(X)                                                                             \
  /* kernels/batch_norm.h, kernels/batch_norm_pool.h: relu(batch_norm(x)) and its 2x2 max-pool, fused */   \
  X(batch_norm_relu_forward, BatchNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias,   \
                                              const Tensor& running_mean, const Tensor& running_var,       \
                                              bool training, double momentum, double eps))                 \
  X(batch_norm_relu_backward,                                                                              \
    BatchNormGrads(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& bias,      \
                   const Tensor& save_mean, const Tensor& save_invstd, bool training, bool need_input,     \
                   bool need_weight, bool need_bias))                                                      \
  X(batch_norm_relu_max_pool2d_forward,                                                                    \
    BatchNormReluPoolForward(const Tensor& x, const Tensor& weight, const Tensor& bias,                    \
                             const Tensor& running_mean, const Tensor& running_var, bool training,         \
                             double momentum, double eps))                                                 \
  X(batch_norm_relu_max_pool2d_backward,                                                                   \
    BatchNormGrads(const Tensor& grad_out, const Tensor& x, const Tensor& code, const Tensor& winner,      \
                   const Tensor& weight, const Tensor& bias, const Tensor& save_mean,                      \
                   const Tensor& save_invstd, bool training, bool need_input, bool need_weight,            \
                   bool need_bias))                                                                        \
  /* kernels/conv_bn_pool.h: a one-channel 3x3 conv and the fused batch norm + relu + max-pool after it */ \
  X(conv_batch_norm_relu_max_pool2d_forward,                                                               \
    BatchNormReluPoolForward(const Tensor& x, const Tensor& conv_weight, const Tensor& conv_bias,          \
                             const Tensor& weight, const Tensor& bias, const Tensor& running_mean,         \
                             const Tensor& running_var, bool training, double momentum, double eps))       \
  X(conv_batch_norm_relu_max_pool2d_backward,                                                              \
    ConvBatchNormReluPoolGrads(const Tensor& grad_out, const Tensor& x, const Tensor& conv_weight,         \
                               const Tensor& conv_bias, const BatchNormReluPoolForward& forward,           \
                               const Tensor& weight, const Tensor& bias, bool training,                    \
                               bool need_conv_weight, bool need_conv_bias, bool need_weight,               \
                               bool need_bias))                                                            \
  /* kernels/conv_pair.h: a 3x3 stride-2 conv and the 1x1 stride-2 projection of the same input */       \
  X(conv2d_pair_forward, Conv2dPair(const Tensor& x, const Tensor& main_weight, const Tensor& projection_weight)) \
  X(conv2d_pair_backward, Conv2dPairGrads(const Tensor& grad_main, const Tensor& grad_projection,           \
                                          const Tensor& x, const Tensor& main_weight,                      \
                                          const Tensor& projection_weight, bool need_input,                \
                                          bool need_main_weight, bool need_projection_weight))             \
  /* kernels/attention.h: fused scaled dot-product attention (CUDA composes it in nn/attention.cpp) */    \
  X(attention_forward,                                                                                     \
    AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool is_causal))     \
  X(attention_backward, AttentionGrads(const Tensor& grad_out, const Tensor& q, const Tensor& k,           \
                                       const Tensor& v, const Tensor& out, const Tensor& lse,              \
                                       double scale, bool is_causal))

namespace tandem::kernels {

// op_sig::<op>: the function type of op's kernels and entry point.
namespace op_sig {
#define TANDEM_OP_SIGNATURE(op, ...) using op = __VA_ARGS__;
TANDEM_OPS(TANDEM_OP_SIGNATURE)
#undef TANDEM_OP_SIGNATURE
}  // namespace op_sig

// The kernels of each backend, declared from the list (defined in kernels/cpu/, kernels/cuda/).
#define TANDEM_OP_DECLARE(op, ...) op_sig::op op;
namespace cpu {
TANDEM_OPS(TANDEM_OP_DECLARE)
}  // namespace cpu
namespace cuda {
TANDEM_OPS_EVERY_BACKEND(TANDEM_OP_DECLARE)
}  // namespace cuda
#undef TANDEM_OP_DECLARE

// One backend's kernels; an op it lacks stays null (its entry point then throws naming both).
struct Backend {
  const char* backend_name = "";
#define TANDEM_OP_SLOT(op, ...) op_sig::op* op = nullptr;
  TANDEM_OPS(TANDEM_OP_SLOT)
#undef TANDEM_OP_SLOT
};

// A Backend named `label` holding every op of `list` (TANDEM_OPS, or TANDEM_OPS_EVERY_BACKEND for a
// backend without the CPU's fast paths) from the namespace aliased `backend_ns`: the table of a
// registration file (kernels/cpu/ops.cpp: backend_ns = cpu, list = TANDEM_OPS).
#define TANDEM_OP_REGISTER(op, ...) b.op = &backend_ns::op;
#define TANDEM_BACKEND_TABLE(label, list) \
  [] {                                    \
    Backend b;                            \
    b.backend_name = label;               \
    list(TANDEM_OP_REGISTER)              \
    return b;                             \
  }()

const Backend& cpu_backend();        // kernels/cpu/ops.cpp
const Backend* cuda_backend();       // kernels/cuda/ops.cpp; null in a build without CUDA
std::vector<const Backend*> backends();  // the CPU's, then CUDA's when built

// The name of every op in TANDEM_OPS, in order; those of TANDEM_OPS_CPU_ONLY; those `backend`
// registers (non-null).
std::vector<const char*> table_ops();
std::vector<const char*> cpu_only_ops();
std::vector<const char*> registered_ops(const Backend& backend);

// The backend of tensors on `device` (throws "<op>: ... built without CUDA ..." for a CUDA device
// in a CPU-only build).
const Backend& backend_for(Device device, const char* op);

[[noreturn]] void throw_missing_kernel(const char* op, const Backend& backend);

// The names of TANDEM_OPS_FAST_PATHS, in order, and how often, since the process started, an entry
// point took each (any backend); -1 for a name that is not a fast path.
std::vector<const char*> fast_path_ops();
int64_t fast_path_count(const char* op);

enum class FastPath : int {
#define TANDEM_OP_ENUM(op, ...) op,
  TANDEM_OPS_FAST_PATHS(TANDEM_OP_ENUM)
#undef TANDEM_OP_ENUM
};
void count_fast_path(FastPath path);  // one relaxed atomic increment

// The kernel in `Slot` (&Backend::<op>) of device's backend; throws naming the op and backend when
// that backend lacks it. Entry points write TANDEM_KERNEL(device, binary)(op, a, b).
template <auto Slot>
auto kernel_for(Device device, const char* op) {
  const Backend& b = backend_for(device, op);
  auto fn = b.*Slot;
  if (fn == nullptr) throw_missing_kernel(op, b);
  return fn;
}

}  // namespace tandem::kernels

// The kernel of table op `op` for tensors on `device` (errors name the op as the table does).
#define TANDEM_KERNEL(device, op) ::tandem::kernels::kernel_for<&::tandem::kernels::Backend::op>(device, #op)
// The kernel of fast path `op` (TANDEM_OPS_FAST_PATHS), counted in fast_path_count.
#define TANDEM_FAST_KERNEL(device, op)                                                 \
  (::tandem::kernels::count_fast_path(::tandem::kernels::FastPath::op), \
   ::tandem::kernels::kernel_for<&::tandem::kernels::Backend::op>(device, #op))
