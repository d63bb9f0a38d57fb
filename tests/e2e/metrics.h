// Test helper: reads tandem-mnist's --metrics-out JSON lines. Train lines
// must count iterations 1, 2, ... within each epoch and epochs 1, 2, ...
// (a fatal test failure otherwise); the last epoch and eval lines are kept.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace tandem::test {

struct Metrics {
  std::vector<double> losses, lrs;  // "train" lines, in order
  nlohmann::json epoch, eval;       // the last of each
};

inline void read_metrics(const std::filesystem::path& file, Metrics& m) {
  std::ifstream in(file);
  ASSERT_TRUE(in) << "no metrics file at " << file;
  std::string line;
  int line_no = 0, epoch = 0, iter = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      FAIL() << file << ":" << line_no << ": not JSON (" << e.what() << "): " << line;
    }
    const std::string type = j.value("type", "");
    if (type == "train") {
      if (j.at("epoch").get<int>() != epoch) {
        ASSERT_EQ(j.at("epoch").get<int>(), epoch + 1) << "epochs must count from 1 without gaps: " << line;
        epoch = j.at("epoch").get<int>();
        iter = 0;
      }
      ASSERT_EQ(j.at("iter").get<int>(), ++iter) << "iterations must count from 1 without gaps: " << line;
      m.losses.push_back(j.at("loss").get<double>());
      m.lrs.push_back(j.at("lr").get<double>());
    } else if (type == "epoch") {
      m.epoch = j;
    } else if (type == "eval") {
      m.eval = j;
    }
  }
}

inline double rel(double actual, double expected) { return std::abs(actual - expected) / std::abs(expected); }

// Mean of v over steps first..last (counted from 1, inclusive).
inline double mean(const std::vector<double>& v, int first, int last) {
  double s = 0;
  for (int k = first; k <= last; ++k) s += v[k - 1];
  return s / (last - first + 1);
}

// (epoch, iter) -> loss of every "train" line, a later line for the same iteration replacing an
// earlier one (a run killed after its last checkpoint repeats iterations, and the resumed run's
// lines follow); `accuracy`, when given, receives the last eval line's test_accuracy.
using Losses = std::map<std::pair<int, int>, double>;
inline Losses read_losses(const std::filesystem::path& file, double* accuracy = nullptr) {
  Losses out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == "train") out[{j.at("epoch").get<int>(), j.at("iter").get<int>()}] = j.at("loss");
    if (accuracy && j.value("type", "") == "eval") *accuracy = j.at("test_accuracy").get<double>();
  }
  return out;
}

}  // namespace tandem::test
