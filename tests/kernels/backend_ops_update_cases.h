// The backend_ops cases of the in-place and generating kernels: the optimizers' fused updates
// (kernels/optim.h), the dtype casts and GradScaler's unscale + non-finite check (kernels/amp.h),
// and dropout's mask (kernels/pointwise.h). An in-place op's case runs on copies of its inputs and
// returns them after the update. The dropout mask is random and its generator differs by backend
// (kernels/pointwise.h), so its cases return what every backend must agree on: that each element is
// 0 or 1/(1-p), and the kept fraction to one decimal.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops_util.h"
#include "kernels/ops.h"

namespace tandem::backend_ops {

// The copies an in-place case updates.
inline Inputs copies(const Inputs& in) {
  Inputs out;
  for (const Tensor& t : in) out.push_back(t.clone());
  return out;
}

inline void add_optimizer_cases(CaseTable& t) {
  namespace K = kernels;
  // param, grad, two state tensors (in [0, 1): Adadelta's and Adam's second are running squares);
  // specials in the grad.
  const auto operands = [](const Shape& s, uint64_t seed, bool special) {
    return Inputs{uniform(s, seed), special ? specials(s) : uniform(s, seed + 1), uniform(s, seed + 2, 0.0, 1.0),
                  uniform(s, seed + 3, 0.0, 1.0)};
  };
  struct Sgd {
    std::string name;
    K::SgdStep step;
  };
  const std::vector<Sgd> sgd = {{"plain", {0.1f, 0.0f, 0.0f, 0.0f, false, false}},
                                {"momentum_first", {0.1f, 0.9f, 0.1f, 0.01f, false, true}},
                                {"momentum", {0.05f, 0.9f, 0.0f, 0.0f, false, false}},
                                {"nesterov_decay", {0.1f, 0.8f, 0.0f, 0.1f, true, false}}};
  for (const Sgd& s : sgd) {
    const K::SgdStep step = s.step;
    for (bool special : {false, true}) {
      t["sgd_update"].push_back({s.name + (special ? "/specials" : ""), operands({5, 7}, 401, special),
                                 [step](const Inputs& in) {
                                   Inputs v = copies(in);
                                   K::sgd_update(v[0], v[1], step.momentum != 0.0f ? v[2] : Tensor(), step);
                                   return Inputs{v[0], v[2]};
                                 }, 8});
    }
  }
  t["sgd_update"].push_back({"transposed_grad", operands({4, 4}, 407, false), [](const Inputs& in) {
                               Inputs v = copies(in);
                               K::sgd_update(v[0], transposed(v[1]), Tensor(), {0.1f, 0.0f, 0.0f, 0.0f, false, true});
                               return Inputs{v[0]};
                             }});
  t["sgd_update"].push_back({"empty", operands({0, 3}, 405, false), [](const Inputs& in) {
                               Inputs v = copies(in);
                               K::sgd_update(v[0], v[1], v[2], {0.1f, 0.9f, 0.0f, 0.0f, false, false});
                               return Inputs{v[0], v[2]};
                             }});
  for (float decay : {0.0f, 0.05f}) {
    const K::AdadeltaStep step{1.0f, 0.9f, 1e-6f, decay};
    t["adadelta_update"].push_back({"decay_" + std::to_string(decay), operands({6, 5}, 411, false),
                                    [step](const Inputs& in) {
                                      Inputs v = copies(in);
                                      K::adadelta_update(v[0], v[1], v[3], v[2], step);
                                      return Inputs{v[0], v[2], v[3]};
                                    }, 32});
  }
  t["adadelta_update"].push_back({"specials", operands({3, 6}, 415, true), [](const Inputs& in) {
                                    Inputs v = copies(in);
                                    K::adadelta_update(v[0], v[1], v[3], v[2], {1.0f, 0.9f, 1e-6f, 0.0f});
                                    return Inputs{v[0], v[2], v[3]};
                                  }, 32});
  for (bool decoupled : {false, true}) {
    for (bool special : {false, true}) {
      const K::AdamStep step = K::AdamStep::make(1e-3, 0.9, 0.999, 1e-8, 0.01, decoupled, 1 - 0.9 * 0.9,
                                                 1 - 0.999 * 0.999);
      t["adam_update"].push_back({std::string(decoupled ? "adamw" : "adam") + (special ? "/specials" : ""),
                                  operands({7, 4}, 421, special), [step](const Inputs& in) {
                                    Inputs v = copies(in);
                                    K::adam_update(v[0], v[1], v[2], v[3], step);
                                    return Inputs{v[0], v[2], v[3]};
                                  }, 32});
    }
  }
}

inline void add_amp_cases(CaseTable& t) {
  namespace K = kernels;
  // Through float16 or bfloat16 and back: the rounding (to nearest even), overflow to infinity,
  // underflow to zero and the specials.
  for (DType lowp : {kFloat16, kBFloat16}) {
    const std::string n = dtype_name(lowp);
    const Run round_trip = [lowp](const Inputs& in) {
      const Tensor x = in[0];
      return Inputs{K::cast(K::cast(x, lowp), x.dtype())};
    };
    t["cast"].push_back({n + "/values", {uniform({5, 9}, 431, -100.0, 100.0)}, round_trip, 0});
    t["cast"].push_back({n + "/specials", {specials({4, 5})}, round_trip, 0});
    t["cast"].push_back({n + "/range", {values({70000.0, -1e6, 65519.0, 65520.0, 1e-8, -3e-5, 6e-8, 3e38}, {8})},
                         round_trip, 0});
    t["cast"].push_back({n + "/strided", {uniform({3, 8}, 432)}, [lowp](const Inputs& in) {
                           const Tensor x = every_other(in[0]);
                           return Inputs{K::cast(K::cast(x, lowp), x.dtype())};
                         }, 0});
    t["cast"].push_back({n + "/empty", {uniform({0, 4}, 433)}, round_trip, 0});
  }
  // A float32 gradient (GradScaler's); found_inf starts at 0 and becomes 1 on a non-finite element.
  const Run unscale = [](const Inputs& in) {
    const Tensor grad = in[0].to(kFloat32).clone();
    const Tensor found = Tensor::zeros({1}, kFloat32, grad.device());
    K::unscale_and_check_(grad, found, 0.125);
    return Inputs{grad, found};
  };
  t["unscale_and_check_"] = {{"finite", {uniform({6, 7}, 441, -1e4, 1e4)}, unscale},
                             {"inf", {values({1.0, -kInf, 2.0, 3.0}, {4})}, unscale},
                             {"nan", {values({1.0, 2.0, kNaN}, {3})}, unscale},
                             {"specials", {specials({2, 9})}, unscale},
                             {"many_blocks", {uniform({300000}, 443, -100.0, 100.0)}, unscale},
                             {"empty", {uniform({0}, 442)}, unscale}};
}

inline void add_dropout_cases(CaseTable& t) {
  namespace K = kernels;
  // in[0]: any tensor of the run's dtype and device (the mask's).
  const auto dropout = [](const Shape& shape, double p) {
    return [shape, p](const Inputs& in) {
      Generator gen(451);
      const Tensor m = K::dropout_mask(shape, p, in[0].dtype(), in[0].device(), gen);
      const std::vector<double> v = m.to(Device::cpu()).to(kFloat64).to_vector<double>();
      const double keep = 1.0 / (1.0 - p);
      std::vector<double> valid(v.size());
      double kept = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        const bool one = std::abs(v[i] - keep) <= 1e-6 * keep;
        valid[i] = (v[i] == 0.0 || one) ? 1.0 : 0.0;
        kept += one ? 1.0 : 0.0;
      }
      const double fraction = v.empty() ? 0.0 : std::round(10.0 * kept / static_cast<double>(v.size())) / 10.0;
      return Inputs{Tensor::from_vector<double>(valid, shape).to(kUInt8).to(in[0].device()),
                    Tensor::full({}, fraction, in[0].dtype(), in[0].device())};
    };
  };
  t["dropout_mask"] = {{"p0", {uniform({1}, 452)}, dropout({40, 50}, 0.0)},
                       {"p0.3", {uniform({1}, 453)}, dropout({100, 100}, 0.3)},
                       {"p0.9", {uniform({1}, 454)}, dropout({100, 100}, 0.9)},
                       {"empty", {uniform({1}, 455)}, dropout({0, 7}, 0.5)}};
}

inline void add_update_cases(CaseTable& t) {
  add_optimizer_cases(t);
  add_amp_cases(t);
  add_dropout_cases(t);
}

}  // namespace tandem::backend_ops
