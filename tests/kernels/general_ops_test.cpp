// The CPU kernels of the general op set (kernels/pointwise.h, reduce.h, index.h) against plain
// double loops: broadcasting over strided (transposed) operands, reductions over every subset of
// dimensions, softmax on an inner dimension, bmm, indexing; then their errors: bad indices, shapes
// that do not broadcast, operands on two devices, and (built without CUDA) the error for a tensor
// on a CUDA device (a host buffer labelled as CUDA memory: the checks must fire before any memory
// is touched). The CUDA kernels are checked against these CPU kernels in tests/gpu. The CUDA
// dropout's counter-based generator (kernels/pointwise_math.h, host-device) is checked here on the
// host: eager seeds are the Generator's draws, and a graph replay's seed changes with the replay
// counter, each replay's mask an independent Bernoulli draw.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/storage.h"
#include "core/view.h"
#include "kernels/avg_pool.h"
#include "kernels/index.h"
#include "kernels/layer_norm.h"
#include "kernels/pointwise.h"
#include "kernels/pointwise_math.h"
#include "kernels/reduce.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem;
using tandem::test::all_close;
using tandem::test::random_tensor;
using tandem::test::tol_for;
using tandem::test::values;

namespace {

// Message of the tandem::Error fn throws ("" if none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GeneralKernels, BroadcastBinaryOverTransposedOperands) {
  Generator gen(1);
  for (DType dt : {kFloat32, kFloat64}) {
    const Tensor a = random_tensor({4, 3}, dt, gen).transpose(0, 1);  // [3, 4], strides (1, 3)
    const Tensor b = random_tensor({2, 1, 4}, dt, gen);
    const Tensor y = kernels::binary(kernels::BinaryOp::Sub, a, b);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
    const auto av = values(a.contiguous()), bv = values(b);
    std::vector<double> ref;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) ref.push_back(av[j * 4 + k] - bv[i * 4 + k]);
    EXPECT_TRUE(all_close(y, ref, tol_for(dt)));
  }
}

TEST(GeneralKernels, SumDimsOverEverySubsetMatchesLoops) {
  Generator gen(2);
  const Tensor x = random_tensor({2, 3, 4}, kFloat32, gen).transpose(0, 2);  // [4, 3, 2], non-contiguous
  const auto xv = values(x.contiguous());
  for (int mask = 0; mask < 8; ++mask) {
    std::vector<int64_t> dims;
    for (int d = 0; d < 3; ++d)
      if (mask & (1 << d)) dims.push_back(d);
    if (dims.empty()) continue;
    const Tensor y = kernels::sum_dims(x, dims, /*keepdim=*/true);
    const Shape ys = y.shape();
    std::vector<double> ref(shape_numel(ys), 0.0);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 2; ++k) {
          const int oi = (mask & 1) ? 0 : i, oj = (mask & 2) ? 0 : j, ok = (mask & 4) ? 0 : k;
          ref[(oi * ys[1] + oj) * ys[2] + ok] += xv[(i * 3 + j) * 2 + k];
        }
    EXPECT_TRUE(all_close(y, ref, tol_for(kFloat32))) << "mask " << mask;
  }
  EXPECT_EQ(kernels::sum_to(random_tensor({5, 3, 4}, kFloat32, gen), {3, 1}).shape(), (Shape{3, 1}));
}

TEST(GeneralKernels, MaxTakesTheFirstMaximumAndNaNWins) {
  const Tensor x = Tensor::from_vector<float>({1, 3, 3, 0, std::numeric_limits<float>::quiet_NaN(), 5}, {2, 3});
  const auto r = kernels::max_dim(x, 1, false);
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(r.values.to_vector<float>()[0], 3.0f);
  EXPECT_TRUE(std::isnan(r.values.to_vector<float>()[1]));
  EXPECT_TRUE(std::isnan(kernels::amax(x, {}, false).item<float>()));
}

// Over leading dimensions of a contiguous tensor too (the path sum_dims takes without a copy).
TEST(GeneralKernels, AmaxOverEveryDimensionSubsetMatchesLoops) {
  Generator gen(5);
  const Tensor x = random_tensor({4, 3, 2}, kFloat32, gen);
  const auto xv = values(x);
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int64_t> dims;
    for (int d = 0; d < 3; ++d)
      if (mask & (1 << d)) dims.push_back(d);
    const Tensor y = kernels::amax(x, dims, /*keepdim=*/true);
    const Shape ys = y.shape();
    std::vector<double> ref(shape_numel(ys), -1e30);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 2; ++k) {
          const int oi = (mask & 1) ? 0 : i, oj = (mask & 2) ? 0 : j, ok = (mask & 4) ? 0 : k;
          double& r = ref[(oi * ys[1] + oj) * ys[2] + ok];
          r = std::max(r, xv[(i * 3 + j) * 2 + k]);
        }
    EXPECT_EQ(values(y), ref) << "mask " << mask;
  }
}

TEST(GeneralKernels, SoftmaxOnAnInnerDimension) {
  Generator gen(3);
  const Tensor x = random_tensor({2, 3, 4}, kFloat64, gen, -5, 5);
  const Tensor y = kernels::softmax_forward(x, 1, false);
  const Tensor ly = kernels::softmax_forward(x, 1, true);
  const auto xv = values(x);
  std::vector<double> ref(24), lref(24);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 4; ++k) {
      double s = 0;
      for (int j = 0; j < 3; ++j) s += std::exp(xv[(i * 3 + j) * 4 + k]);
      for (int j = 0; j < 3; ++j) {
        ref[(i * 3 + j) * 4 + k] = std::exp(xv[(i * 3 + j) * 4 + k]) / s;
        lref[(i * 3 + j) * 4 + k] = xv[(i * 3 + j) * 4 + k] - std::log(s);
      }
    }
  EXPECT_TRUE(all_close(y, ref, tol_for(kFloat64)));
  EXPECT_TRUE(all_close(ly, lref, tol_for(kFloat64)));
}

TEST(GeneralKernels, SoftmaxOnTheLastDimension) {
  Generator gen(13);
  for (DType dt : {kFloat32, kFloat64}) {
    const Tensor x = random_tensor({3, 2, 5}, dt, gen, -8, 8);
    const auto xv = values(x);
    std::vector<double> ref(30), lref(30);
    for (int r = 0; r < 6; ++r) {
      double s = 0;
      for (int c = 0; c < 5; ++c) s += std::exp(xv[r * 5 + c]);
      for (int c = 0; c < 5; ++c) {
        ref[r * 5 + c] = std::exp(xv[r * 5 + c]) / s;
        lref[r * 5 + c] = xv[r * 5 + c] - std::log(s);
      }
    }
    EXPECT_TRUE(all_close(kernels::softmax_forward(x, -1, false), ref, tol_for(dt)));
    EXPECT_TRUE(all_close(kernels::softmax_forward(x, 2, true), lref, tol_for(dt)));
  }
}

TEST(GeneralKernels, BmmMatchesLoops) {
  Generator gen(4);
  const Tensor a = random_tensor({3, 2, 5}, kFloat32, gen), b = random_tensor({3, 5, 4}, kFloat32, gen);
  const auto av = values(a), bv = values(b);
  std::vector<double> ref(3 * 2 * 4, 0.0);
  for (int n = 0; n < 3; ++n)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 5; ++k) ref[(n * 2 + i) * 4 + j] += av[(n * 2 + i) * 5 + k] * bv[(n * 5 + k) * 4 + j];
  EXPECT_TRUE(all_close(kernels::bmm(a, b), ref, tol_for(kFloat32)));
}

TEST(GeneralKernels, IndexAddSkipsThePaddingIndexAndAccumulatesRepeats) {
  const Tensor src = Tensor::ones({4, 2}, kFloat32);
  const Tensor idx = Tensor::from_vector<int64_t>({1, 1, 0, 2}, {4});
  EXPECT_EQ(kernels::index_add({3, 2}, 0, idx, src, /*skip=*/2).to_vector<float>(),
            (std::vector<float>{1, 1, 2, 2, 0, 0}));
  EXPECT_EQ(kernels::scatter_add({2, 3}, 1, Tensor::from_vector<int64_t>({2, 2, 0, 1}, {2, 2}),
                                 Tensor::ones({2, 2}, kFloat32))
                .to_vector<float>(),
            (std::vector<float>{0, 0, 2, 1, 1, 0}));
}

TEST(GeneralKernels, DropoutMaskStatisticsAndSeeding) {
  Generator g1(7), g2(7), g3(8);
  const double p = 0.3;
  const Tensor m1 = kernels::dropout_mask({100000}, p, kFloat32, Device::cpu(), g1);
  const Tensor m2 = kernels::dropout_mask({100000}, p, kFloat32, Device::cpu(), g2);
  const Tensor m3 = kernels::dropout_mask({100000}, p, kFloat32, Device::cpu(), g3);
  EXPECT_EQ(m1.to_vector<float>(), m2.to_vector<float>());  // same seed, same mask
  EXPECT_NE(m1.to_vector<float>(), m3.to_vector<float>());
  int64_t zeros = 0;
  for (float v : m1.to_vector<float>()) {
    ASSERT_TRUE(v == 0.0f || v == static_cast<float>(1.0 / (1.0 - p))) << v;
    zeros += v == 0.0f;
  }
  // Binomial(1e5, 0.3): sd = 145; 5 sd either side (this seed's count is fixed, so this never flakes).
  EXPECT_NEAR(static_cast<double>(zeros), 30000.0, 725.0);
}

TEST(GeneralKernels, CudaDropoutSeedTakesANewMaskForEachGraphReplay) {
  namespace math = kernels::math;
  const uint64_t draw = Generator(9).next_u64();
  EXPECT_EQ(math::dropout_seed(draw, nullptr), draw) << "an eager mask's seed is the Generator's draw";
  const double p = 0.3;
  const int64_t n = 100000;
  // The mask the CUDA kernel computes for replay r of a graph captured with `draw`.
  auto mask = [&](uint64_t r) {
    const uint64_t seed = math::dropout_seed(draw, &r);
    std::vector<bool> dropped(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) dropped[i] = math::dropout_value(math::dropout_uniform(seed, i), p, 1.0) == 0.0;
    return dropped;
  };
  std::vector<std::vector<bool>> replays;
  for (uint64_t r = 0; r < 3; ++r) {
    EXPECT_NE(math::dropout_seed(draw, &r), draw);
    replays.push_back(mask(r));
    int64_t zeros = 0;
    for (bool d : replays.back()) zeros += d;
    EXPECT_NEAR(static_cast<double>(zeros), 30000.0, 725.0) << "replay " << r;  // 5 sd of Binomial(1e5, 0.3)
  }
  EXPECT_NE(replays[0], replays[1]);
  EXPECT_NE(replays[1], replays[2]);
  int64_t both = 0;  // independent replays: dropped in both with probability p^2 (Binomial(1e5, 0.09): sd 90)
  for (int64_t i = 0; i < n; ++i) both += replays[0][i] && replays[1][i];
  EXPECT_NEAR(static_cast<double>(both), 9000.0, 650.0);
  uint64_t zero = 0;
  EXPECT_EQ(math::dropout_seed(draw, &zero), math::dropout_seed(draw, &zero)) << "replay r's seed is fixed by r";
}

TEST(GeneralKernels, BadInputsGetOneClearError) {
  const Tensor x = Tensor::zeros({2, 3});
  EXPECT_NE(error_of([&] { kernels::binary(kernels::BinaryOp::Add, x, Tensor::zeros({4})); })
                .find("add: shapes [2, 3] and [4] do not broadcast"),
            std::string::npos);
  EXPECT_NE(error_of([&] { kernels::index_select(x, 1, Tensor::from_vector<int64_t>({0, 3}, {2})); })
                .find("index_select: index 3 at position 1 is out of range for a dimension of size 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { kernels::gather(x, 0, Tensor::from_vector<int64_t>({-1}, {1, 1})); }).find("index -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { kernels::sum_dims(x, {2}, false); }).find("sum: dimension 2 out of range for a 2-D tensor"),
            std::string::npos);
  EXPECT_NE(error_of([&] { kernels::sum_dims(x, {1, -1}, false); }).find("appears more than once"), std::string::npos);
  EXPECT_NE(error_of([&] { kernels::where(x, x, x); }).find("where: the condition must be a uint8 mask"),
            std::string::npos);
  EXPECT_NE(error_of([&] { kernels::cat({x, Tensor::zeros({3, 3})}, 1); }).find("differs from tensor 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { kernels::unary(kernels::UnaryOp::Exp, Tensor::zeros({2}, kInt64)); })
                .find("expected float32 or float64"),
            std::string::npos);
}

// Host memory labelled as a CUDA device's: only the metadata is ever read, so these calls must
// fail on their checks before any kernel runs.
static Tensor fake_cuda_tensor(std::vector<float>& host, const Shape& shape) {
  auto storage = std::make_shared<Storage>(host.data(), host.size() * sizeof(float), Device::cuda(0), [] {});
  return Tensor::from_storage(storage, shape, kFloat32);
}

TEST(GeneralKernels, OperandsOnTwoDevicesAreRejectedNamingTheOp) {
  std::vector<float> host(6, 0.0f);
  const Tensor g = fake_cuda_tensor(host, {2, 3});
  const Tensor c = Tensor::zeros({2, 3});
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"maximum", [&] { kernels::binary(kernels::BinaryOp::Maximum, g, c); }},
      {"mul", [&] { kernels::binary_backward(kernels::BinaryOp::Mul, 0, c, g, g, Tensor()); }},
      {"gt", [&] { kernels::compare(kernels::CompareOp::Gt, c, g); }},
      {"where", [&] { kernels::where(Tensor::zeros({2, 3}, kUInt8), g, g); }},
      {"exp", [&] { kernels::unary_backward(kernels::UnaryOp::Exp, c, g, g); }},
      {"softmax", [&] { kernels::softmax_backward(c, g, 0, false); }},
      {"index_select", [&] { kernels::index_select(g, 0, Tensor::from_vector<int64_t>({0}, {1})); }},
      {"gather", [&] { kernels::gather(g, 0, Tensor::zeros({1, 3}, kInt64)); }},
      {"index_add", [&] { kernels::index_add({2, 3}, 0, Tensor::from_vector<int64_t>({0}, {1}), views::narrow(g, 0, 0, 1)); }},
      {"scatter_add", [&] { kernels::scatter_add({2, 3}, 0, Tensor::zeros({2, 3}, kInt64), g); }},
      {"cat", [&] { kernels::cat({c, g}, 0); }},
      {"bmm", [&] { kernels::bmm(views::unsqueeze(g, 0), views::unsqueeze(c.transpose(0, 1), 0)); }},
      {"layer_norm", [&] { kernels::layer_norm_forward(g, 3, Tensor::ones({3}), Tensor(), 1e-5); }},
  };
  for (const auto& [op, call] : calls) {
    const std::string msg = error_of(call);
    EXPECT_EQ(msg.rfind(op + ": expected all tensors on ", 0), 0u) << op << ": " << msg;
  }
}

#ifndef TANDEM_WITH_CUDA
// Without the CUDA backend a CUDA tensor can only come from outside (as here); every entry point
// says so, naming its kernel, instead of reading the memory.
TEST(GeneralKernels, CudaTensorsWithoutTheCudaBackendThrow) {
  std::vector<float> host(6, 0.0f);
  const Tensor g = fake_cuda_tensor(host, {2, 3});
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"binary", [&] { kernels::binary(kernels::BinaryOp::Maximum, g, g); }},
      {"compare", [&] { kernels::compare(kernels::CompareOp::Gt, g, g); }},
      {"unary", [&] { kernels::unary(kernels::UnaryOp::Exp, g); }},
      {"sum_dims", [&] { kernels::sum_dims(g, {0}, false); }},
      {"max_dim", [&] { kernels::max_dim(g, 0, false); }},
      {"amax", [&] { kernels::amax(g, {0}, false); }},
      {"softmax_forward", [&] { kernels::softmax_forward(g, 0, false); }},
      {"bmm", [&] { kernels::bmm(views::unsqueeze(g, 0), views::unsqueeze(g.transpose(0, 1), 0)); }},
      {"where", [&] { kernels::where(Tensor::from_storage(g.storage(), {2, 3}, kUInt8), g, g); }},
      {"layer_norm_forward", [&] { kernels::layer_norm_forward(g, 3, Tensor(), Tensor(), 1e-5); }},
      {"avg_pool_forward", [&] { kernels::avg_pool2d_forward(views::unsqueeze(views::unsqueeze(g, 0), 0), {}); }},
      {"avg_pool_forward",
       [&] { kernels::adaptive_avg_pool2d_forward(views::unsqueeze(views::unsqueeze(g, 0), 0), 1, 1); }},
      {"dropout", [&] {
         Generator gen(0);
         kernels::dropout_mask({2, 3}, 0.5, kFloat32, Device::cuda(0), gen);
       }},
  };
  for (const auto& [op, call] : calls) {
    const std::string msg = error_of(call);
    EXPECT_EQ(msg.rfind(op + ": tensor is on a CUDA device but Tandem was built without CUDA", 0), 0u) << msg;
  }
}
#endif
