// ExponentialMovingAverage (see ema.h).
#include "train/hooks/ema.h"

#include "core/autograd.h"
#include "core/error.h"

namespace tandem::train {

ExponentialMovingAverage::ExponentialMovingAverage(double momentum, int64_t interval)
    : momentum_(momentum), interval_(interval) {
  TANDEM_CHECK(momentum > 0 && momentum < 1, "ExponentialMovingAverage: momentum must be in (0, 1), got ", momentum);
  TANDEM_CHECK(interval >= 1, "ExponentialMovingAverage: interval must be >= 1, got ", interval);
}

void ExponentialMovingAverage::reset(const nn::NamedTensors& source) {
  NoGradGuard no_grad;
  averaged_.clear();
  for (const auto& [name, t] : source) averaged_.emplace_back(name, t.detach().clone());
  steps_ = 0;
}

void ExponentialMovingAverage::check_matches(const nn::NamedTensors& source) const {
  TANDEM_CHECK(source.size() == averaged_.size(), "ExponentialMovingAverage: the model has ", source.size(),
               " tensors but the average ", averaged_.size());
  for (size_t i = 0; i < source.size(); ++i)
    TANDEM_CHECK(source[i].first == averaged_[i].first, "ExponentialMovingAverage: tensor ", i, " is '",
                 source[i].first, "' in the model but '", averaged_[i].first, "' in the average");
}

void ExponentialMovingAverage::update(const nn::NamedTensors& source) {
  check_matches(source);
  NoGradGuard no_grad;
  if (steps_ == 0) {
    copy_from(source);
  } else if (steps_ % interval_ == 0) {
    for (size_t i = 0; i < source.size(); ++i) {
      Tensor& avg = averaged_[i].second;
      if (!is_floating(avg.dtype())) continue;
      Tensor diff = source[i].second.detach().clone();
      diff.add_(avg, -1.0);        // source - averaged
      avg.add_(diff, momentum_);   // averaged + momentum * (source - averaged)
    }
  }
  ++steps_;
}

void ExponentialMovingAverage::copy_from(const nn::NamedTensors& source) {
  check_matches(source);
  NoGradGuard no_grad;
  for (size_t i = 0; i < source.size(); ++i) averaged_[i].second.copy_(source[i].second);
}

void ExponentialMovingAverage::swap_with(const nn::NamedTensors& source) {
  check_matches(source);
  NoGradGuard no_grad;
  for (size_t i = 0; i < source.size(); ++i) {
    Tensor src = source[i].second;
    Tensor held = src.detach().clone();
    src.copy_(averaged_[i].second);
    averaged_[i].second.copy_(held);
  }
}

void ExponentialMovingAverage::save(TensorMap& out, const std::string& prefix) const {
  for (const auto& [name, t] : averaged_) out[prefix + "module." + name] = t;
  out[prefix + "steps"] = Tensor::scalar(static_cast<double>(steps_), kInt64);
}

void ExponentialMovingAverage::load(const TensorMap& in, const std::string& prefix) {
  NoGradGuard no_grad;
  for (auto& [name, t] : averaged_) {
    auto it = in.find(prefix + "module." + name);
    TANDEM_CHECK(it != in.end(), "the checkpoint has no '", prefix, "module.", name, "'");
    TANDEM_CHECK(it->second.shape() == t.shape(), "the checkpoint's '", prefix, "module.", name, "' has shape ",
                 it->second.str(), ", the model's ", t.str());
    t.copy_(it->second);
  }
  auto steps = in.find(prefix + "steps");
  TANDEM_CHECK(steps != in.end(), "the checkpoint has no '", prefix, "steps'");
  steps_ = static_cast<int64_t>(steps->second.item<double>());
}

}  // namespace tandem::train
