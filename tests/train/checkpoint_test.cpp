// train/checkpoint: the two-file checkpoint round trip, keep-last-N with the
// last_checkpoint pointer, and a failed save that leaves the previous good
// checkpoint untouched (the failure is real: the target's parent is a regular
// file, which fails even for root).
#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/test_util.h"
#include "nn/models/mnist_net.h"
#include "nn/module.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::read_file;
using test::TempDir;

Checkpoint sample(float value) {
  Checkpoint c;
  c.weights["fc.weight"] = Tensor::full({2, 3}, value);
  c.weights["fc.bias"] = Tensor::from_vector<float>({1.f, 2.f}, {2});
  c.optimizer["state.0.square_avg"] = Tensor::full({2, 3}, value * 2);
  c.optimizer["state.0.step"] = Tensor::scalar(7, kInt64);
  c.scaler["scale"] = Tensor::scalar(65536.0, kFloat64);
  c.meta = {{"epoch", 2}, {"iter", 5}, {"rng", "1 2 3"}};
  return c;
}

TEST(Checkpoint, StatePathSitsBesideTheWeights) {
  EXPECT_EQ(state_path("d/iter_4.safetensors"), "d/iter_4.state.safetensors");
  EXPECT_EQ(state_path("d/ckpt"), "d/ckpt.state");
}

TEST(Checkpoint, RoundTripKeepsEveryTensorAndTheMeta) {
  TempDir tmp("ckpt");
  save_checkpoint(tmp.file("c.safetensors"), sample(0.5f));
  Checkpoint c = load_checkpoint(tmp.file("c.safetensors"));
  ASSERT_EQ(c.weights.size(), 2u);
  EXPECT_EQ(c.weights.at("fc.weight").to_vector<float>(), std::vector<float>(6, 0.5f));
  EXPECT_EQ(c.weights.at("fc.bias").to_vector<float>(), (std::vector<float>{1.f, 2.f}));
  ASSERT_EQ(c.optimizer.size(), 2u);
  EXPECT_EQ(c.optimizer.at("state.0.square_avg").to_vector<float>(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(c.optimizer.at("state.0.step").item<int64_t>(), 7);
  EXPECT_EQ(c.scaler.at("scale").item<double>(), 65536.0);
  EXPECT_EQ(c.meta.at("epoch").get<int>(), 2);
  EXPECT_EQ(c.meta.at("iter").get<int>(), 5);
  EXPECT_EQ(c.meta.at("rng").get<std::string>(), "1 2 3");
  // The weights file alone holds exactly the weights, without "optimizer." names.
  EXPECT_EQ(load_safetensors(tmp.file("c.safetensors")).size(), 2u);
}

TEST(Checkpoint, WeightsFileLoadsAsPlainModelWeights) {
  TempDir tmp("ckpt");
  nn::models::MnistNet a, b;
  Checkpoint c;
  for (auto& [name, t] : a.state_dict()) c.weights[name] = t;
  save_checkpoint(tmp.file("m.safetensors"), c);
  nn::load_weights(b, tmp.file("m.safetensors"));
  auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_EQ(sa[i].second.to_vector<float>(), sb[i].second.to_vector<float>()) << sa[i].first;
}

TEST(Checkpoint, BadCheckpointsAreClearErrors) {
  TempDir tmp("ckpt");
  EXPECT_HAS(error_of([&] { load_checkpoint(tmp.file("none.safetensors")); }), "does not exist");
  save_safetensors(tmp.file("w.safetensors"), sample(1.f).weights);
  EXPECT_HAS(error_of([&] { load_checkpoint(tmp.file("w.safetensors")); }), "has no training state");
  // A state file without the metadata.
  save_safetensors(tmp.file("w.state.safetensors"), {});
  EXPECT_HAS(error_of([&] { load_checkpoint(tmp.file("w.safetensors")); }), "has no \"tandem\" metadata");
  // A state file with a tensor of neither group.
  save_checkpoint(tmp.file("x.safetensors"), sample(1.f));
  save_safetensors(tmp.file("x.state.safetensors"), {{"bogus", Tensor::scalar(1.0)}},
                   {{"tandem", R"({"format": "tandem-checkpoint-1"})"}});
  EXPECT_HAS(error_of([&] { load_checkpoint(tmp.file("x.safetensors")); }), "unexpected tensor 'bogus'");
}

TEST(CheckpointManager, KeepsTheLastNAndPointsAtTheNewest) {
  TempDir tmp("ckpt");
  CheckpointManager m(tmp.path().string(), 2);
  for (int64_t it : {4, 8, 12}) m.save(sample(static_cast<float>(it)), it);
  const auto kept = CheckpointManager::list(tmp.path().string());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(fs::path(kept[0]).filename(), "iter_8.safetensors");
  EXPECT_EQ(fs::path(kept[1]).filename(), "iter_12.safetensors");
  EXPECT_FALSE(fs::exists(tmp / "iter_4.state.safetensors"));
  EXPECT_TRUE(fs::exists(tmp / "iter_8.state.safetensors"));
  const std::string latest = CheckpointManager::latest(tmp.path().string());
  EXPECT_EQ(fs::path(latest).filename(), "iter_12.safetensors");
  EXPECT_TRUE(fs::path(latest).is_absolute());
  EXPECT_EQ(load_checkpoint(latest).weights.at("fc.weight").to_vector<float>(), std::vector<float>(6, 12.f));
  // Sorting is numeric, not by name: iter_100 is newer than iter_12.
  m.save(sample(100.f), 100);
  EXPECT_EQ(fs::path(CheckpointManager::list(tmp.path().string()).back()).filename(), "iter_100.safetensors");
  EXPECT_FALSE(fs::exists(tmp / "iter_8.safetensors"));
}

TEST(CheckpointManager, ZeroKeepsAll) {
  TempDir tmp("ckpt");
  CheckpointManager m(tmp.path().string(), 0);
  for (int64_t it = 1; it <= 4; ++it) m.save(sample(1.f), it);
  EXPECT_EQ(CheckpointManager::list(tmp.path().string()).size(), 4u);
}

TEST(CheckpointManager, LatestWithoutPointerSaysSo) {
  TempDir tmp("ckpt");
  EXPECT_HAS(error_of([&] { CheckpointManager::latest(tmp.path().string()); }), "no checkpoint to resume from");
}

TEST(CheckpointManager, FailedSaveKeepsThePreviousCheckpoint) {
  TempDir tmp("ckpt");
  const fs::path dir = tmp / "work";
  CheckpointManager m(dir.string(), 1);
  fs::create_directories(dir);
  const std::string good = m.save(sample(3.f), 10);
  const std::string weights_before = read_file(good), state_before = read_file(state_path(good));
  const std::string pointer_before = read_file(dir / "last_checkpoint");
  // Make the directory unusable for new files: move it away and put a regular
  // file in its place, so every create under "<dir>/" fails with ENOTDIR.
  const fs::path moved = tmp / "moved";
  fs::rename(dir, moved);
  std::ofstream(dir) << "not a directory";
  const std::string msg = error_of([&] { m.save(sample(4.f), 20); });
  EXPECT_HAS(msg, (dir / "iter_20").string());
  fs::remove(dir);
  fs::rename(moved, dir);
  EXPECT_EQ(read_file(good), weights_before);
  EXPECT_EQ(read_file(state_path(good)), state_before);
  EXPECT_EQ(read_file(dir / "last_checkpoint"), pointer_before);
  EXPECT_EQ(CheckpointManager::list(dir.string()).size(), 1u);
  EXPECT_EQ(load_checkpoint(good).weights.at("fc.weight").to_vector<float>(), std::vector<float>(6, 3.f));
}

TEST(CheckpointManager, FailedWeightsWriteRemovesTheNewStateAndKeepsThePointer) {
  TempDir tmp("ckpt");
  CheckpointManager m(tmp.path().string(), 3);
  m.save(sample(1.f), 1);
  const std::string pointer_before = read_file(tmp / "last_checkpoint");
  // iter_2.safetensors is a directory: the state file is written, the weights rename fails.
  fs::create_directories(tmp / "iter_2.safetensors" / "x");
  const std::string msg = error_of([&] { m.save(sample(2.f), 2); });
  EXPECT_HAS(msg, "iter_2.safetensors");
  EXPECT_FALSE(fs::exists(tmp / "iter_2.state.safetensors"));
  EXPECT_EQ(read_file(tmp / "last_checkpoint"), pointer_before);
}

TEST(WriteFileAtomic, ReplacesContentAndFailsNamingThePath) {
  TempDir tmp("ckpt");
  write_file_atomic(tmp.file("f"), "one");
  write_file_atomic(tmp.file("f"), "two");
  EXPECT_EQ(read_file(tmp / "f"), "two");
  std::ofstream(tmp / "plain") << "x";
  EXPECT_HAS(error_of([&] { write_file_atomic(tmp.file("plain") + "/f", "x"); }), "plain/f");
  EXPECT_EQ(read_file(tmp / "f"), "two");
}

}  // namespace
}  // namespace tandem::train
