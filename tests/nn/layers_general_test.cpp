// The general layers (nn/layers_general.h): PyTorch's state_dict names through a ModuleList, default
// initialisation (LayerNorm ones/zeros, Embedding's zeroed padding row), Dropout following
// train()/eval(), and each forward equal to its functional op.
#include <gtest/gtest.h>

#include <cmath>

#include "core/random.h"
#include "nn/nn.h"

using namespace tandem;

namespace {

// A tiny transformer-like block: token embedding, then a list of (LayerNorm, Linear) pairs.
class Block : public nn::Module {
 public:
  Block() {
    embed = register_module("embed", std::make_shared<nn::Embedding>(10, 4, 0));
    layers = register_module("layers", std::make_shared<nn::ModuleList>());
    layers->push_back(std::make_shared<nn::LayerNorm>(Shape{4}));
    layers->push_back(std::make_shared<nn::Linear>(4, 4));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.5));
    act = register_module("act", std::make_shared<nn::GELU>("tanh"));
  }
  Tensor forward(const Tensor& tokens) override {
    Tensor h = embed->forward(tokens);
    for (size_t i = 0; i < layers->size(); ++i) h = (*layers)[i]->forward(h);
    return drop->forward(act->forward(h));
  }
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::GELU> act;
};

}  // namespace

TEST(GeneralLayers, StateDictNamesAsPyTorch) {
  Block b;
  std::vector<std::string> names;
  for (const auto& [name, t] : b.state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"embed.weight", "layers.0.weight", "layers.0.bias", "layers.1.weight",
                                             "layers.1.bias"}));
}

TEST(GeneralLayers, InitialisationAndForward) {
  manual_seed(3);
  Block b;
  EXPECT_EQ(b.embed->weight.select(0, 0).to_vector<float>(), std::vector<float>(4, 0.0f));  // padding row
  double sq = 0;
  for (float v : b.embed->weight.to_vector<float>()) sq += v * v;
  EXPECT_GT(sq, 0.0);
  auto* ln = dynamic_cast<nn::LayerNorm*>((*b.layers)[0].get());
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(ln->weight.to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(ln->bias.to_vector<float>(), std::vector<float>(4, 0.0f));

  const Tensor tokens = Tensor::from_vector<int64_t>({1, 0, 9, 3, 3, 2}, {2, 3});
  b.eval();
  const Tensor y = b.forward(tokens);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
  auto* lin = dynamic_cast<nn::Linear*>((*b.layers)[1].get());
  const Tensor ref = F::gelu(F::linear(F::layer_norm(F::embedding(tokens, b.embed->weight, 0), {4}), lin->weight,
                                       lin->bias),
                             "tanh");
  EXPECT_EQ(y.to_vector<float>(), ref.to_vector<float>());  // eval: dropout is the identity

  b.train();
  const auto yt = b.forward(tokens).to_vector<float>();
  const auto r = ref.to_vector<float>();
  int dropped = 0;
  for (size_t i = 0; i < yt.size(); ++i) {
    if (yt[i] == 0.0f && r[i] != 0.0f) {
      ++dropped;
    } else {
      EXPECT_FLOAT_EQ(yt[i], 2.0f * r[i]);  // kept elements scaled by 1 / (1 - 0.5)
    }
  }
  EXPECT_GT(dropped, 0);

  // Training reaches the embedding rows that were used, except the padding row.
  F::sum(b.forward(tokens)).backward();
  EXPECT_EQ(b.embed->weight.grad().select(0, 0).to_vector<float>(), std::vector<float>(4, 0.0f));
}

TEST(GeneralLayers, BadArgumentsAndModuleListForward) {
  EXPECT_THROW(nn::Dropout(1.5), Error);
  EXPECT_THROW(nn::LayerNorm(Shape{}), Error);
  EXPECT_THROW(nn::Embedding(4, 2, 4), Error);
  EXPECT_THROW(nn::GELU("fast"), Error);
  nn::ModuleList list{std::make_shared<nn::GELU>()};
  EXPECT_THROW(list[1], Error);
  try {
    list.forward(Tensor::zeros({1}));
    FAIL() << "ModuleList::forward did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ModuleList has no forward"), std::string::npos);
  }
}
