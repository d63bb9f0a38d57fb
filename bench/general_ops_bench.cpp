// The general op set's CPU kernels on transformer-like shapes, one thread, each beside the path it
// is compared with: a broadcast add and a same-shape div against the same-shape add kernel (the
// cost of strided iteration), sums over the last and the first dimension (row reduction against the block path),
// softmax over the last dimension, the composed layer_norm, batched matmul and cross_entropy's
// forward and backward.
#include <benchmark/benchmark.h>

#include "core/random.h"
#include "core/thread_pool.h"
#include "kernels/pointwise.h"
#include "nn/functional.h"

using namespace tandem;

namespace {

Tensor uniform(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(gen.uniform(-2.0, 2.0));
  return t;
}

struct OneThread {
  OneThread() { set_num_threads(1); }
} one_thread;

void BM_AddSameShape(benchmark::State& s) {
  const Tensor a = uniform({1024, 1024}, 1), b = uniform({1024, 1024}, 2);
  for (auto _ : s) benchmark::DoNotOptimize(kernels::binary(kernels::BinaryOp::Add, a, b));
  s.SetItemsProcessed(s.iterations() * a.numel());
}

void BM_AddBroadcastRow(benchmark::State& s) {
  const Tensor a = uniform({1024, 1024}, 1), row = uniform({1024}, 2);
  for (auto _ : s) benchmark::DoNotOptimize(F::add(a, row));
  s.SetItemsProcessed(s.iterations() * a.numel());
}

void BM_DivSameShape(benchmark::State& s) {
  const Tensor a = uniform({1024, 1024}, 1), b = uniform({1024, 1024}, 2);
  for (auto _ : s) benchmark::DoNotOptimize(F::div(a, b));
  s.SetItemsProcessed(s.iterations() * a.numel());
}

void BM_SumDim(benchmark::State& s) {
  const Tensor x = uniform({4096, 1024}, 3);
  const int64_t dim = s.range(0);
  for (auto _ : s) benchmark::DoNotOptimize(F::sum(x, {dim}));
  s.SetItemsProcessed(s.iterations() * x.numel());
}

void BM_SoftmaxLastDim(benchmark::State& s) {
  const Tensor x = uniform({4096, 1024}, 4);
  for (auto _ : s) benchmark::DoNotOptimize(F::softmax(x, -1));
  s.SetItemsProcessed(s.iterations() * x.numel());
}

void BM_LayerNorm(benchmark::State& s) {
  const Tensor x = uniform({4096, 1024}, 5), w = uniform({1024}, 6), b = uniform({1024}, 7);
  for (auto _ : s) benchmark::DoNotOptimize(F::layer_norm(x, {1024}, w, b));
  s.SetItemsProcessed(s.iterations() * x.numel());
}

void BM_MatmulBatched(benchmark::State& s) {
  const Tensor q = uniform({32, 128, 64}, 8), k = uniform({32, 64, 128}, 9);
  for (auto _ : s) benchmark::DoNotOptimize(F::matmul(q, k));
  s.SetItemsProcessed(s.iterations() * 2 * 32 * 128 * 64 * 128);  // FLOPs
}

void BM_CrossEntropyForwardBackward(benchmark::State& s) {
  Tensor logits = uniform({512, 1000}, 10).set_requires_grad(true);
  std::vector<int64_t> t(512);
  for (int64_t i = 0; i < 512; ++i) t[i] = (i * 37) % 1000;
  const Tensor target = Tensor::from_vector(t, {512});
  for (auto _ : s) {
    F::cross_entropy(logits, target, -100, 0.1).backward();
    logits.set_grad(Tensor());
  }
  s.SetItemsProcessed(s.iterations() * logits.numel());
}

}  // namespace

BENCHMARK(BM_AddSameShape)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AddBroadcastRow)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DivSameShape)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SumDim)->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SoftmaxLastDim)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayerNorm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MatmulBatched)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CrossEntropyForwardBackward)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
