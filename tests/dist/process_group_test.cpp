// ProcessGroupGloo across real processes: each test forks one child per rank (common/process.h's
// fork_children); the children meet through a FileStore in a fresh temporary directory and talk
// over Gloo's TCP transport on loopback (MASTER_ADDR=127.0.0.1). A child reports through a file
// (the failure text, or nothing) and its exit status; the parent kills every child still running
// after the test's deadline, so no test can hang. The parent never creates a process group
// itself (no threads before fork).
// Values are chosen so every reduction is exact in its dtype, whatever the summation order.
#include "dist/group/process_group.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "common/test_util.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "dist/store/file_store.h"
#include "dist/group/process_group_factory.h"
#include "dist/group/process_group_gloo.h"
#include "dist/gloo_job.h"

namespace tandem::dist {
namespace {

using namespace std::chrono_literals;

// ---- input values: exact under any summation order ----

float f32_input(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 1001 - 500) * 0.5f; }
double f64_input(int rank, int64_t i) {
  return static_cast<double>((i * 11 + rank * 17) % 2003 - 1001) * 0.25 + 1099511627776.0;  // + 2^40
}

template <typename T>
T fold(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::Sum: return a + b;
    case ReduceOp::Max: return std::max(a, b);
    case ReduceOp::Min: return std::min(a, b);
    case ReduceOp::Avg: break;  // not used here (sharding_collectives_test.cpp covers it)
  }
  return a;
}

const char* name_of(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Max ? "max" : "min"; }

template <typename T>
void check_allreduce(ProcessGroupGloo& pg, int64_t n, ReduceOp op, T (*input)(int, int64_t)) {
  Tensor t = Tensor::empty({n}, dtype_of<T>);
  T* p = t.data<T>();
  for (int64_t i = 0; i < n; ++i) p[i] = input(pg.rank(), i);
  auto work = pg.allreduce(t, op);
  work->wait(pg.timeout());
  CHILD_CHECK(work->is_completed(), work->description());
  for (int64_t i = 0; i < n; ++i) {
    T expected = input(0, i);
    for (int r = 1; r < pg.size(); ++r) expected = fold(op, expected, input(r, i));
    CHILD_CHECK(p[i] == expected, dtype_name(dtype_of<T>), " ", name_of(op), " of ", n, " elements, index ",
                i, ": got ", p[i], ", expected ", expected);
  }
}

// (ranks, shared memory): every collective test runs over the shared-memory all-reduce (the
// default when all ranks share a host) and over Gloo's TCP pairs (TANDEM_SHM=0, the path ranks on
// different hosts take).
class GlooRanks : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int ranks() const { return std::get<0>(GetParam()); }
  bool shm() const { return std::get<1>(GetParam()); }
  JobOptions options() const {
    JobOptions o;
    if (!shm()) o.env["TANDEM_SHM"] = "0";
    return o;
  }
};

TEST_P(GlooRanks, AllreduceTransportIsSharedMemoryUnlessTurnedOff) {
  expect_all_ok(run_job(
      ranks(),
      [shm = shm()](ProcessGroupGloo& pg, Store&) {
        const std::string transport = pg.allreduce_transport();
        if (shm)
          CHILD_CHECK(transport == "shared memory (4096 KiB slots)", transport);
        else
          CHILD_CHECK(contains(transport, "tcp (TANDEM_SHM=0 on rank 0)"), transport);
      },
      options()));
}

// Messages spanning several slots (64 KiB slots: 1M floats is 64 chunks), odd lengths whose parts
// are uneven, and the small-chunk path, with every rank's result bit-identical.
TEST_P(GlooRanks, AllreduceAcrossManyChunksIsExact) {
  if (!shm()) GTEST_SKIP() << "the slot size only applies to the shared-memory path";
  JobOptions opt = options();
  opt.env["TANDEM_SHM_SLOT_KB"] = "64";
  expect_all_ok(run_job(
      ranks(),
      [](ProcessGroupGloo& pg, Store&) {
        CHILD_CHECK(pg.allreduce_transport() == "shared memory (64 KiB slots)", pg.allreduce_transport());
        for (int64_t n : {int64_t{16383}, int64_t{16384}, int64_t{16385}, int64_t{1} << 20, (int64_t{1} << 20) + 5})
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
            check_allreduce<float>(pg, n, op, f32_input);
            check_allreduce<double>(pg, n, op, f64_input);
          }
      },
      opt));
}

TEST_P(GlooRanks, AllreduceSumMaxMinIsExactForFloat32AndFloat64) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store&) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1} << 20, (int64_t{1} << 20) + 3})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
        check_allreduce<float>(pg, n, op, f32_input);
        check_allreduce<double>(pg, n, op, f64_input);
      }
  }, options()));
}

// DDP's buckets are slices of one comm_buffer. On one host it is shared memory and an allreduce
// over a range every rank passes at the same offset runs in place (reading the peers' copies);
// ranges at different offsets, and small ones, take the slots; over TCP it is ordinary memory.
TEST_P(GlooRanks, AllreduceOnCommBufferSlicesIsExactInPlaceOrNot) {
  expect_all_ok(run_job(
      ranks(),
      [shm = shm()](ProcessGroupGloo& pg, Store&) {
        const int64_t total = (int64_t{1} << 20) + 40;
        Tensor buf = pg.comm_buffer(total, kFloat32, Device::cpu());
        CHILD_CHECK(buf.shape() == Shape{total} && buf.is_contiguous(), buf.str());
        for (float v : {buf.data<float>()[0], buf.data<float>()[total / 2], buf.data<float>()[total - 1]})
          CHILD_CHECK(v == 0.0f, "comm_buffer is not zero-filled: ", v);
        const int r = pg.rank();
        // [begin, end) of buf, filled with this rank's inputs, reduced, checked against all ranks'.
        auto check = [&](int64_t begin, int64_t end, ReduceOp op, int shift) {
          Tensor t = buf.slice(0, begin, end);
          float* p = t.data<float>();
          for (int64_t i = 0; i < end - begin; ++i) p[i] = f32_input(r + shift, i);
          pg.allreduce(t, op)->wait(pg.timeout());
          for (int64_t i = 0; i < end - begin; ++i) {
            float expected = f32_input(shift, i);
            for (int q = 1; q < pg.size(); ++q) expected = fold(op, expected, f32_input(q + shift, i));
            CHILD_CHECK(p[i] == expected, "[", begin, ", ", end, ") ", name_of(op), " index ", i, ": ", p[i],
                        " expected ", expected);
          }
        };
        const auto before = pg.allreduce_paths();
        check(0, total, ReduceOp::Sum, 0);
        check(0, 300000, ReduceOp::Max, 1);
        check(300000, total, ReduceOp::Sum, 2);  // an offset that is no multiple of a cache line
        check(300007, 300107, ReduceOp::Min, 0);  // small: through the slots
        const auto in_place = pg.allreduce_paths();
        // Different offsets on different ranks: the same sizes, so still a valid collective.
        check(16 * r, 16 * r + 200000, ReduceOp::Sum, 0);
        const auto after = pg.allreduce_paths();
        if (shm) {
          CHILD_CHECK(in_place.in_place - before.in_place == 3 && in_place.through_slots - before.through_slots == 1,
                      "in place ", in_place.in_place - before.in_place, ", slots ",
                      in_place.through_slots - before.through_slots);
          CHILD_CHECK(after.in_place == in_place.in_place && after.through_slots == in_place.through_slots + 1,
                      "mismatched offsets went in place");
        } else {
          CHILD_CHECK(after.tcp - before.tcp == 5 && after.in_place == 0, "tcp ", after.tcp - before.tcp);
        }
      },
      options()));
}

// Float sums depend on their order. In shared memory both paths add the ranks' values in rank order,
// ((x0 + x1) + x2) ..., so a tensor reduces to the same bits in place (a comm_buffer slice) as
// through the slots (small and large), on every rank. The inputs mix magnitudes 2^20 apart, so any
// other order would round differently somewhere.
TEST_P(GlooRanks, AllreduceSumsInRankOrderInPlaceAndThroughTheSlots) {
  if (!shm()) GTEST_SKIP() << "Gloo's ring adds in its own order";
  expect_all_ok(run_job(
      ranks(),
      [](ProcessGroupGloo& pg, Store&) {
        auto input = [](int rank, int64_t i) {
          const float big = static_cast<float>((i * 7 + rank * 13) % 101 - 50) * 1048576.0f;
          const float small = static_cast<float>((i * 3 + rank * 5) % 17) * 0.3f;
          return rank % 2 ? small : big;
        };
        auto expected = [&](int64_t i) {
          float sum = input(0, i) + input(1, i);
          for (int q = 2; q < pg.size(); ++q) sum += input(q, i);
          return sum;
        };
        int64_t order_matters = 0;
        for (int64_t i = 0; i < 1000; ++i) {
          float reversed = input(pg.size() - 1, i);
          for (int q = pg.size() - 2; q >= 0; --q) reversed += input(q, i);
          order_matters += reversed != expected(i);
        }
        CHILD_CHECK(pg.size() < 3 || order_matters > 0, "the inputs do not tell the orders apart");
        const int64_t n = 300000;
        Tensor buf = pg.comm_buffer(n, kFloat32, Device::cpu());
        Tensor plain = Tensor::empty({n}, kFloat32), small = Tensor::empty({1000}, kFloat32);
        for (Tensor* t : {&buf, &plain, &small}) {
          float* p = t->data<float>();
          for (int64_t i = 0; i < t->numel(); ++i) p[i] = input(pg.rank(), i);
        }
        const auto before = pg.allreduce_paths();
        for (Tensor* t : {&buf, &plain, &small}) pg.allreduce(*t)->wait(pg.timeout());
        const auto after = pg.allreduce_paths();
        CHILD_CHECK(after.in_place - before.in_place == 1 && after.through_slots - before.through_slots == 2,
                    "in place ", after.in_place - before.in_place, ", slots ",
                    after.through_slots - before.through_slots);
        for (Tensor* t : {&buf, &plain, &small}) {
          const float* p = t->data<float>();
          for (int64_t i = 0; i < t->numel(); ++i)
            CHILD_CHECK(p[i] == expected(i), t->numel(), " elements, index ", i, ": ", std::to_string(p[i]),
                        " expected ", std::to_string(expected(i)));
        }
      },
      options()));
}

TEST_P(GlooRanks, AllreduceOfDifferentSizesFailsNamingThem) {
  if (!shm()) GTEST_SKIP() << "Gloo's TCP pairs do not compare sizes";
  expect_all_ok(run_job(
      ranks(),
      [](ProcessGroupGloo& pg, Store&) {
        Tensor t = Tensor::ones({100 + pg.rank()}, kFloat32);
        const std::string msg = error_of([&] { pg.allreduce(t)->wait(pg.timeout()); });
        CHILD_CHECK(contains(msg, "the ranks passed different tensors: rank ") &&
                        contains(msg, " has " + std::to_string(100 + pg.rank()) + " of 4"),
                    msg);
      },
      options()));
}

TEST_P(GlooRanks, AllreduceOtherDtypes) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store&) {
    const int r = pg.rank(), n = pg.size();
    const int64_t sum_ranks = int64_t{n} * (n - 1) / 2;
    Tensor i64 = Tensor::from_vector<int64_t>({int64_t{1} << 40, -3, r}, {3});
    pg.allreduce(i64, ReduceOp::Sum)->wait(pg.timeout());
    CHILD_CHECK(i64.to_vector<int64_t>() == (std::vector<int64_t>{n * (int64_t{1} << 40), -3 * n, sum_ranks}),
                "");
    Tensor i32 = Tensor::from_vector<int32_t>({r, -r, 5}, {3});
    pg.allreduce(i32, ReduceOp::Max)->wait(pg.timeout());
    CHILD_CHECK(i32.to_vector<int32_t>() == (std::vector<int32_t>{n - 1, 0, 5}), "");
    Tensor u8 = Tensor::from_vector<uint8_t>({static_cast<uint8_t>(10 + r), 200}, {2});
    pg.allreduce(u8, ReduceOp::Min)->wait(pg.timeout());
    CHILD_CHECK(u8.to_vector<uint8_t>() == (std::vector<uint8_t>{10, 200}), "");
    // Small integers are exact in float16 and bfloat16.
    for (DType dt : {kFloat16, kBFloat16}) {
      Tensor h = Tensor::from_vector<float>({1.0f + r, -2.0f * r, 0.5f}, {3}).to(dt);
      pg.allreduce(h, ReduceOp::Sum)->wait(pg.timeout());
      CHILD_CHECK(h.dtype() == dt, "");
      const std::vector<float> got = h.to(kFloat32).to_vector<float>();
      const std::vector<float> want = {static_cast<float>(n + sum_ranks), -2.0f * sum_ranks, 0.5f * n};
      CHILD_CHECK(got == want, dtype_name(dt), ": got ", got[0], ", ", got[1], ", ", got[2]);
    }
  }, options()));
}

TEST_P(GlooRanks, BroadcastFromRankOne) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store&) {
    const int r = pg.rank();
    Tensor t = Tensor::empty({4, 250}, kFloat32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(r * 1000 + i);
    auto work = pg.broadcast(t, 1);
    work->wait(pg.timeout());
    CHILD_CHECK(contains(work->description(), "broadcast"), work->description());
    for (int64_t i = 0; i < t.numel(); ++i)
      CHILD_CHECK(t.data<float>()[i] == static_cast<float>(1000 + i), "index ", i, ": ", t.data<float>()[i]);
    // Another dtype, from the last rank.
    Tensor ids = Tensor::from_vector<int64_t>({r, 7 * r, -r}, {3});
    pg.broadcast(ids, pg.size() - 1)->wait(pg.timeout());
    const int64_t last = pg.size() - 1;
    CHILD_CHECK(ids.to_vector<int64_t>() == (std::vector<int64_t>{last, 7 * last, -last}), "");
    // 9 MiB from rank 0: several 4 MiB slots on the shared-memory path.
    Tensor big = Tensor::empty({(int64_t{9} << 20) / 4 + 3}, kFloat32);
    for (int64_t i = 0; i < big.numel(); ++i) big.data<float>()[i] = static_cast<float>((i % 9973) + r);
    pg.broadcast(big, 0)->wait(pg.timeout());
    for (int64_t i = 0; i < big.numel(); i += 101)
      CHILD_CHECK(big.data<float>()[i] == static_cast<float>(i % 9973), "big index ", i, ": ", big.data<float>()[i]);
    CHILD_CHECK(big.data<float>()[big.numel() - 1] == static_cast<float>((big.numel() - 1) % 9973), "last");
  }, options()));
}

TEST_P(GlooRanks, MismatchedCollectivesFailNamingTheRanks) {
  if (!shm()) GTEST_SKIP() << "Gloo's TCP pairs do not compare the ranks' calls";
  expect_all_ok(run_job(
      ranks(),
      [](ProcessGroupGloo& pg, Store&) {
        Tensor t = Tensor::ones({64}, kFloat32);
        const std::string msg = error_of([&] {
          if (pg.rank() == 0) pg.allreduce(t)->wait(pg.timeout());
          else pg.broadcast(t, 0)->wait(pg.timeout());
        });
        CHILD_CHECK(contains(msg, "the ranks disagree on the collective: rank "), msg);
      },
      options()));
  expect_all_ok(run_job(
      ranks(),
      [](ProcessGroupGloo& pg, Store&) {
        Tensor t = Tensor::ones({64}, kFloat32);
        std::vector<Tensor> outs;
        for (int k = 0; k < pg.size(); ++k) outs.push_back(Tensor::zeros({64}, kFloat32));
        const std::string msg = error_of([&] {
          if (pg.rank() == 0) pg.allgather(outs, t)->wait(pg.timeout());
          else pg.broadcast(t, 0)->wait(pg.timeout());
        });
        CHILD_CHECK(contains(msg, "the ranks disagree on the collective: rank ") && contains(msg, "an all-gather"),
                    msg);
      },
      options()));
  expect_all_ok(run_job(
      ranks(),
      [](ProcessGroupGloo& pg, Store&) {
        Tensor t = Tensor::ones({64}, kFloat32);
        const std::string msg = error_of([&] { pg.broadcast(t, pg.rank() == 0 ? 0 : 1)->wait(pg.timeout()); });
        CHILD_CHECK(contains(msg, "the ranks disagree on the broadcast's root: rank "), msg);
      },
      options()));
}

TEST_P(GlooRanks, AllgatherPutsEachRanksInputInItsSlot) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store&) {
    const int r = pg.rank(), n = pg.size();
    Tensor in = Tensor::empty({2, 3}, kFloat64);
    for (int64_t i = 0; i < 6; ++i) in.data<double>()[i] = r * 100.0 + i + 0.5;
    std::vector<Tensor> outs;
    for (int k = 0; k < n; ++k) outs.push_back(Tensor::full({2, 3}, -1.0, kFloat64));
    auto work = pg.allgather(outs, in);
    work->wait(pg.timeout());
    for (int k = 0; k < n; ++k)
      for (int64_t i = 0; i < 6; ++i)
        CHILD_CHECK(outs[k].data<double>()[i] == k * 100.0 + i + 0.5, "slot ", k, " index ", i, ": ",
                    outs[k].data<double>()[i]);
    // A large float32 gather.
    const int64_t big = 300000;
    Tensor bin = Tensor::empty({big}, kFloat32);
    for (int64_t i = 0; i < big; ++i) bin.data<float>()[i] = static_cast<float>(i % 4096 + r * 10000);
    std::vector<Tensor> bouts;
    for (int k = 0; k < n; ++k) bouts.push_back(Tensor::zeros({big}, kFloat32));
    pg.allgather(bouts, bin)->wait(pg.timeout());
    for (int k = 0; k < n; ++k)
      for (int64_t i = 0; i < big; i += 997)
        CHILD_CHECK(bouts[k].data<float>()[i] == static_cast<float>(i % 4096 + k * 10000), "slot ", k,
                    " index ", i);
    // 9 MiB a rank: several 4 MiB slots on the shared-memory path.
    const int64_t huge = (int64_t{9} << 20) / 4 + 5;
    Tensor hin = Tensor::empty({huge}, kFloat32);
    for (int64_t i = 0; i < huge; ++i) hin.data<float>()[i] = static_cast<float>(i % 8191 + r * 10000);
    std::vector<Tensor> houts;
    for (int k = 0; k < n; ++k) houts.push_back(Tensor::zeros({huge}, kFloat32));
    pg.allgather(houts, hin)->wait(pg.timeout());
    for (int k = 0; k < n; ++k)
      for (int64_t i : {int64_t{0}, int64_t{1} << 20, (int64_t{1} << 21) + 7, huge - 1})
        CHILD_CHECK(houts[k].data<float>()[i] == static_cast<float>(i % 8191 + k * 10000), "huge slot ", k,
                    " index ", i, ": ", houts[k].data<float>()[i]);
  }, options()));
}

TEST_P(GlooRanks, BarrierWaitsForEveryRank) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store& store) {
    std::vector<std::string> keys;
    for (int k = 0; k < pg.size(); ++k) keys.push_back("arrived/" + std::to_string(k));
    // The last rank arrives late: if the barrier let anyone through early, its key would be missing.
    if (pg.rank() == pg.size() - 1) std::this_thread::sleep_for(300ms);
    store.set_string(keys[pg.rank()], "1");
    for (int round = 0; round < 3; ++round) {
      auto work = pg.barrier();
      work->wait(pg.timeout());
      CHILD_CHECK(work->is_completed() && work->description() == "barrier()", work->description());
      CHILD_CHECK(store.check(keys), "rank ", pg.rank(), " passed barrier round ", round,
                  " before every rank arrived");
    }
  }, options()));
}

TEST_P(GlooRanks, TwentyAsyncAllreducesCompleteInIssueOrder) {
  expect_all_ok(run_job(ranks(), [](ProcessGroupGloo& pg, Store&) {
    const int r = pg.rank(), n = pg.size();
    constexpr int kOps = 20;
    std::vector<Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < kOps; ++k) {
      Tensor t = Tensor::empty({1 + k * 5000}, kFloat32);
      for (int64_t i = 0; i < t.numel(); ++i)
        t.data<float>()[i] = static_cast<float>((r + 1) * (k + 1) + i % 3);
      tensors.push_back(t);
      works.push_back(pg.allreduce(tensors.back(), ReduceOp::Sum));
    }
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (int k = 0; k < kOps; ++k) {
      works[k]->wait(pg.timeout());
      // One worker runs them in issue order: everything issued before k is done too.
      for (int j = 0; j <= k; ++j)
        CHILD_CHECK(works[j]->is_completed(), "op ", j, " not complete after op ", k);
      const float* p = tensors[k].data<float>();
      for (int64_t i = 0; i < tensors[k].numel(); ++i)
        CHILD_CHECK(p[i] == ranks_sum * (k + 1) + n * (i % 3), "op ", k, " index ", i, ": ", p[i]);
    }
  }, options()));
}

TEST_P(GlooRanks, DestructorRunsQueuedCollectives) {
  // Rank 0 issues an allreduce and destroys its group at once; the others' allreduce can only
  // complete if that destructor still runs it.
  expect_all_ok(run_children(
      ranks(),
      [size = ranks()](int rank, const std::string& path) {
        auto store = std::make_shared<FileStore>(path, size, 30s);
        Tensor t = Tensor::full({1000}, rank + 1.0, kFloat64);
        std::shared_ptr<Work> work;
        {
          ProcessGroupGloo pg(store, rank, size, 30s);
          work = pg.allreduce(t);
          if (rank != 0) work->wait(pg.timeout());
        }
        CHILD_CHECK(work->is_completed(), "");
        work->wait(1ms);  // completed: returns at once, no error
        for (double v : t.to_vector<double>()) CHILD_CHECK(v == size * (size + 1) / 2.0, "got ", v);
      },
      options()));
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooRanks, ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
                           return std::to_string(std::get<0>(info.param)) + "Ranks" +
                                  (std::get<1>(info.param) ? "Shm" : "Tcp");
                         });

// ---- failures: every one ends with an error naming the operation, never a hang ----

TEST(GlooGroup, RankThatExitsEarlyMakesOthersFailNamingTheOp) {
  JobOptions opt;
  opt.timeout = 2s;
  opt.deadline = 60s;
  opt.env["TANDEM_SHM"] = "0";  // Gloo's TCP pairs (the shared-memory path: ShmGroup below)
  const auto results = run_job(
      3,
      [](ProcessGroupGloo& pg, Store& store) {
        pg.barrier()->wait(pg.timeout());  // everyone connected
        if (pg.rank() == 2) {
          store.set_string("rank2_leaving", "1");
          _exit(0);  // gone without a goodbye, as a crashed rank
        }
        store.wait({"rank2_leaving"}, 20s);
        // Large enough that this rank writes to the vanished peer's socket (EPIPE, not SIGPIPE).
        Tensor t = Tensor::ones({int64_t{1} << 20}, kFloat32);
        auto work = pg.allreduce(t);
        const std::string msg = error_of([&] { work->wait(30s); });
        CHILD_CHECK(contains(msg, "allreduce(float32[1048576], sum)") && contains(msg, "failed"), msg);
        CHILD_CHECK(contains(msg, "rank " + std::to_string(pg.rank()) + " of 3"), msg);
        CHILD_CHECK(work->is_completed(), "");
        // The group is broken now: later collectives fail at once, naming the first failure.
        const std::string later = error_of([&] { pg.barrier()->wait(30s); });
        CHILD_CHECK(contains(later, "barrier()") && contains(later, "earlier collective") &&
                        contains(later, "allreduce(float32[1048576], sum)"),
                    later);
      },
      opt);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].message;
}

TEST(GlooGroup, RankThatDiesMidCollectiveGivesErrorsNotSigpipe) {
  // Rank 2 dies while the others' 64 MiB allreduce is in flight: their sockets to it break during
  // their writes. Their collective must fail with an error, not kill them with SIGPIPE. Rank 2
  // never joins the collective, so it cannot complete however the ranks are scheduled (a rank
  // that joined and then exited could finish first on a loaded machine).
  JobOptions opt;
  opt.timeout = 5s;
  opt.deadline = 60s;
  opt.env["TANDEM_SHM"] = "0";  // Gloo's TCP pairs (the shared-memory path: ShmGroup below)
  const auto results = run_job(
      3,
      [](ProcessGroupGloo& pg, Store&) {
        pg.barrier()->wait(pg.timeout());
        if (pg.rank() == 2) {
          std::this_thread::sleep_for(20ms);
          _exit(0);
        }
        Tensor t = Tensor::ones({int64_t{1} << 24}, kFloat32);
        auto work = pg.allreduce(t);
        const std::string msg = error_of([&] { work->wait(30s); });
        CHILD_CHECK(contains(msg, "allreduce(float32[16777216], sum)") && contains(msg, "failed"), msg);
      },
      opt);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": " << results[r].message;
}

// Three ranks with a 2 s group timeout; rank 2 is alive and connected but never joins the
// allreduce that ranks 0 and 1 run through `in_collective` (TANDEM_SHM=0 when !shm).
void run_with_a_stuck_rank(bool shm, const std::function<void(ProcessGroupGloo&)>& in_collective) {
  JobOptions opt;
  opt.timeout = 2s;
  opt.deadline = 60s;
  if (!shm) opt.env["TANDEM_SHM"] = "0";
  expect_all_ok(run_children(
      3,
      [&](int rank, const std::string& path) {
        auto store = std::make_shared<FileStore>(path, 3, 20s);
        ProcessGroupGloo pg(store, rank, 3, 2s);
        pg.barrier()->wait(pg.timeout());
        if (rank == 2) {
          store->wait({"done/0", "done/1"}, 20s);
          return;
        }
        in_collective(pg);
        store->set_string("done/" + std::to_string(rank), "1");
      },
      opt));
}

TEST(GlooGroup, StuckRankMakesOthersTimeOutNamingTheOp) {
  run_with_a_stuck_rank(false, [](ProcessGroupGloo& pg) {
    Tensor t = Tensor::ones({64}, kFloat64);
    auto work = pg.allreduce(t, ReduceOp::Max);
    // A wait shorter than Gloo's timeout ends first and says so.
    const std::string early = error_of([&] { work->wait(50ms); });
    CHILD_CHECK(contains(early, "allreduce(float64[64], max)") && contains(early, "did not complete within 50 ms"),
                early);
    // Gloo's own timeout (the group's 2 s) then ends the collective with an error.
    const std::string late = error_of([&] { work->wait(30s); });
    CHILD_CHECK(contains(late, "allreduce(float64[64], max)") && contains(late, "failed"), late);
    CHILD_CHECK(contains(late, "imed out") || contains(late, "closed"), late);
  });
}

// ---- the shared-memory all-reduce: failures name the peer, nothing is left behind ----

TEST(ShmGroup, RankThatExitsFailsTheOthersAtOnceNamingIt) {
  JobOptions opt;
  opt.timeout = 30s;  // the exit, not this timeout, must end the collective
  opt.deadline = 60s;
  expect_all_ok(run_job(
      3,
      [](ProcessGroupGloo& pg, Store& store) {
        CHILD_CHECK(contains(pg.allreduce_transport(), "shared memory"), pg.allreduce_transport());
        pg.barrier()->wait(pg.timeout());
        if (pg.rank() == 2) {
          store.set_string("pid2", std::to_string(getpid()));
          _exit(0);
        }
        const std::string pid2 = store.get_string("pid2");
        Tensor t = Tensor::ones({int64_t{1} << 20}, kFloat32);
        const std::string msg = error_of([&] { pg.allreduce(t)->wait(60s); });
        CHILD_CHECK(contains(msg, "allreduce(float32[1048576], sum) failed") &&
                        contains(msg, "rank 2 (pid " + pid2 + ") exited during the shared-memory all-reduce"),
                    msg);
        CHILD_CHECK(!contains(msg, "imed out"), msg);
        const std::string later = error_of([&] { pg.allreduce(t)->wait(60s); });
        CHILD_CHECK(contains(later, "earlier collective"), later);
      },
      opt));
}

TEST(ShmGroup, StuckRankMakesOthersTimeOutNamingIt) {
  run_with_a_stuck_rank(true, [](ProcessGroupGloo& pg) {
    Tensor t = Tensor::ones({300000}, kFloat32);
    const std::string msg = error_of([&] { pg.allreduce(t)->wait(30s); });
    CHILD_CHECK(contains(msg, "allreduce(float32[300000], sum) failed") &&
                    contains(msg, "Timed out waiting 2000ms for rank 2 (pid ") &&
                    contains(msg, "peer rank 2 never reached this collective"),
                msg);
  });
}

TEST(ShmGroup, TurnedOffOnOneRankMeansTcpOnAllAndNoSegmentStaysInDevShm) {
  JobOptions opt;
  opt.deadline = 60s;
  expect_all_ok(run_children(
      2,
      [](int rank, const std::string& path) {
        auto store = std::make_shared<FileStore>(path, 2, 20s);
        if (rank == 1) setenv("TANDEM_SHM", "0", 1);
        {
          ProcessGroupGloo tcp(store, rank, 2, 20s);
          CHILD_CHECK(tcp.allreduce_transport() == "tcp (TANDEM_SHM=0 on rank 1)", tcp.allreduce_transport());
          Tensor t = Tensor::full({100000}, rank + 1.0, kFloat32);
          tcp.allreduce(t)->wait(tcp.timeout());
          CHILD_CHECK(t.to_vector<float>()[99999] == 3.0f, t.to_vector<float>()[99999]);
        }
        unsetenv("TANDEM_SHM");
        ProcessGroupGloo pg(store, rank, 2, 20s);
        CHILD_CHECK(contains(pg.allreduce_transport(), "shared memory"), pg.allreduce_transport());
        // Rank 0 named the segment after its pid and unlinked it once both ranks had attached.
        if (rank == 0) store->set_string("pid0", std::to_string(getpid()));
        const std::string prefix = "tandem-" + store->get_string("pid0") + "-";
        for (const auto& entry : std::filesystem::directory_iterator("/dev/shm"))
          CHILD_CHECK(entry.path().filename().string().rfind(prefix, 0) != 0, entry.path().string());
        Tensor t = Tensor::full({100000}, rank + 1.0, kFloat32);
        pg.allreduce(t)->wait(pg.timeout());
        CHILD_CHECK(t.to_vector<float>()[0] == 3.0f, t.to_vector<float>()[0]);
      },
      opt));
}

TEST(GlooGroup, RendezvousWithAMissingRankFailsNamingTheStore) {
  JobOptions opt;
  opt.deadline = 60s;
  expect_all_ok(run_children(
      1,
      [](int rank, const std::string& path) {
        auto store = std::make_shared<FileStore>(path, -1, 1s);
        const std::string msg = error_of([&] { ProcessGroupGloo pg(store, 0, 2, 1s); });
        CHILD_CHECK(contains(msg, "rank 0 of 2") && contains(msg, "file://" + path), msg);
      },
      opt));
}

// ---- input checks (one-rank groups; nothing is sent) ----

TEST(GlooGroup, RejectsNonContiguousUndefinedAndMismatchedInputs) {
  expect_all_ok(run_job(1, [](ProcessGroupGloo& pg, Store&) {
    Tensor base = Tensor::zeros({3, 4}, kFloat32);
    Tensor strided = base.transpose(0, 1);
    std::string msg = error_of([&] { pg.allreduce(strided); });
    CHILD_CHECK(contains(msg, "allreduce") && contains(msg, "not contiguous"), msg);
    msg = error_of([&] { pg.broadcast(strided, 0); });
    CHILD_CHECK(contains(msg, "broadcast") && contains(msg, "not contiguous"), msg);
    Tensor undefined;
    msg = error_of([&] { pg.allreduce(undefined); });
    CHILD_CHECK(contains(msg, "undefined"), msg);
    Tensor ok = Tensor::ones({4}, kFloat32);
    msg = error_of([&] { pg.broadcast(ok, 1); });
    CHILD_CHECK(contains(msg, "root 1 outside [0, 1)"), msg);
    std::vector<Tensor> two = {Tensor::zeros({4}), Tensor::zeros({4})};
    msg = error_of([&] { pg.allgather(two, ok); });
    CHILD_CHECK(contains(msg, "2 output tensors given") && contains(msg, "(1)"), msg);
    std::vector<Tensor> wrong_shape = {Tensor::zeros({5})};
    msg = error_of([&] { pg.allgather(wrong_shape, ok); });
    CHILD_CHECK(contains(msg, "outputs[0]") && contains(msg, "float32[4]"), msg);
    std::vector<Tensor> strided_out = {Tensor::zeros({4, 3}).transpose(0, 1)};
    Tensor in43 = Tensor::zeros({3, 4});
    msg = error_of([&] { pg.allgather(strided_out, in43); });
    CHILD_CHECK(contains(msg, "not contiguous"), msg);
    // A one-rank group works: the values stay as they are.
    Tensor v = Tensor::from_vector<float>({1.5f, -2.0f}, {2});
    pg.allreduce(v)->wait(pg.timeout());
    CHILD_CHECK(v.to_vector<float>() == (std::vector<float>{1.5f, -2.0f}), "");
  }));
}

// CUDA tensors over Gloo (through host copies): tests/gpu/ddp_test.cpp, GpuGloo.*

// ---- interface choice and the factory ----

TEST(GlooGroup, LocalAddressTowardLoopbackIsLoopback) {
  EXPECT_EQ(local_address_toward("127.0.0.1"), "127.0.0.1");
  try {
    local_address_toward("no-such-host.invalid");
    ADD_FAILURE() << "expected an error for an unresolvable MASTER_ADDR";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
}

TEST(GlooGroup, UsesTheLoopbackAddressOfMasterAddr) {
  expect_all_ok(run_job(2, [](ProcessGroupGloo& pg, Store&) {
    CHILD_CHECK(contains(pg.local_address(), "127.0.0.1"), pg.local_address());
    Tensor t = Tensor::ones({3}, kFloat32);
    pg.allreduce(t)->wait(pg.timeout());
    CHILD_CHECK(t.to_vector<float>() == (std::vector<float>{2, 2, 2}), "");
  }));
}

TEST(GlooGroup, SocketIfnameSelectsTheInterface) {
  JobOptions opt;
  opt.env = {{"TANDEM_SOCKET_IFNAME", "lo"}};
  expect_all_ok(run_job(
      2,
      [](ProcessGroupGloo& pg, Store&) {
        CHILD_CHECK(contains(pg.local_address(), "127.0.0.1"), pg.local_address());
        Tensor t = Tensor::ones({3}, kFloat32);
        pg.allreduce(t)->wait(pg.timeout());
        CHILD_CHECK(t.to_vector<float>() == (std::vector<float>{2, 2, 2}), "");
      },
      opt));
  opt.env = {{"TANDEM_SOCKET_IFNAME", "tandem_no_such0"}};
  expect_all_ok(run_children(
      1,
      [](int, const std::string& path) {
        auto store = std::make_shared<FileStore>(path, 1, 5s);
        const std::string msg = error_of([&] { ProcessGroupGloo pg(store, 0, 1, 5s); });
        CHILD_CHECK(contains(msg, "tandem_no_such0") && contains(msg, "TANDEM_SOCKET_IFNAME"), msg);
      },
      opt));
}

TEST(MakeProcessGroup, BuildsGlooAndRejectsUnknownBackends) {
  expect_all_ok(run_children(
      2,
      [](int rank, const std::string& path) {
        auto store = std::make_shared<FileStore>(path, 2, 30s);
        std::shared_ptr<ProcessGroup> pg = make_process_group("gloo", store, rank, 2, 30s);
        CHILD_CHECK(pg->backend() == "gloo" && pg->rank() == rank && pg->size() == 2, pg->backend());
        Tensor t = Tensor::full({5}, rank == 0 ? 3.0 : -1.0, kFloat32);
        pg->allreduce(t, ReduceOp::Max)->wait(pg->timeout());
        CHILD_CHECK(t.to_vector<float>() == std::vector<float>(5, 3.0f), "");
      },
      JobOptions{}));
  auto store = std::make_shared<FileStore>(
      (std::filesystem::temp_directory_path() / ("tandem-pg-factory-" + std::to_string(getpid()))).string(),
      1, 1s);
  try {
    make_process_group("mpi", store, 0, 1, 1s);
    ADD_FAILURE() << "expected an error for backend 'mpi'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown process-group backend 'mpi'"), std::string::npos)
        << e.what();
  }
  if (!cuda_compiled()) {
    try {
      make_process_group("nccl", store, 0, 1, 1s);
      ADD_FAILURE() << "expected an error for nccl without CUDA";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tandem::dist
