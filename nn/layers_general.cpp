#include "nn/layers_general.h"

#include "nn/functional.h"
#include "nn/init.h"

namespace tandem::nn {

Dropout::Dropout(double p_) : p(p_) {
  TANDEM_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return F::dropout(x, p, is_training()); }

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine) : normalized_shape(std::move(shape)), eps(eps_) {
  TANDEM_CHECK(!normalized_shape.empty() && shape_numel(normalized_shape) > 0,
               "LayerNorm: normalized_shape must be non-empty with positive sizes, got ", shape_str(normalized_shape));
  if (affine) {
    weight = register_parameter("weight", Tensor::ones(normalized_shape));
    bias = register_parameter("bias", Tensor::zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return F::layer_norm(x, normalized_shape, weight, bias, eps); }

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> padding) : padding_idx(padding) {
  TANDEM_CHECK(num > 0 && dim > 0, "Embedding: num_embeddings and embedding_dim must be positive, got ", num, " and ",
               dim);
  TANDEM_CHECK(!padding || (*padding >= -num && *padding < num), "Embedding: padding_idx ", *padding,
               " out of range for ", num, " embeddings");
  weight = Tensor::empty({num, dim});
  init::normal_(weight, 0.0, 1.0);
  if (padding) weight.select(0, *padding < 0 ? *padding + num : *padding).zero_();
  register_parameter("weight", weight);
}

Tensor Embedding::forward(const Tensor& indices) { return F::embedding(indices, weight, padding_idx); }

GELU::GELU(std::string a) : approximate(std::move(a)) {
  TANDEM_CHECK(approximate == "none" || approximate == "tanh", "GELU: approximate must be \"none\" or \"tanh\", got \"",
               approximate, "\"");
}

Tensor GELU::forward(const Tensor& x) { return F::gelu(x, approximate); }

ModuleList::ModuleList(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(m);
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  TANDEM_CHECK(m != nullptr, "ModuleList: cannot add a null module");
  register_module(std::to_string(children().size()), std::move(m));
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  TANDEM_CHECK(i < children().size(), "ModuleList: index ", i, " out of range for ", children().size(), " modules");
  return children()[i].second;
}

Tensor ModuleList::forward(const Tensor&) {
  TANDEM_FAIL("ModuleList has no forward: call its modules from the forward of the module that owns it");
}

}  // namespace tandem::nn
