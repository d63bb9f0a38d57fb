// Mlp (see mlp.h): children "0", "2", ... are the Linear layers, as torch.nn.Sequential names
// them when ReLUs sit at the odd indices.
#include "nn/models/mlp.h"

#include <string>

#include "nn/functional.h"

namespace tandem::nn::models {

Mlp::Mlp(const MlpOptions& o) : options(o) {
  TANDEM_CHECK(o.in_features > 0 && o.hidden > 0 && o.layers >= 0 && o.out_features > 0,
               "Mlp: sizes must be positive (layers >= 0), got in_features=", o.in_features,
               " hidden=", o.hidden, " layers=", o.layers, " out_features=", o.out_features);
  int64_t in = o.in_features;
  for (int64_t i = 0; i <= o.layers; ++i) {
    const int64_t out = i == o.layers ? o.out_features : o.hidden;
    linears.push_back(register_module(std::to_string(2 * i), std::make_shared<Linear>(in, out)));
    in = out;
  }
}

Tensor Mlp::forward(const Tensor& x) {
  TANDEM_CHECK(x.dim() == 2 && x.size(1) == options.in_features, "Mlp: expected input [N, ",
               options.in_features, "], got ", x.str());
  Tensor h = x;
  for (size_t i = 0; i < linears.size(); ++i) {
    h = (*linears[i])(h);
    if (i + 1 < linears.size()) h = F::relu(h);
  }
  return h;
}

int64_t Mlp::parameter_count(const MlpOptions& o) {
  int64_t total = 0, in = o.in_features;
  for (int64_t i = 0; i <= o.layers; ++i) {
    const int64_t out = i == o.layers ? o.out_features : o.hidden;
    total += in * out + out;
    in = out;
  }
  return total;
}

}  // namespace tandem::nn::models
