// A small GPT-style language model written against Tandem's public API: token and position
// embeddings, pre-norm blocks (x + attn(ln1(x)), then x + mlp(ln2(x))) with causal multi-head
// attention and a GELU MLP, a final LayerNorm and an output layer tied to the token embedding.
// forward(idx) takes int64 token ids [B, T] (T <= block_size) and returns logits [B, T, vocab].
// Parameter names follow nanoGPT's layout with PyTorch's module names inside (wte.weight,
// h.0.ln_1.weight, h.0.attn.in_proj_weight, h.0.mlp.0.weight, ...); the output layer has no
// parameter of its own (it is wte.weight).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "nn/attention_layer.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/layers_general.h"
#include "nn/module.h"

namespace gpt {

using tandem::Tensor;
namespace nn = tandem::nn;
namespace F = tandem::nn::functional;

struct Config {
  int64_t vocab_size = 0, block_size = 64, n_layer = 2, n_head = 4, n_embd = 64;
  double dropout = 0.0;
};

// [gpt-block]
class Block : public nn::Module {
 public:
  explicit Block(const Config& c) {
    ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(tandem::Shape{c.n_embd}));
    attn = register_module("attn", std::make_shared<nn::MultiheadAttention>(c.n_embd, c.n_head, c.dropout));
    ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(tandem::Shape{c.n_embd}));
    mlp = register_module("mlp", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
                                     std::make_shared<nn::Linear>(c.n_embd, 4 * c.n_embd), std::make_shared<nn::GELU>(),
                                     std::make_shared<nn::Linear>(4 * c.n_embd, c.n_embd),
                                     std::make_shared<nn::Dropout>(c.dropout)}));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = ln_1->forward(x);
    const Tensor a = attn->forward(h, h, h, Tensor(), /*need_weights=*/false, Tensor(), true, /*is_causal=*/true).output;
    const Tensor y = F::add(x, a);
    return F::add(y, mlp->forward(ln_2->forward(y)));
  }
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<nn::MultiheadAttention> attn;
  std::shared_ptr<nn::Sequential> mlp;
};
// [gpt-block]

class GPT : public nn::Module {
 public:
  explicit GPT(const Config& c) : config(c) {
    wte = register_module("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd));
    wpe = register_module("wpe", std::make_shared<nn::Embedding>(c.block_size, c.n_embd));
    h = register_module("h", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(std::make_shared<Block>(c));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(tandem::Shape{c.n_embd}));
    // GPT-2's initialisation for the embeddings (N(0, 0.02)): with a tied output layer, PyTorch's
    // Embedding default N(0, 1) would start from logits far from uniform.
    nn::init::normal_(wte->weight, 0.0, 0.02);
    nn::init::normal_(wpe->weight, 0.0, 0.02);
    std::vector<int64_t> pos(c.block_size);
    for (int64_t i = 0; i < c.block_size; ++i) pos[i] = i;
    positions_ = Tensor::from_vector(pos, {c.block_size});
  }

  // [gpt-forward]
  Tensor forward(const Tensor& idx) override {
    const int64_t T = idx.size(1);
    TANDEM_CHECK(T <= config.block_size, "GPT: sequence length ", T, " exceeds block_size ", config.block_size);
    // The position ids move to the tokens' device once (a module's to() moves only its parameters
    // and buffers), not on every forward.
    if (positions_.device() != idx.device()) positions_ = positions_.to(idx.device());
    Tensor x = F::add(wte->forward(idx), wpe->forward(F::narrow(positions_, 0, 0, T)));  // [B, T, C]
    for (size_t i = 0; i < h->size(); ++i) x = (*h)[i]->forward(x);
    return F::linear(ln_f->forward(x), wte->weight, Tensor());  // tied: logits = x wte^T
  }
  // [gpt-forward]

  const Config config;
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::ModuleList> h;
  std::shared_ptr<nn::LayerNorm> ln_f;

 private:
  Tensor positions_;
};

}  // namespace gpt
