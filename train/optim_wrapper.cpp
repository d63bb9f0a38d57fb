// OptimWrapper, AmpOptimWrapper and OptimWrapperDict (see optim_wrapper.h).
#include "train/optim_wrapper.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "nn/functional.h"
#include "optim/clip_grad.h"
#include "train/registries.h"

namespace tandem::train {
namespace {

Schema optim_wrapper_schema(bool amp) {
  const OptimWrapperOptions d;
  Schema s = {arg_of("optimizer", ArgKind::Dict, "", "the optimizer (built before the wrapper)"),
              at_least(arg_int("accumulative_counts", d.accumulative_counts, "backward passes per optimizer step"), 1),
              nullable(arg_of("clip_grad", ArgKind::Dict, "null", "dict(max_norm, norm_type): clip the gradients' norm"))};
  if (!amp) return s;
  ArgSpec dtype = nullable(arg_of("dtype", ArgKind::String, "null", "autocast's dtype (null: by device)"));
  dtype.choices = {"float16", "bfloat16"};
  s.push_back(dtype);
  s.push_back(arg_of("loss_scale", ArgKind::Any, "\"dynamic\"",
                     "the float16 loss scaler: 'dynamic', a number (a static scale) or dict(init_scale, "
                     "growth_factor, backoff_factor, growth_interval, enabled)"));
  return s;
}

// The wrapper's options from its checked keywords.
OptimWrapperOptions options_of(const Kwargs& k, bool amp) {
  OptimWrapperOptions o;
  o.accumulative_counts = k.integer("accumulative_counts");
  if (k.given("clip_grad")) {
    Kwargs clip(k.owner() + ".clip_grad");
    const nlohmann::json given = nlohmann::json::parse(k.items().at("clip_grad"));
    for (const auto& [key, value] : given.items()) clip.set_json(key, value.dump());
    const Kwargs c = apply_schema(clip, clip_grad_schema());
    o.clip_max_norm = c.number("max_norm", 0);
    o.clip_norm_type = c.number("norm_type", 2);
  }
  if (amp) {
    const std::string dtype = k.given("dtype") ? k.string("dtype") : "";
    TANDEM_CHECK(!dtype.empty(), k.label("dtype"), " is null: the Runner decides it by device before building "
                 "the wrapper; outside a Runner give 'float16' or 'bfloat16'");
    o.precision = dtype == "float16" ? amp::Precision::kFloat16 : amp::Precision::kBFloat16;
    o.loss_scale = parse_loss_scale(k.items().at("loss_scale"), k.owner() + ".loss_scale");
  }
  return o;
}

}  // namespace

Schema grad_scaler_schema() {
  const optim::GradScalerOptions d;
  return {above(arg_number("init_scale", d.init_scale, "the first scale"), 0),
          above(arg_number("growth_factor", d.growth_factor, "the scale's factor after growth_interval clean steps"), 1),
          below(above(arg_number("backoff_factor", d.backoff_factor, "the scale's factor after a skipped step"), 0), 1),
          at_least(arg_int("growth_interval", d.growth_interval, "clean steps before the scale grows"), 1),
          arg_bool("enabled", d.enabled, "false: no scaling")};
}

LossScale parse_loss_scale(const std::string& json_text, const std::string& path) {
  const nlohmann::json v = nlohmann::json::parse(json_text, nullptr, false);
  const std::string label = "config key '" + path + "'";
  LossScale out;
  if (v.is_string() && v == "dynamic") return out;
  if (v.is_number()) {
    const double s = v.get<double>();
    TANDEM_CHECK(s > 0 && std::isfinite(static_cast<float>(s)), label,
                 " must be a positive number (finite in float32) for a static scale, got ", json_text);
    out.scaler.init_scale = out.static_scale = s;
    return out;
  }
  TANDEM_CHECK(v.is_object(), label, " must be 'dynamic', a positive number or a dict of GradScaler's keywords "
               "(init_scale, growth_factor, backoff_factor, growth_interval, enabled), got ", json_text);
  Kwargs given(path);
  for (const auto& [key, value] : v.items()) given.set_json(key, value.dump());
  const Kwargs k = apply_schema(given, grad_scaler_schema());
  out.scaler = {.init_scale = k.number("init_scale"),
                .growth_factor = k.number("growth_factor"),
                .backoff_factor = k.number("backoff_factor"),
                .growth_interval = k.integer("growth_interval"),
                .enabled = k.boolean("enabled")};
  return out;
}

Schema clip_grad_schema() {
  return {required(above(arg_of("max_norm", ArgKind::Number, "", "the largest total norm"), 0)),
          at_least(arg_number("norm_type", 2.0, "the norm's p"), 1)};
}

OptimWrapper::OptimWrapper(std::unique_ptr<optim::Optimizer> optimizer, OptimWrapperOptions options)
    : optimizer_(std::move(optimizer)), o_(options) {
  TANDEM_CHECK(optimizer_ != nullptr, "OptimWrapper: the optimizer is null");
  TANDEM_CHECK(o_.accumulative_counts >= 1, "OptimWrapper: accumulative_counts must be >= 1, got ",
               o_.accumulative_counts);
  // fp16 needs loss scaling (gradients underflow); bf16 has f32's range and does not.
  optim::GradScalerOptions scaler = o_.loss_scale.scaler;
  scaler.enabled = scaler.enabled && o_.precision == amp::Precision::kFloat16;
  scaler_ = std::make_unique<optim::GradScaler>(scaler);
}

void OptimWrapper::initialize_count_status(int64_t done, int64_t max_counts) {
  inner_count_ = done;
  max_counts_ = max_counts;
}

bool OptimWrapper::should_sync() const {
  return (inner_count_ + 1) % o_.accumulative_counts == 0 || inner_count_ + 1 == max_counts_;
}

bool OptimWrapper::should_update() const {
  return inner_count_ % o_.accumulative_counts == 0 || inner_count_ == max_counts_;
}

Tensor OptimWrapper::scale_loss(const Tensor& loss) const {
  const int64_t n = o_.accumulative_counts;
  if (n == 1) return loss;
  const int64_t remainder = max_counts_ % n;
  const int64_t factor = inner_count_ < max_counts_ - remainder ? n : remainder;
  return F::scale(loss, 1.0 / static_cast<double>(factor));
}

void OptimWrapper::backward(const Tensor& loss) {
  if (scaler_->enabled())
    scaler_->scale(loss).backward();
  else
    loss.backward();
  ++inner_count_;
}

double OptimWrapper::step() {
  double norm = -1;
  if (o_.clip_max_norm > 0) {
    if (scaler_->enabled()) scaler_->unscale(*optimizer_);
    if (clip_) {
      norm = clip_(o_.clip_max_norm, o_.clip_norm_type);
    } else {
      std::vector<Tensor> params;
      for (const auto& g : optimizer_->param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
      norm = optim::clip_grad_norm_(params, o_.clip_max_norm, o_.clip_norm_type).item<double>();
    }
  }
  if (scaler_->enabled()) {
    scaler_->step(*optimizer_);  // skipped when a gradient is inf/NaN
    if (o_.loss_scale.static_scale > 0)
      scaler_->update(o_.loss_scale.static_scale);  // MMEngine's update(self._scale_update_param)
    else
      scaler_->update();
  } else {
    optimizer_->step();
  }
  return norm;
}

bool OptimWrapper::update_params(const Tensor& loss) {
  backward(scale_loss(loss));
  if (!should_update()) return false;
  step();
  zero_grad(true);
  return true;
}

Registry<OptimWrapperFactory>& optim_wrappers() {
  static Registry<OptimWrapperFactory>* r = [] {
    auto* reg = new Registry<OptimWrapperFactory>("optim wrapper");
    for (const bool amp : {false, true})
      reg->register_module(
          amp ? "AmpOptimWrapper" : "OptimWrapper",
          [amp](std::unique_ptr<optim::Optimizer> opt, const Kwargs& k) {
            return std::make_unique<OptimWrapper>(std::move(opt), options_of(k, amp));
          },
          optim_wrapper_schema(amp));
    return reg;
  }();
  return *r;
}

void OptimWrapperDict::add(const std::string& name, std::unique_ptr<OptimWrapper> w) {
  TANDEM_CHECK(w != nullptr, "optim_wrapper.", name, ": the factory returned no wrapper");
  TANDEM_CHECK(items_.count(name) == 0, "optim_wrapper.", name, " is given twice");
  items_[name] = std::move(w);
}

OptimWrapper& OptimWrapperDict::at(const std::string& name) {
  auto it = items_.find(name);
  if (it == items_.end()) {
    std::string known;
    for (const auto& [n, w] : items_) known += (known.empty() ? "" : ", ") + n;
    TANDEM_FAIL("optim_wrapper has no wrapper '", name, "'; it has: ", known.empty() ? "(none)" : known);
  }
  return *it->second;
}

std::vector<std::string> OptimWrapperDict::names() const {
  std::vector<std::string> out;
  for (const auto& [n, w] : items_) out.push_back(n);
  return out;
}

OptimWrapperDict build_optim_wrapper_dict(const std::map<std::string, std::string>& config_json,
                                          const std::function<std::vector<Tensor>(const std::string&)>& params_of) {
  OptimWrapperDict out;
  for (const auto& [name, text] : config_json) {
    const std::string owner = "optim_wrapper." + name;
    const nlohmann::json w = nlohmann::json::parse(text, nullptr, false);
    TANDEM_CHECK(w.is_object() && w.contains("optimizer") && w["optimizer"].is_object() &&
                     w["optimizer"].contains("type"),
                 owner, " must be dict(type='OptimWrapper', optimizer=dict(type=..., ...), ...), got ", text);
    Kwargs wk(owner), ok(owner + ".optimizer");
    for (const auto& [key, value] : w.items())
      if (key != "type") wk.set_json(key, value.dump());
    for (const auto& [key, value] : w["optimizer"].items())
      if (key != "type") ok.set_json(key, value.dump());
    std::unique_ptr<optim::Optimizer> opt =
        optimizers().get(w["optimizer"]["type"].get<std::string>())(params_of(name), ok);
    out.add(name, optim_wrappers().get(w.value("type", "OptimWrapper"))(std::move(opt), wk));
  }
  return out;
}

}  // namespace tandem::train
