// A character-level corpus: reads a text file, or every fortune file of a directory (skipping the
// strfile indexes *.dat, the *.u8 links and the ASCII-art files), maps each distinct byte to a
// token id, and splits the token stream into a training part and a held-out validation part (the
// last `val_fraction`). unigram_entropy() is the entropy, in nats, of the corpus's own byte
// frequencies: the loss of the best model that ignores context, the bar a language model must pass.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"

namespace gpt {

class CharCorpus {
 public:
  CharCorpus(const std::string& path, double val_fraction) {
    namespace fs = std::filesystem;
    TANDEM_CHECK(fs::exists(path), "corpus: ", path,
                 " does not exist (install Debian's 'fortunes' package, e.g. scripts/setup.sh, or pass --corpus FILE)");
    std::vector<fs::path> files;
    if (fs::is_directory(path)) {
      for (const auto& e : fs::directory_iterator(path)) {
        const std::string name = e.path().filename().string();
        if (!e.is_regular_file() || e.is_symlink() || e.path().extension() == ".dat" || e.path().extension() == ".u8" ||
            name == "art" || name == "ascii-art")
          continue;
        files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      TANDEM_CHECK(in.good(), "corpus: cannot read ", f.string());
      for (auto it = std::istreambuf_iterator<char>(in); it != std::istreambuf_iterator<char>(); ++it) {
        const unsigned char ch = static_cast<unsigned char>(*it);
        if (ch < 128 && ch != '\r') text.push_back(static_cast<char>(ch));  // ASCII text only
      }
      sources.push_back(f.filename().string());
    }
    TANDEM_CHECK(text.size() >= 1000, "corpus: ", path, " holds ", text.size(), " bytes; need at least 1000");
    std::array<int64_t, 256> ids;
    ids.fill(-1);
    for (unsigned char ch : text) ids[ch] = 0;
    for (int b = 0; b < 256; ++b)
      if (ids[b] == 0) {
        ids[b] = static_cast<int64_t>(chars.size());
        chars.push_back(static_cast<char>(b));
      }
    tokens.reserve(text.size());
    for (unsigned char ch : text) tokens.push_back(ids[ch]);
    split = static_cast<int64_t>(static_cast<double>(tokens.size()) * (1.0 - val_fraction));
  }

  int64_t vocab_size() const { return static_cast<int64_t>(chars.size()); }

  double unigram_entropy() const {
    std::vector<double> count(chars.size(), 0.0);
    for (int64_t t : tokens) count[t] += 1.0;
    double h = 0.0;
    for (double c : count) {
      const double p = c / static_cast<double>(tokens.size());
      if (p > 0) h -= p * std::log(p);
    }
    return h;
  }

  // B windows of T + 1 tokens from [lo, hi): inputs [B, T] and next-token targets [B, T].
  struct Batch {
    tandem::Tensor x, y;
  };
  Batch window_batch(const std::vector<int64_t>& starts, int64_t T) const {
    const int64_t B = static_cast<int64_t>(starts.size());
    std::vector<int64_t> x(B * T), y(B * T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        x[b * T + t] = tokens[starts[b] + t];
        y[b * T + t] = tokens[starts[b] + t + 1];
      }
    return {tandem::Tensor::from_vector(x, {B, T}), tandem::Tensor::from_vector(y, {B, T})};
  }
  // Random training windows.
  Batch train_batch(int64_t B, int64_t T, tandem::Generator& gen) const {
    std::vector<int64_t> starts(B);
    for (auto& s : starts) s = static_cast<int64_t>(gen.below(static_cast<uint64_t>(split - T - 1)));
    return window_batch(starts, T);
  }
  // The validation part cut into consecutive windows (the same on every call and rank), at most
  // max_windows of them, spread evenly over it.
  std::vector<int64_t> val_starts(int64_t T, int64_t max_windows) const {
    const int64_t n = std::max<int64_t>(1, std::min<int64_t>(max_windows, (tokens_size() - split - 1) / T));
    const int64_t stride = std::max<int64_t>(T, (tokens_size() - split - 1 - T) / n);
    std::vector<int64_t> s;
    for (int64_t i = 0; i < n; ++i) s.push_back(split + i * stride);
    return s;
  }
  int64_t tokens_size() const { return static_cast<int64_t>(tokens.size()); }

  std::string text;
  std::vector<std::string> sources;
  std::vector<char> chars;      // token id -> byte
  std::vector<int64_t> tokens;  // the whole corpus as ids
  int64_t split = 0;            // tokens[0, split) train, [split, end) validation
};

}  // namespace gpt
