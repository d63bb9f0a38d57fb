// CUDA kernels of kernels/index.h (float32 and float64) under tandem::kernels::cuda.
// Assumes: validated by kernels/index.cpp (indices int64, contiguous, on the operands' device;
// shapes match). Index values are NOT checked on the host (that would wait for the device): each
// kernel checks the index it reads, skips an out-of-range one (writing 0 where it selects) and
// records it in the device's deferred error record (core/cuda/context.h), thrown at the next
// read of a result from the device, naming the op, the position, the value and the size.
// How: index_select and gather run one thread per output element; index_add and scatter_add one
// thread per source element, adding with atomicAdd into a zeroed output (so the order of the
// additions into one element, and its float rounding, may change from run to run: results match
// the CPU's serial sums to float32 rounding, not bitwise); bmm is one cuBLAS strided batched
// GEMM, reading operands whose matrices are row-major or transposed in place.
// Guarantees: fresh contiguous outputs on the operands' device, all work on its compute stream.
#include <algorithm>

#include "core/cuda/launch.cuh"
#include "core/view.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/strided.h"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {
namespace {

const float* in_ptr(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }
const int64_t* idx_ptr(const Tensor& t) { return static_cast<const int64_t*>(t.raw_data()); }


// The index tensor's shape and the target's contiguous strides (gather, scatter_add).
struct IndexWalk {
  int nd = 0, dim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t target_stride[kMaxDims] = {};

  // The target's element offset for index position i (row-major over shape), dim replaced by ix.
  __device__ __forceinline__ int64_t offset(int64_t i, int64_t ix) const {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t c = i % shape[d];
      i /= shape[d];
      off += (d == dim ? ix : c) * target_stride[d];
    }
    return off;
  }
};

IndexWalk index_walk(const char* op, const Shape& index_shape, const Shape& target_shape, int64_t dim) {
  TANDEM_CHECK(index_shape.size() <= static_cast<size_t>(kMaxDims), op, ": at most ", kMaxDims,
               " dimensions on CUDA, got ", shape_str(index_shape));
  IndexWalk w;
  w.nd = static_cast<int>(index_shape.size());
  w.dim = static_cast<int>(dim);
  const Shape strides = contiguous_strides(target_shape);
  for (int d = 0; d < w.nd; ++d) {
    w.shape[d] = index_shape[d];
    w.target_stride[d] = strides[d];
  }
  return w;
}

// True when index value j (at `position` of the index) is in [0, size); else reports it for `op`.
__device__ __forceinline__ bool index_ok(KernelErrorRecord* rec, int op, int64_t position, int64_t j, int64_t size) {
  if (j >= 0 && j < size) return true;
  tandem::cuda::report_kernel_error(rec, kIndexOutOfRange, op, position, j, size);
  return false;
}

template <typename T>
__global__ void index_select_kernel(const T* x, const int64_t* ix, T* out, int64_t n, int64_t k, int64_t inner,
                                    int64_t total, KernelErrorRecord* rec) {
  TANDEM_GRID_STRIDE_LOOP(t, total) {
    const int64_t i = t % inner, r = t / inner, j = ix[r % k];
    out[t] = index_ok(rec, tandem::cuda::kOpIndexSelect, r % k, j, n) ? x[((r / k) * n + j) * inner + i] : T(0);
  }
}

template <typename T>
__global__ void index_add_kernel(const T* src, const int64_t* ix, T* out, int64_t n, int64_t k, int64_t inner,
                                 int64_t skip, int64_t total, KernelErrorRecord* rec) {
  TANDEM_GRID_STRIDE_LOOP(t, total) {
    const int64_t i = t % inner, r = t / inner, j = ix[r % k];
    if (j == skip || !index_ok(rec, tandem::cuda::kOpIndexAdd, r % k, j, n)) continue;
    atomicAdd(out + ((r / k) * n + j) * inner + i, src[t]);
  }
}

template <typename T>
__global__ void gather_kernel(const T* x, const int64_t* ix, T* out, IndexWalk w, int64_t size, int64_t total,
                              KernelErrorRecord* rec) {
  TANDEM_GRID_STRIDE_LOOP(t, total) {
    out[t] = index_ok(rec, tandem::cuda::kOpGather, t, ix[t], size) ? x[w.offset(t, ix[t])] : T(0);
  }
}

template <typename T>
__global__ void scatter_add_kernel(const T* src, const int64_t* ix, T* out, IndexWalk w, int64_t size,
                                   int64_t total, KernelErrorRecord* rec) {
  TANDEM_GRID_STRIDE_LOOP(t, total) {
    if (index_ok(rec, tandem::cuda::kOpScatterAdd, t, ix[t], size)) atomicAdd(out + w.offset(t, ix[t]), src[t]);
  }
}

// One bmm operand [B, R, C] as cuBLAS reads it: row-major matrices (op N, ld = row stride) or
// transposed ones (op T, ld = column stride), at a fixed batch stride; anything else is copied
// contiguous first. For the column-major product Z^T = B^T A^T (see kernels/cuda/linear.cu) a
// row-major operand is used as it is (N) and a transposed one with T.
struct GemmOperand {
  Tensor t;
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t ld = 1, batch_stride = 0;
};

GemmOperand gemm_operand(const Tensor& x) {
  const int64_t R = x.size(1), C = x.size(2), sr = x.strides()[1], sc = x.strides()[2];
  GemmOperand g;
  g.t = x;
  if (sc == 1 && sr >= std::max<int64_t>(C, 1)) {
    g.ld = sr;
  } else if (sr == 1 && sc >= std::max<int64_t>(R, 1) && C > 1) {
    g.op = CUBLAS_OP_T;
    g.ld = sc;
  } else {
    g.t = x.contiguous();
    g.ld = std::max<int64_t>(C, 1);
  }
  g.batch_stride = g.t.strides()[0];
  return g;
}

}  // namespace

Tensor index_select(const Tensor& x_in, int64_t dim, const Tensor& index) {
  const int dev = check_f32_f64_cuda("index_select", {x_in});
  const Tensor x = x_in.contiguous();
  int64_t outer, n, inner;
  views::split_at(x.shape(), dim, outer, n, inner);
  const int64_t k = index.numel();
  Shape shape = x.shape();
  if (!shape.empty()) shape[dim] = k;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const int64_t total = out.numel();
  if (total == 0 || k == 0) return out;  // (k == 0 with a 0-D x: nothing selected)
  KernelErrorRecord* rec = kernel_error_record(dev);
  StreamGuard on(dev);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, index_select_kernel<T>, grid_for(total), 256, 0, elem_ptr<const T>(x), idx_ptr(index), elem_ptr<T>(out),
           n, k, inner, total, rec);
  });
  mark_kernel_error_check_pending(dev);
  return out;
}

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src_in, int64_t skip) {
  const int dev = check_f32_f64_cuda("index_add", {src_in});
  const Tensor src = src_in.contiguous();
  int64_t outer, n, inner;
  views::split_at(shape, dim, outer, n, inner);
  Tensor out = Tensor::zeros(shape, src.dtype(), src.device());
  const int64_t total = src.numel();
  if (total == 0 || index.numel() == 0) return out;
  KernelErrorRecord* rec = kernel_error_record(dev);
  StreamGuard on(dev);
  dispatch_cuda_float(src.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, index_add_kernel<T>, grid_for(total), 256, 0, elem_ptr<const T>(src), idx_ptr(index), elem_ptr<T>(out),
           n, index.numel(), inner, skip, total, rec);
  });
  mark_kernel_error_check_pending(dev);
  return out;
}

Tensor gather(const Tensor& x_in, int64_t dim, const Tensor& index) {
  const int dev = check_f32_f64_cuda("gather", {x_in});
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(index.shape(), x.dtype(), x.device());
  const int64_t total = out.numel();
  if (total == 0) return out;
  KernelErrorRecord* rec = kernel_error_record(dev);
  StreamGuard on(dev);
  const IndexWalk walk = index_walk("gather", index.shape(), x.shape(), dim);
  const int64_t size = x.dim() == 0 ? int64_t{1} : x.size(dim);
  dispatch_cuda_float(x.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, gather_kernel<T>, grid_for(total), 256, 0, elem_ptr<const T>(x), idx_ptr(index), elem_ptr<T>(out), walk,
           size, total, rec);
  });
  mark_kernel_error_check_pending(dev);
  return out;
}

Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src_in) {
  const int dev = check_f32_f64_cuda("scatter_add", {src_in});
  const Tensor src = src_in.contiguous();
  Tensor out = Tensor::zeros(shape, src.dtype(), src.device());
  const int64_t total = src.numel();
  if (total == 0) return out;
  KernelErrorRecord* rec = kernel_error_record(dev);
  StreamGuard on(dev);
  const IndexWalk walk = index_walk("scatter_add", index.shape(), shape, dim);
  const int64_t size = shape.empty() ? int64_t{1} : shape[dim];
  dispatch_cuda_float(src.dtype(), [&](auto t) {
    using T = decltype(t);
    launch(on, scatter_add_kernel<T>, grid_for(total), 256, 0, elem_ptr<const T>(src), idx_ptr(index),
           elem_ptr<T>(out), walk, size, total, rec);
  });
  mark_kernel_error_check_pending(dev);
  return out;
}

Tensor bmm(const Tensor& a_in, const Tensor& b_in) {
  const char* op = "bmm";
  const int dev = check_f32_f64_cuda(op, {a_in, b_in});
  const int B = to_int(a_in.size(0), op, "batch size");
  const int M = to_int(a_in.size(1), op, "M");
  const int K = to_int(a_in.size(2), op, "K");
  const int N = to_int(b_in.size(2), op, "N");
  Tensor c = Tensor::empty({B, M, N}, a_in.dtype(), a_in.device());
  if (B == 0 || M == 0 || N == 0) return c;
  if (K == 0) return c.zero_();  // empty sums
  const GemmOperand a = gemm_operand(a_in), b = gemm_operand(b_in);
  const int ldb = to_int(b.ld, op, "leading dimension of b"), lda = to_int(a.ld, op, "leading dimension of a");
  const long long stride_c = static_cast<long long>(M) * N;
  StreamGuard on(dev);
  // Column-major C^T [N, M] = op(B) [N, K] * op(A) [K, M]: m = N, n = M, k = K.
  if (c.dtype() == kFloat64) {
    const double one = 1.0, zero = 0.0;
    TANDEM_CUBLAS_CHECK(cublasDgemmStridedBatched(cublas_handle(dev), b.op, a.op, N, M, K, &one,
                                                  elem_ptr<const double>(b.t), ldb, b.batch_stride,
                                                  elem_ptr<const double>(a.t), lda, a.batch_stride, &zero,
                                                  elem_ptr<double>(c), N, stride_c, B));
    return c;
  }
  const float one = 1.0f, zero = 0.0f;
  TANDEM_CUBLAS_CHECK(cublasSgemmStridedBatched(cublas_handle(dev), b.op, a.op, N, M, K, &one, in_ptr(b.t), ldb,
                                                b.batch_stride, in_ptr(a.t), lda, a.batch_stride, &zero, f32_ptr(c),
                                                N, stride_c, B));
  return c;
}

}  // namespace tandem::kernels::cuda
