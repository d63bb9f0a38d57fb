// MnistDataset: the MNIST (or Fashion-MNIST, or any same-format) images and
// labels of one split, kept as uint8 in memory and normalised per batch.
// Finds the files in DIR, DIR/MNIST/raw or DIR/FashionMNIST/raw (torchvision's
// layout), each name raw or with .gz. Checks on load: image count == label
// count, labels in 0..9, images 3-D [N, H, W] (any H, W). get_batch_into is
// const and thread-safe and uses no thread pool, so DataLoader workers may call
// it concurrently; limit() is not, call it before loading starts.
#pragma once

#include <string>
#include <vector>

#include "data/dataset.h"

namespace tandem::data {

enum class Split { Train, Test };
// "train" or "test" (throws naming the text otherwise).
Split parse_split(const std::string& text);
const char* split_name(Split split);

struct MnistFiles {
  std::string images;
  std::string labels;
};

// Locates the image and label files of `split` under `dir`; throws an error
// listing every path tried and how to get the data when none is found.
MnistFiles find_mnist_files(const std::string& dir, Split split);

class MnistDataset : public Dataset {
 public:
  static constexpr double kDefaultMean = 0.1307;
  static constexpr double kDefaultStd = 0.3081;
  static constexpr int kNumClasses = 10;

  MnistDataset(const std::string& dir, Split split, double mean = kDefaultMean, double stddev = kDefaultStd);
  // From explicit files (tests, tools).
  MnistDataset(const MnistFiles& files, double mean = kDefaultMean, double stddev = kDefaultStd);

  int64_t size() const override { return images_.size(0); }
  // Keeps the first n samples (all of them when n >= size()).
  void limit(int64_t n);

  // images: float32 [B, 1, H, W] = (pixel/255 - mean) / std, in float32 as
  // torchvision's ToTensor + Normalize compute it; labels: int64 [B].
  void get_batch_into(const std::vector<int64_t>& indices, Batch& out) const override;

  const Tensor& images() const { return images_; }  // uint8 [N, H, W]
  const Tensor& labels() const { return labels_; }  // uint8 [N]
  int64_t height() const { return images_.size(1); }
  int64_t width() const { return images_.size(2); }
  const MnistFiles& files() const { return files_; }
  double mean() const { return mean_; }
  double stddev() const { return stddev_; }

 private:
  void init();

  MnistFiles files_;
  double mean_, stddev_;
  Tensor images_, labels_;
  float lut_[256];  // normalised value of each pixel byte
};

}  // namespace tandem::data
