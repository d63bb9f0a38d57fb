// The host-side arithmetic of ProcessGroupGloo's collectives (internal to dist/group): the
// element-wise reductions handed to Gloo and to the shared-memory transport, Avg's division, the
// rank-order reduction of reduce_scatter's received chunks, and the staging of CUDA tensors
// through host copies.
// Guarantees: every reduction of 16-bit floats is done in float32 and rounded once per pairwise
// step (as Gloo does for fp16); Sum and Avg reduce in rank order ((x0 + x1) + x2 ...), so the
// all-reduce and the reduce-scatter of one value give the same bits.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "core/tensor.h"
#include "dist/group/process_group.h"

namespace tandem::dist::gloo_detail {

// c[i] = op(a[i], b[i]) for n elements; c may alias a or b. (Gloo's AllreduceOptions::Func and
// ShmAllreduce::ReduceFn have this type.)
using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;

// The element-wise step of `op` on `dtype` (Avg steps as Sum; divide_in_place finishes it).
// Throws naming the dtype when it cannot be reduced.
ReduceFn reduce_function(DType dtype, ReduceOp op);

// data[i] /= ranks for n elements of a floating-point `dtype` (Avg's last step).
void divide_in_place(void* data, size_t n, DType dtype, int ranks);

// out = chunks[0] op chunks[1] op ... op chunks[ranks-1], in rank order, where chunk q holds n
// elements of elem_size bytes at `chunks + q * stride` bytes (ranks >= 1).
void reduce_in_rank_order(void* out, const unsigned char* chunks, size_t stride, size_t n, int ranks,
                          const ReduceFn& fn, size_t elem_size);

// CUDA tensors travel through the host, as PyTorch's Gloo group does for its CUDA collectives. On
// the worker thread: stage() copies the tensor to a host tensor after the device's queued work (a
// device-to-host copy waits for the compute stream), the CPU collective runs on that copy, and
// unstage() queues the result's copy back on the device's compute stream before the Work
// completes, so compute the caller queues after wait() sees it. Host tensors pass through as they
// are. This is the correctness path for CUDA over Gloo (2 ranks sharing a GPU, CPU-only
// interconnects), not a fast one: NCCL keeps collectives on the device.
Tensor stage(const Tensor& t);
void unstage(Tensor& t, const Tensor& host);
// " on cuda:0 via host" for a CUDA tensor, "" for a host one (for descriptions).
std::string where(const Tensor& t);

}  // namespace tandem::dist::gloo_detail
