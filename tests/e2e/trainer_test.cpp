// End-to-end runs of the tandem-mnist binary: it trains to a set accuracy,
// and bad input ends with one clear line and a non-zero exit.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "metrics.h"
#include "common/process.h"
#include "common/require_data.h"
#include "common/test_util.h"

namespace fs = std::filesystem;
using namespace tandem::test;

namespace {

const std::string kFashion = "/usr/share/datasets/fashion-mnist";

// The last "eval" record of a metrics file.
nlohmann::json last_eval(const fs::path& metrics) {
  tandem::test::Metrics m;
  tandem::test::read_metrics(metrics, m);
  return m.eval;
}

}  // namespace

TEST(Trainer, ThreeEpochsOnRealDigitsReach97Percent) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("e2e");
  const int rc = run_process({kTrainer, "--data-dir", kDigits, "--epochs", "3", "--metrics-out",
                              (tmp / "m.jsonl").string(), "--log-interval", "50"},
                             tmp / "log");
  ASSERT_EQ(rc, 0) << read_file(tmp / "log");
  auto ev = last_eval(tmp / "m.jsonl");
  EXPECT_GE(ev["test_accuracy"].get<double>(), 0.97) << read_file(tmp / "log");
}

// The README's train command: one epoch, Adadelta lr 1.0 with a cosine schedule.
TEST(Trainer, OneEpochOnFashionMnistReaches88Percent) {
  TANDEM_NEED_DATA(kFashion);
  TempDir tmp("e2e");
  const int rc = run_process({kTrainer, "--epochs", "1", "--lr-schedule", "cosine", "--metrics-out",
                              (tmp / "m.jsonl").string(),
                              "--save-weights", (tmp / "w.safetensors").string()},
                             tmp / "log");
  ASSERT_EQ(rc, 0) << read_file(tmp / "log");
  const std::string log = read_file(tmp / "log");
  EXPECT_NE(log.find("Epoch(train) [1][100/938]"), std::string::npos) << log;
  EXPECT_NE(log.find("Fashion-MNIST"), std::string::npos) << "the log must say which data is used";
  auto ev = last_eval(tmp / "m.jsonl");
  EXPECT_GE(ev["test_accuracy"].get<double>(), 0.88) << log;
  EXPECT_TRUE(fs::exists(tmp / "w.safetensors"));
}

TEST(Trainer, SavedWeightsLoadAndTrainingContinuesFromThem) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("e2e");
  ASSERT_EQ(run_process({kTrainer, "--data-dir", kDigits, "--epochs", "1", "--limit", "640", "--save-weights",
                         (tmp / "w.safetensors").string(), "--metrics-out", (tmp / "a.jsonl").string()},
                        tmp / "log1"),
            0)
      << read_file(tmp / "log1");
  ASSERT_EQ(run_process({kTrainer, "--data-dir", kDigits, "--epochs", "1", "--limit", "64", "--init-weights",
                         (tmp / "w.safetensors").string(), "--metrics-out", (tmp / "b.jsonl").string()},
                        tmp / "log2"),
            0)
      << read_file(tmp / "log2");
  // Continuing from trained weights starts far below the untrained loss (~2.3).
  std::ifstream in(tmp / "b.jsonl");
  std::string first;
  std::getline(in, first);
  EXPECT_LT(nlohmann::json::parse(first)["loss"].get<double>(), 1.5);
}

TEST(Trainer, ProfileFlagPrintsAnOpTable) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("e2e");
  ASSERT_EQ(run_process({kTrainer, "--data-dir", kDigits, "--epochs", "1", "--limit", "128", "--test-limit", "64",
                         "--threads", "1", "--work-dir", tmp.file("w"), "--profile"},
                        tmp / "log"),
            0)
      << read_file(tmp / "log");
  const std::string log = read_file(tmp / "log");
  EXPECT_NE(log.find("profile (wall time per op"), std::string::npos) << log;
  EXPECT_NE(log.find("conv2d"), std::string::npos) << log;
  EXPECT_NE(log.find("adadelta_update"), std::string::npos) << log;
}

TEST(TrainerErrors, UnknownFlag) {
  TempDir tmp("e2e");
  EXPECT_EQ(run_process({kTrainer, "--no-such-flag"}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "--no-such-flag");
}

TEST(TrainerErrors, BatchSizeZero) {
  TempDir tmp("e2e");
  EXPECT_EQ(run_process({kTrainer, "--batch-size", "0"}, tmp / "log"), 2);
  expect_one_line_error(read_file(tmp / "log"), "--batch-size");
}

TEST(TrainerErrors, MissingDataSaysHowToGetIt) {
  TempDir tmp("e2e");
  EXPECT_EQ(run_process({kTrainer, "--data-dir", (tmp / "nothing").string()}, tmp / "log"), 1);
  const std::string out = read_file(tmp / "log");
  expect_one_line_error(out, "setup.sh");
  EXPECT_NE(out.find("nothing"), std::string::npos) << out;
}

TEST(TrainerErrors, TruncatedIdxNamesFileAndExpectedSize) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("e2e");
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    fs::copy_file(kDigits + "/" + f, tmp / f);
  // A raw images file cut short: header for 8000 images, data for 10.
  std::ofstream out(tmp / "train-images-idx3-ubyte", std::ios::binary);
  const unsigned char header[16] = {0, 0, 8, 3, 0, 0, 0x1f, 0x40, 0, 0, 0, 28, 0, 0, 0, 28};
  out.write(reinterpret_cast<const char*>(header), 16);
  out << std::string(10 * 784, '\0');
  out.close();
  EXPECT_EQ(run_process({kTrainer, "--data-dir", tmp.path().string()}, tmp / "log"), 1);
  const std::string log = read_file(tmp / "log");
  expect_one_line_error(log, "train-images-idx3-ubyte");
  EXPECT_NE(log.find("6272016"), std::string::npos) << "expected size (16 + 8000*784 bytes) missing: " << log;
}

TEST(TrainerErrors, WeightsWithWrongShapeNameTheTensor) {
  TANDEM_NEED_DATA(kDigits);
  TempDir tmp("e2e");
  // A valid safetensors file whose fc2.weight has the wrong shape.
  const std::string header =
      R"({"fc2.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]}})";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::ofstream out(tmp / "bad.safetensors", std::ios::binary);
  const uint64_t n = padded.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << padded << std::string(24, '\0');
  out.close();
  EXPECT_EQ(run_process({kTrainer, "--data-dir", kDigits, "--init-weights", (tmp / "bad.safetensors").string()},
                        tmp / "log"),
            1);
  const std::string log = read_file(tmp / "log");
  EXPECT_NE(log.find("bad.safetensors"), std::string::npos) << log;
  EXPECT_NE(log.find("'fc2.weight' has shape [3, 2], expected [10, 128]"), std::string::npos) << log;
}
