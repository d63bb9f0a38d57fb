#include "core/random.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace tandem {

uint64_t Generator::below(uint64_t n) {
  // Rejection sampling keeps the result unbiased.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = engine_();
  while (x >= limit);
  return x % n;
}

double Generator::normal() {
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

std::string Generator::state() const {
  std::ostringstream out;
  out << engine_;
  return out.str();
}

void Generator::set_state(const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 e;
  in >> e;
  TANDEM_CHECK(!in.fail(), "Generator::set_state: not a mt19937_64 state (", state.size(), " characters)");
  engine_ = e;
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().seed(seed); }

}  // namespace tandem
