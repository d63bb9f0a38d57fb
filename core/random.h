// Seeded random numbers. One process-wide default Generator (manual_seed sets
// it); components that need their own stream (samplers, data loaders) own a
// Generator seeded explicitly, so their sequence does not depend on what else
// drew numbers. The engine is mt19937_64 with our own float conversions, so a
// seed gives the same numbers on every platform.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace tandem {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : engine_(seed) {}
  void seed(uint64_t s) { engine_.seed(s); }
  uint64_t next_u64() { return engine_(); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n);
  double normal();  // Box-Muller

  // The engine's full state as text (std::mt19937_64's stream format), for
  // checkpoints: set_state(state()) continues the exact same sequence.
  // set_state throws tandem::Error on text that is not such a state.
  std::string state() const;
  void set_state(const std::string& state);

 private:
  std::mt19937_64 engine_;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace tandem
