#include "nn/init.h"

#include <cmath>

namespace tandem::nn::init {

void uniform_(Tensor& t, double lo, double hi, Generator& gen) {
  Tensor host = Tensor::empty(t.shape(), kFloat64);
  double* p = host.data<double>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = gen.uniform(lo, hi);
  t.copy_(host);
}

void normal_(Tensor& t, double mean, double std, Generator& gen) {
  Tensor host = Tensor::empty(t.shape(), kFloat64);
  double* p = host.data<double>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = mean + std * gen.normal();
  t.copy_(host);
}

void kaiming_uniform_default_(Tensor& t, int64_t fan_in, Generator& gen) {
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  uniform_(t, -bound, bound, gen);
}

}  // namespace tandem::nn::init
