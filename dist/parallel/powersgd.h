// PowerSGD gradient compression (Vogels et al., 2019) as a comm hook, after PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook. For each gradient M (viewed as
// [rows, cols]) large enough that rank-r factors are at least min_compression_rate times smaller:
// P = M Q (all-reduced, then orthonormalised by Gram-Schmidt), Q = M^T P (all-reduced), and the
// gradient becomes P Q^T. The bucket's other gradients (vectors, small matrices) are all-reduced
// uncompressed in one message. With error feedback, what the approximation lost is added to the
// bucket's next gradients; with warm start, each bucket's Q carries over to the next iteration
// (fresh Qs come from a generator seeded alike on every rank). Before start_iter iterations the
// hook is a plain all-reduce (PyTorch's default start is 1000).
//
// Differences from PyTorch: the bucket arrives divided by the world size, so no sum is divided
// again; a bucket whose layout changed (the reducer's one rebuild) drops its error and warm start,
// so any start_iter is safe (PyTorch asks for start_iter > 1 instead); the random Qs come from Tandem's generator, not torch.randn, so runs agree with PyTorch
// in distribution only. Orthonormalisation of a host bucket's P and Q runs on the host in double; a
// CUDA bucket's runs on its device with tensor ops in float32 (orthogonalize_with_tensor_ops), so
// nothing is copied to the host or waited for in the middle of backward.
// Threads: the hook and its Work's wait() run on the reducer's thread; one state per DDP model.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/random.h"
#include "dist/parallel/comm_hook.h"

namespace tandem::dist {

struct PowerSGDOptions {
  int rank = 1;                 // matrix_approximation_rank
  int64_t start_iter = 1000;    // start_powerSGD_iter
  double min_compression_rate = 2.0;
  bool error_feedback = true;
  bool warm_start = true;
  uint64_t seed = 0;
};

struct PowerSGDState {
  explicit PowerSGDState(PowerSGDOptions o) : options(o), rng(o.seed) {}
  PowerSGDOptions options;
  int64_t iteration = 0;  // counted at each last bucket
  Generator rng;
  std::map<size_t, Tensor> error;       // bucket index -> what the last approximation lost
  std::map<size_t, Tensor> p_memory, q_memory;
  // bucket index -> the shapes of its gradients when the memories above were made: a bucket the
  // reducer rebuilt with another layout starts afresh (no error or warm start across layouts).
  std::map<size_t, std::vector<int64_t>> layout;
  // Elements the buckets held and the elements sent for them, since the start (compression stats).
  int64_t numel_before = 0, numel_after = 0;
};

std::shared_ptr<Work> powersgd(PowerSGDState& state, ProcessGroup& group, GradBucket& bucket);

// Gram-Schmidt on the columns of a float32 [rows, cols] matrix (a view is fine), in place, with
// tensor ops on the matrix's device (PyTorch's _orthogonalize_gram_schmidt with epsilon 0: each
// column divided by its norm, a zero column left zero, then removed from the columns after it).
// The hook's way for CUDA buckets; callable on the host too (tests compare it with the host way).
void orthogonalize_with_tensor_ops(Tensor& m);

// A hook over a fresh state with these options.
CommHook powersgd_hook(const PowerSGDOptions& options);

}  // namespace tandem::dist
