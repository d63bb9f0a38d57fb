#include <gtest/gtest.h>

#include "core/autograd.h"
#include "nn/functional.h"

using namespace tandem;

TEST(Autograd, GradientsAccumulateAcrossUses) {
  Tensor a = Tensor::from_vector<double>({1, 2, 3}, {3}).set_requires_grad(true);
  // y = sum(a * a + a): dy/da = 2a + 1
  Tensor y = F::sum(F::add(F::mul(a, a), a));
  y.backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{3, 5, 7}));
  // A second backward adds to .grad.
  F::sum(a).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{4, 6, 8}));
}

// sum's backward broadcasts the incoming 0-D gradient over the input's shape on the gradient's own
// device (a stride-0 view copied, never read by the host): every element gets exactly that value.
TEST(Autograd, SumBackwardBroadcastsTheGradient) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad(true);
  F::scale(F::sum(a), 0.1f).backward();
  ASSERT_EQ(a.grad().shape(), (Shape{2, 3}));
  EXPECT_TRUE(a.grad().is_contiguous());
  EXPECT_EQ(a.grad().to_vector<float>(), std::vector<float>(6, 0.1f));
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor a = Tensor::ones({2}, kFloat64).set_requires_grad(true);
  NoGradGuard guard;
  Tensor y = F::mul(a, a);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
}

TEST(Autograd, BackwardOfNonScalarNeedsGradient) {
  Tensor a = Tensor::ones({2}, kFloat64).set_requires_grad(true);
  Tensor y = F::scale(a, 2.0);
  EXPECT_THROW(y.backward(), Error);
  y.backward(Tensor::from_vector<double>({1, 10}, {2}));
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{2, 20}));
}

TEST(Autograd, PostAccumulateHooksFireOncePerBackwardInReverseExecutionOrder) {
  // Three layers used in order w1, w2, w3; w2 is used twice, so its gradient
  // is only final once both uses have been differentiated.
  Tensor x = Tensor::from_vector<double>({1, 2}, {1, 2});
  Tensor w1 = Tensor::from_vector<double>({1, 0, 0, 1}, {2, 2}).set_requires_grad(true);
  Tensor w2 = Tensor::from_vector<double>({2, 0, 0, 2}, {2, 2}).set_requires_grad(true);
  Tensor w3 = Tensor::from_vector<double>({1, 1, 1, 1}, {2, 2}).set_requires_grad(true);
  std::vector<std::string> fired;
  w1.register_post_accumulate_grad_hook([&](const Tensor& t) {
    fired.push_back("w1");
    EXPECT_TRUE(t.grad().defined());
  });
  w2.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("w2"); });
  w3.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("w3"); });

  for (int iter = 0; iter < 2; ++iter) {
    fired.clear();
    Tensor h = F::matmul(F::matmul(F::matmul(x, w1), w2), w2);
    Tensor y = F::sum(F::matmul(h, w3));
    y.backward();
    EXPECT_EQ(fired, (std::vector<std::string>{"w3", "w2", "w1"})) << "iteration " << iter;
  }
}

TEST(Autograd, HookSeesFinalGradient) {
  Tensor w = Tensor::from_vector<double>({3}, {1}).set_requires_grad(true);
  double seen = 0;
  w.register_post_accumulate_grad_hook([&](const Tensor& t) { seen = t.grad().item<double>(); });
  // y = w*w + w*w -> dy/dw = 4w = 12, arriving along two paths.
  F::sum(F::add(F::mul(w, w), F::mul(w, w))).backward();
  EXPECT_DOUBLE_EQ(seen, 12.0);
}

namespace {

// Passes the gradient through and notes that it ran.
class Probe : public Node {
 public:
  explicit Probe(bool* ran) : ran_(ran) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    *ran_ = true;
    return {grads[0]};
  }
  std::string name() const override { return "Probe"; }

 private:
  bool* ran_;
};

}  // namespace

// y = w2 * probe(w1 * x): w2's gradient is final after the first node, so its post-accumulate hook
// runs before the probe's backward, in the second backward as in the first (the gradient
// accumulator made in the first iteration must not wait behind the nodes of the second; this is
// what lets DDP and FSDP reduce while backward still runs).
TEST(Autograd, PostAccumulateHooksRunAsSoonAsTheGradientIsReadyInEveryIteration) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3}, {3});
  Tensor w1 = Tensor::from_vector<float>({0.5, -1, 2}, {3}).set_requires_grad(true);
  Tensor w2 = Tensor::from_vector<float>({3, 1, -2}, {3}).set_requires_grad(true);
  bool probe_ran = false;
  std::vector<bool> probe_ran_at_hook;
  w2.register_post_accumulate_grad_hook([&](const Tensor&) { probe_ran_at_hook.push_back(probe_ran); });
  for (int iteration = 0; iteration < 3; ++iteration) {
    probe_ran = false;
    w1.set_grad(Tensor());
    w2.set_grad(Tensor());
    Tensor h = F::mul(w1, x);
    Tensor p = h.detach();
    autograd::record(std::make_shared<Probe>(&probe_ran), {h}, {&p});
    F::sum(F::mul(w2, p)).backward();
    EXPECT_TRUE(probe_ran) << "iteration " << iteration;
    EXPECT_EQ(w1.grad().to_vector<float>(), (std::vector<float>{3, 2, -6})) << "iteration " << iteration;
  }
  EXPECT_EQ(probe_ran_at_hook, (std::vector<bool>{false, false, false}));
}
