// The collectives of sharding, all_gather_into_tensor and reduce_scatter_tensor, on ProcessGroupGloo
// across real processes (dist/gloo_job.h), over shared memory and over Gloo's TCP pairs, with 2 and
// 3 ranks. Each is checked against the collective it refines: all_gather_into_tensor against
// allgather (the same bytes, rank r's at r*n), reduce_scatter_tensor against a rank-order fold of
// every rank's input (which the children can compute: inputs are functions of rank and index) and,
// with values exact under any order, against allreduce's own chunk. Sizes are uneven on purpose:
// 1, odd lengths, lengths that split unevenly into slots and parts, and messages of several slots.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/gloo_job.h"
#include "dist/group/process_group.h"

namespace tandem::dist {
namespace {

// Values that round under summation (so the order of the reduction shows in the bits).
float rounding_input(int rank, int64_t i) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * rank)) * (1.0f + 0.001f * rank);
}
// Exact under any order.
float exact_input(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 1001 - 500) * 0.5f; }

float fold(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return a + b;
    case ReduceOp::Max: return std::max(a, b);
    case ReduceOp::Min: return std::min(a, b);
  }
  return a;
}

Tensor input_of(int rank, int64_t n, float (*f)(int, int64_t)) {
  Tensor t = Tensor::empty({n}, kFloat32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = f(rank, i);
  return t;
}

// reduce_scatter_tensor of `per_rank` elements a rank against the rank-order fold, bit for bit. The
// input and output are fresh tensors unless given (the input is then filled here, the output may be
// a part of it).
void check_reduce_scatter(ProcessGroupGloo& pg, int64_t per_rank, ReduceOp op, float (*f)(int, int64_t),
                          Tensor in = Tensor(), Tensor out = Tensor()) {
  const int64_t total = per_rank * pg.size();
  if (in.defined())
    in.copy_(input_of(pg.rank(), total, f));
  else
    in = input_of(pg.rank(), total, f);
  if (!out.defined()) out = Tensor::full({per_rank}, -7.0, kFloat32);
  auto work = pg.reduce_scatter_tensor(out, in, op);
  work->wait(pg.timeout());
  CHILD_CHECK(work->is_completed(), work->description());
  // Every rank's input, materialised (so that the fold adds stored floats, as the group does).
  std::vector<Tensor> inputs;
  for (int q = 0; q < pg.size(); ++q) inputs.push_back(input_of(q, total, f));
  for (int64_t i = 0; i < per_rank; ++i) {
    const int64_t at = pg.rank() * per_rank + i;
    float expected = inputs[0].data<float>()[at];
    for (int q = 1; q < pg.size(); ++q) expected = fold(op, expected, inputs[q].data<float>()[at]);
    if (op == ReduceOp::Avg) expected /= static_cast<float>(pg.size());
    const float got = out.data<float>()[i];
    CHILD_CHECK(std::memcmp(&got, &expected, sizeof(float)) == 0, reduce_op_name(op), " of ", per_rank,
                " a rank, element ", i, ": got ", got, ", expected ", expected, " (rank-order fold)");
  }
}

class ShardingRanks : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int ranks() const { return std::get<0>(GetParam()); }
  JobOptions options() const {
    JobOptions o;
    if (!std::get<1>(GetParam())) o.env["TANDEM_SHM"] = "0";
    o.env["TANDEM_SHM_SLOT_KB"] = "64";  // several slots from 16 Ki floats a rank on
    return o;
  }
};

TEST_P(ShardingRanks, AllGatherIntoTensorHoldsWhatAllgatherGives) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store&) {
    const int w = pg.size();
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{16385}, (int64_t{1} << 20) + 3}) {
      Tensor in = input_of(pg.rank(), n, rounding_input);
      Tensor flat = Tensor::full({w, n}, -1.0, kFloat32);  // any shape with w*n elements
      std::vector<Tensor> parts;
      for (int q = 0; q < w; ++q) parts.push_back(Tensor::zeros({n}, kFloat32));
      pg.all_gather_into_tensor(flat, in)->wait(pg.timeout());
      pg.allgather(parts, in)->wait(pg.timeout());
      for (int q = 0; q < w; ++q)
        CHILD_CHECK(std::memcmp(flat.data<float>() + q * n, parts[q].data<float>(), n * sizeof(float)) == 0,
                    "n ", n, ": rank ", q, "'s part differs from allgather's");
      CHILD_CHECK(flat.data<float>()[(w - 1) * n] == rounding_input(w - 1, 0), "n ", n);
    }
    // Other dtypes: bytes are bytes.
    Tensor ids = Tensor::full({5}, static_cast<double>(pg.rank() * 1000 + 3), kInt64);
    Tensor all_ids = Tensor::zeros({5 * w}, kInt64);
    pg.all_gather_into_tensor(all_ids, ids)->wait(pg.timeout());
    for (int q = 0; q < w; ++q)
      CHILD_CHECK(all_ids.data<int64_t>()[q * 5 + 4] == q * 1000 + 3, "int64 part ", q);
    Tensor none = Tensor::empty({0}, kFloat32), none_out = Tensor::empty({0}, kFloat32);
    pg.all_gather_into_tensor(none_out, none)->wait(pg.timeout());
  }, options()));
}

TEST_P(ShardingRanks, ReduceScatterIsTheRankOrderFoldOfEachChunk) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store&) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{16385}, (int64_t{1} << 19) + 3})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
        check_reduce_scatter(pg, n, op, rounding_input);
  }, options()));
}

// An input in the group's comm_buffer (as FSDP's or DDP's flat buffers can be): on shared memory each
// rank folds its part of the peers' inputs where they lie, in rank order, so the bits are the slot
// path's. Also with the output being this rank's own part of the input (from rank 2 on, an operand
// the fold reads late), with small messages (through the slots) and with ranks at different
// offsets (through the slots: the ranks agree on the path).
TEST_P(ShardingRanks, ReduceScatterInPlaceOnACommBufferIsTheRankOrderFold) {
  const bool shm = std::get<1>(GetParam());
  expect_all_ok(run_job(ranks(), [shm](ProcessGroupGloo& pg, Store&) {
    const int w = pg.size();
    const int64_t big = (int64_t{1} << 19) + 3;
    Tensor buf = pg.comm_buffer(big * w + 64, kFloat32, Device::cpu());
    const auto before = pg.allreduce_paths();
    int64_t in_place = 0, slots = 0;
    for (int64_t n : {int64_t{16385}, big, int64_t{5}}) {
      Tensor in = buf.slice(0, 0, n * w);
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) check_reduce_scatter(pg, n, op, rounding_input, in);
      check_reduce_scatter(pg, n, ReduceOp::Sum, rounding_input, in, in.slice(0, pg.rank() * n, (pg.rank() + 1) * n));
      (n * w * 4 > 64 * 1024 ? in_place : slots) += 3;
    }
    const int64_t n = 20000, shift = pg.rank() == 0 ? 0 : 16;
    check_reduce_scatter(pg, n, ReduceOp::Sum, rounding_input, buf.slice(0, shift, shift + n * w));
    ++slots;
    const auto after = pg.allreduce_paths();
    if (shm)
      CHILD_CHECK(after.reduce_scatter_in_place - before.reduce_scatter_in_place == in_place &&
                      after.reduce_scatter_through_slots - before.reduce_scatter_through_slots == slots,
                  "in place ", after.reduce_scatter_in_place - before.reduce_scatter_in_place, " (expected ",
                  in_place, "), through the slots ",
                  after.reduce_scatter_through_slots - before.reduce_scatter_through_slots, " (expected ", slots, ")");
  }, options()));
}

// With values exact under any order, each rank's chunk of allreduce is its reduce-scatter.
TEST_P(ShardingRanks, ReduceScatterEqualsItsChunkOfAllreduce) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store&) {
    const int64_t n = 40001, total = n * pg.size();
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      Tensor all = input_of(pg.rank(), total, exact_input);
      Tensor in = all.clone();
      Tensor out = Tensor::zeros({n}, kFloat32);
      pg.allreduce(all, op)->wait(pg.timeout());
      pg.reduce_scatter_tensor(out, in, op)->wait(pg.timeout());
      CHILD_CHECK(std::memcmp(out.data<float>(), all.data<float>() + pg.rank() * n, n * sizeof(float)) == 0,
                  reduce_op_name(op), ": reduce_scatter_tensor differs from allreduce's chunk ", pg.rank());
    }
    // bfloat16 and int64 reduce too (bf16 in float32, rounded per step).
    Tensor b = Tensor::full({3 * pg.size()}, 1.5, kBFloat16), bout = Tensor::zeros({3}, kBFloat16);
    pg.reduce_scatter_tensor(bout, b)->wait(pg.timeout());
    CHILD_CHECK(bout.to(kFloat32).data<float>()[2] == 1.5f * pg.size(), "bf16");
    Tensor k = Tensor::full({2 * pg.size()}, static_cast<double>(pg.rank() + 1), kInt64);
    Tensor kout = Tensor::zeros({2}, kInt64);
    pg.reduce_scatter_tensor(kout, k, ReduceOp::Max)->wait(pg.timeout());
    CHILD_CHECK(kout.data<int64_t>()[1] == pg.size(), "int64 max");
  }, options()));
}

TEST_P(ShardingRanks, BadArgumentsFailOnTheCallersThreadNamingWhatWasExpected) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store&) {
    const int w = pg.size();
    Tensor in = Tensor::zeros({4 * w}, kFloat32), out = Tensor::zeros({5}, kFloat32);
    std::string msg = error_of([&] { pg.reduce_scatter_tensor(out, in); });
    CHILD_CHECK(contains(msg, "reduce_scatter_tensor: input has " + std::to_string(4 * w) + " elements, expected " +
                                  std::to_string(w) + " (ranks) x 5 (the output's) = " + std::to_string(5 * w)),
                msg);
    Tensor g_in = Tensor::zeros({3}, kFloat32), g_out = Tensor::zeros({3 * w + 1}, kFloat32);
    msg = error_of([&] { pg.all_gather_into_tensor(g_out, g_in); });
    CHILD_CHECK(contains(msg, "all_gather_into_tensor: output has " + std::to_string(3 * w + 1) + " elements"), msg);
    Tensor d_out = Tensor::zeros({3 * w}, kFloat64);
    msg = error_of([&] { pg.all_gather_into_tensor(d_out, g_in); });
    CHILD_CHECK(contains(msg, "expected one dtype and device"), msg);
    Tensor ints = Tensor::zeros({2 * w}, kInt64), int_out = Tensor::zeros({2}, kInt64);
    msg = error_of([&] { pg.reduce_scatter_tensor(int_out, ints, ReduceOp::Avg); });
    CHILD_CHECK(contains(msg, "ReduceOp::Avg needs a floating-point tensor, got int64"), msg);
    msg = error_of([&] { pg.allreduce(ints, ReduceOp::Avg); });
    CHILD_CHECK(contains(msg, "ReduceOp::Avg needs a floating-point tensor, got int64"), msg);
    Tensor strided = Tensor::zeros({2 * w, 2}, kFloat32).transpose(0, 1);
    Tensor s_out = Tensor::zeros({4}, kFloat32);
    msg = error_of([&] { pg.reduce_scatter_tensor(s_out, strided); });
    CHILD_CHECK(contains(msg, "is not contiguous"), msg);
    // The group still works after refused calls (nothing was issued).
    check_reduce_scatter(pg, 3, ReduceOp::Sum, exact_input);
  }, options()));
}

// On the shared-memory path the ranks publish each call, so a rank in a reduce-scatter while
// another is in an all-reduce fails naming both instead of mixing their data.
TEST(ShardingShm, MismatchedCollectivesFailNamingTheRanks) {
  expect_all_ok(run_job(2, [](ProcessGroupGloo& pg, Store&) {
    Tensor t = Tensor::ones({8}, kFloat32), out = Tensor::zeros({4}, kFloat32);
    const std::string msg = error_of([&] {
      if (pg.rank() == 0)
        pg.reduce_scatter_tensor(out, t)->wait(pg.timeout());
      else
        pg.allreduce(t)->wait(pg.timeout());
    });
    CHILD_CHECK(contains(msg, "the ranks disagree on the collective") && contains(msg, "a reduce-scatter") &&
                    contains(msg, "an all-reduce"),
                msg);
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardingRanks, ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks" +
                                  (std::get<1>(info.param) ? "Shm" : "Tcp");
                         });

}  // namespace
}  // namespace tandem::dist
