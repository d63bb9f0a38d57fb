// The benchmark outputs' rules, end to end: bench/run_all.sh --quick fills one fresh folder with every
// script's JSON and a table that names the CPU and has every headline row, each ratio the quotient of its
// two figures, and the rows of Tandem alone (kernels_bench) each kernel's share of the printed GEMM peak;
// a second run into the same folder is refused. allreduce_bench takes --sizes (DDP's default
// 25 MiB bucket among them), states the CPU model, and never writes over a result file without
// --overwrite; the Python scripts refuse the same. Nothing here is timed: the figures are only checked
// for consistency with each other.
// Assumes: /usr/bin/python3 with PyTorch and Fashion-MNIST under /usr/share/datasets (scripts/setup.sh
// --for test installs both; without them the test skips, or fails under TANDEM_REQUIRE_DATA=1).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace tandem;

const std::string kPython = "/usr/bin/python3";
const std::string kFashion = "/usr/share/datasets/fashion-mnist";

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "";
}

double table_value(const std::string& table, const std::string& label) {
  const std::regex row("\\| " + std::regex_replace(label, std::regex(R"([\^$.|?*+()\[\]{}])"), R"(\$&)") +
                       R"( \| ([0-9.]+) \|)");
  std::smatch m;
  return std::regex_search(table, m, row) ? std::stod(m[1]) : -1;
}

// The rows of Tandem alone: each kernel's share is its GFLOP/s over the printed 1-thread peak of its
// dtype (the larger of the GEMM's and the multiply-add loop's), and the trainer's share of its
// GEMM-bound limit is samples/s x 15.4 MFLOP over the peak.
void expect_shares_of_the_peak(const std::string& table) {
  const std::string of = "peak the shares are of, ";
  const double f32 = table_value(table, of + "f32, 1 thread, GFLOP/s (the larger of the two, x threads)"),
               bf16 = table_value(table, of + "bf16, 1 thread, GFLOP/s (the larger of the two, x threads)");
  // Never below either measured peak.
  EXPECT_GE(f32, table_value(table, "GEMM peak 512^3, f32, 1 thread, GFLOP/s")) << table;
  EXPECT_GE(f32, table_value(table, "multiply-add peak (registers only), f32, 1 thread, GFLOP/s")) << table;
  ASSERT_GT(f32, 0) << table;
  ASSERT_GT(bf16, 0) << table;
  const std::regex kernel(
      R"(\| ((conv|linear) [^|]+ (f32|bf16), 1 thread, GFLOP/s[^|]*) \| ([0-9.]+) \(([0-9]+)%\) \| - \| - \|)");
  int kernels = 0;
  for (auto it = std::sregex_iterator(table.begin(), table.end(), kernel); it != std::sregex_iterator(); ++it) {
    const double share = 100 * std::stod((*it)[4]) / ((*it)[3] == "f32" ? f32 : bf16);
    EXPECT_NEAR(std::stod((*it)[5]), share, 0.01 * share + 1) << (*it)[0];
    ++kernels;
  }
  EXPECT_EQ(kernels, 60) << "10 convs and 2 linears, forward and backward, f32 and bf16, and the 2 blocks' conv pairs, "
                            "fused and one by one, 3 passes each:\n"
                         << table;
  const double per_s = table_value(table, "MNIST trainer, 1 thread, samples/s"),
               share = table_value(
                   table, "MNIST trainer, 1 thread, % of its GEMM-bound limit (f32 peak / 15.4 MFLOP per sample)");
  EXPECT_NEAR(share, 100 * per_s * 15.396864e6 / (f32 * 1e9), 0.02 * share + 0.1) << table;
}

TEST(BenchScripts, RunAllQuickWritesOneTableWithEveryHeadlineRowAndTheCpu) {
  TANDEM_NEED_DATA_FILE(kFashion, "train-images-idx3-ubyte.gz");
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing (scripts/setup.sh installs it)";
  test::TempDir tmp("bench_run_all");
  const fs::path out = tmp / "run", log = tmp / "log";
  const std::vector<std::string> argv = {"/bin/bash", TANDEM_SOURCE_DIR "/bench/run_all.sh", "--quick", "--no-build",
                                         "--build",   TANDEM_BINARY_DIR,                        "--out",   out.string()};
  ASSERT_EQ(test::run_process(argv, log), 0) << test::read_file(log);

  for (const char* f : {"compare_pytorch.json", "compare_pytorch_bf16.json", "compare_models.json", "compare_models_bf16.json",
                        "compare_ddp.json",
                        "ddp_buckets.json", "allreduce.json", "kernels.json", "table.md"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  const json mnist = json::parse(test::read_file(out / "compare_pytorch.json"));
  EXPECT_EQ(mnist["machine"]["cpu"]["model"].get<std::string>(), cpu_model());
  EXPECT_FALSE(mnist["machine"]["pytorch"].is_null()) << "the peer's version is recorded";

  const std::string table = test::read_file(out / "table.md");
  EXPECT_NE(table.find("Measured on " + cpu_model()), std::string::npos) << table;
  EXPECT_EQ(table.find("Not measured"), std::string::npos) << table;
  // The bf16 / own fp32 ratios divide by fp32 runs of the same rounds (--own-fp32), not of another step.
  for (const char* row : {"MNIST trainer, 1 thread", "MNIST trainer, 2 threads", "bf16 autocast, 2 threads",
                          "bf16 / own fp32, 1 thread (fp32 runs in the same rounds)", "resnet training step, 2 threads",
                          "gpt training step, 1 thread", "gpt training step, bf16 autocast, 2 threads",
                          "bf16 / own fp32, resnet, 1 thread (fp32 runs in the same rounds)",
                          "MNIST DDP, 2 ranks", "MLP DDP step, 2 ranks, bucket cap 25 MiB",
                          "MLP all-reduce of all gradients", "all-reduce 4 MiB", "GEMM peak 512^3, bf16, 2 threads",
                          "MNIST trainer, bf16 autocast, 2 threads, % of its GEMM-bound limit",
                          "conv ResNet 8->16 3x3 stride 2, 28x28: backward bf16", "linear 64x1600x128",
                          "conv pair ResNet 8->16 3x3 + 1x1 stride 2, fused: input gradient"})
    EXPECT_NE(table.find(row), std::string::npos) << row << " missing from:\n" << table;
  // Every row with a ratio: the ratio is Tandem / PyTorch as printed (to the printed precision).
  const std::regex line(R"(\| ([^|]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|)");
  int checked = 0;
  for (auto it = std::sregex_iterator(table.begin(), table.end(), line); it != std::sregex_iterator(); ++it) {
    const double t = std::stod((*it)[2]), p = std::stod((*it)[3]), r = std::stod((*it)[4]);
    ASSERT_GT(p, 0) << (*it)[0];
    EXPECT_NEAR(r, t / p, 0.02 * t / p + 0.01) << (*it)[0];
    ++checked;
  }
  EXPECT_GE(checked, 12) << table;
  expect_shares_of_the_peak(table);

  // The folder is never written over.
  EXPECT_EQ(test::run_process(argv, tmp / "again"), 2);
  EXPECT_NE(test::read_file(tmp / "again").find("exists"), std::string::npos) << test::read_file(tmp / "again");
  EXPECT_EQ(test::read_file(out / "table.md"), table);
}

#ifdef TANDEM_ALLREDUCE_BENCH
TEST(BenchScripts, AllreduceBenchTakesSizesAndWritesOverOnlyWhenTold) {
  test::TempDir tmp("bench_sizes");
  const fs::path out = tmp / "ar.json", log = tmp / "log";
  auto bench = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {TANDEM_ALLREDUCE_BENCH, "--budget-mb=1", "--benchmark_filter=^engine/",
                                     "--benchmark_out=" + out.string(), "--benchmark_out_format=json"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return test::run_process(argv, log);
  };
  ASSERT_EQ(bench({"--sizes=25M,4K,4K"}), 0) << test::read_file(log);
  const std::string first = test::read_file(out);
  const json j = json::parse(first);
  std::set<int64_t> sizes;
  for (const json& b : j["benchmarks"])
    if (b.value("run_type", "iteration") == "iteration") sizes.insert(b["bytes"].get<double>());
  EXPECT_EQ(sizes, (std::set<int64_t>{4096, 25 << 20}));
  EXPECT_EQ(j["context"]["cpu_model"].get<std::string>(), cpu_model());

  EXPECT_EQ(bench({"--sizes=4K"}), 2);
  EXPECT_NE(test::read_file(log).find("--overwrite"), std::string::npos) << test::read_file(log);
  EXPECT_EQ(test::read_file(out), first) << "a refused run leaves the file as it was";
  EXPECT_EQ(bench({"--sizes=4K", "--overwrite"}), 0) << test::read_file(log);
  EXPECT_NE(test::read_file(out), first);

  EXPECT_EQ(bench({"--sizes=4K,25MB", "--overwrite"}), 2);
  EXPECT_NE(test::read_file(log).find("'25MB' is not a size"), std::string::npos) << test::read_file(log);
}
#endif

TEST(BenchScripts, ComparisonScriptsRefuseToWriteOverAResult) {
  if (!fs::exists(kPython)) GTEST_SKIP() << "needs " << kPython;
  test::TempDir tmp("bench_refuse");
  const fs::path out = tmp / "kept.json", log = tmp / "log";
  std::ofstream(out) << "{\"kept\": true}\n";
  for (const char* script : {"compare_pytorch.py", "compare_models.py", "compare_ddp.py", "ddp_buckets.py"}) {
    const int rc = test::run_process({kPython, std::string(TANDEM_SOURCE_DIR "/bench/") + script, "--json-out",
                                      out.string()},
                                     log);
    EXPECT_NE(rc, 0) << script;
    EXPECT_NE(test::read_file(log).find("exists: pass --overwrite"), std::string::npos)
        << script << ": " << test::read_file(log);
    EXPECT_EQ(test::read_file(out), "{\"kept\": true}\n") << script;
  }
}

}  // namespace
