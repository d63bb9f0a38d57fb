// basics: the public API in small pieces (tensors, autograd, modules, optimizers, errors), each
// checked against values worked out by hand. docs/embedding.md quotes the marked regions, so the
// documentation's examples are compiled and run by scripts/ci/embed.sh.
// Guarantees: exit 0 when every value is as expected; otherwise prints which one differed, exit 1.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "nn/functional.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "optim/optimizer.h"

using namespace tandem;

namespace {

int failures = 0;
void expect_near(const char* what, double got, double want) {
  if (std::abs(got - want) > 1e-5) {
    std::printf("basics: %s = %.6f, expected %.6f\n", what, got, want);
    ++failures;
  }
}

void demo_tensors() {
  // [basics-tensors]
  Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});  // float32, CPU
  Tensor z = Tensor::zeros({2, 3});                 // also ones, full, empty; dtype and device optional
  Tensor row = a.select(0, 1);                      // view of [4 5 6]: shares a's storage
  Tensor t = a.transpose(0, 1).contiguous();        // [3, 2] copy in row-major order
  a.data<float>()[0] = 10;                          // host data, dtype checked
  z.add_(a, 0.5);                                   // in place: z += 0.5 * a
  std::vector<float> v = t.to_vector<float>();      // {1, 4, 2, 5, 3, 6}
  // [basics-tensors]
  expect_near("row[0]", row.to_vector<float>()[0], 4);
  expect_near("t[1]", v[1], 4);
  expect_near("z[0]", z.to_vector<float>()[0], 5);
  if (a.str() != "float32[2, 3] on cpu") {
    std::printf("basics: a.str() = %s\n", a.str().c_str());
    ++failures;
  }
}

void demo_autograd() {
  // [basics-autograd]
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  w.set_requires_grad(true);                                  // a leaf that collects .grad
  Tensor x = Tensor::from_vector(std::vector<float>{4, 5, 6}, {3});
  Tensor loss = F::sum(F::mul(F::mul(w, w), x));              // sum(w^2 * x)
  loss.backward();                                            // d loss / d w = 2 w x
  std::vector<float> g = w.grad().to_vector<float>();         // {8, 20, 36}
  {
    NoGradGuard no_grad;                                      // records nothing: evaluation, updates
    Tensor y = F::mul(w, x);                                  // y.requires_grad() == false
  }
  // [basics-autograd]
  expect_near("loss", loss.item<double>(), 4 + 20 + 54);
  expect_near("grad[0]", g[0], 8);
  expect_near("grad[2]", g[2], 36);
}

// [basics-module]
// relu((x W^T + b) P): a module with a child module and a parameter of its own.
class Projected : public nn::Module {
 public:
  Projected(int64_t in, int64_t out) {
    linear_ = register_module("linear", std::make_shared<nn::Linear>(in, out));
    proj_ = register_parameter("proj", Tensor::ones({out, out}));  // a leaf that requires grad
  }
  Tensor forward(const Tensor& x) override { return F::relu(F::matmul(linear_->forward(x), proj_)); }

 private:
  std::shared_ptr<nn::Linear> linear_;
  Tensor proj_;
};
// [basics-module]

void demo_modules_and_optimizers() {
  // [basics-optim]
  manual_seed(0);                                          // default initialisation draws from it
  Projected model(4, 2);
  // named_parameters(): "proj", then the child's "linear.weight", "linear.bias"
  optim::SGD sgd(model.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  Tensor x = Tensor::ones({8, 4});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    Tensor loss = F::sum(F::mul(model(x), model(x)));     // drive the outputs to zero
    sgd.zero_grad();
    loss.backward();
    sgd.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::map<std::string, Tensor> state;                     // state_dict(): PyTorch's names
  for (auto& [name, tensor] : model.state_dict()) state[name] = tensor.clone();
  model.load_state_dict(state);                            // checks every name and shape first
  // [basics-optim]
  if (model.named_parameters().size() != 3 || model.named_parameters()[0].first != "proj") {
    std::printf("basics: unexpected parameter names\n");
    ++failures;
  }
  if (!(last < 0.1 * first)) {
    std::printf("basics: loss %.6f -> %.6f, expected a tenfold fall\n", first, last);
    ++failures;
  }
}

void demo_errors() {
  // [basics-errors]
  try {
    F::matmul(Tensor::ones({2, 3}), Tensor::ones({2, 3}));  // inner dimensions differ
  } catch (const tandem::Error& e) {                         // says what was wrong and what was expected
    std::printf("caught as expected: %s\n", e.what());
    return;
  }
  // [basics-errors]
  std::printf("basics: a shape mismatch did not throw tandem::Error\n");
  ++failures;
}

}  // namespace

int main() {
  demo_tensors();
  demo_autograd();
  demo_modules_and_optimizers();
  demo_errors();
  if (failures == 0) std::printf("basics: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
