// The shared thread pool used by CPU kernels. Sized from --threads /
// set_num_threads, else OMP_NUM_THREADS, else the number of cores. The calling
// thread takes part in parallel_for, so a pool of n threads owns n-1 workers.
// parallel_for is not re-entrant: a body that calls it again runs serially. Between regions an idle
// thread spins for up to 50 us (yielding the core after the first few) before it sleeps, so the
// short regions of a training step do not pay a kernel wake-up each; OMP_WAIT_POLICY=passive (read
// when the pool is built) makes idle threads sleep at once.
#pragma once

#include <cstdint>
#include <functional>

namespace tandem {

// Splits [begin, end) into at most num_threads() chunks of at least `grain`
// elements and runs fn(chunk_begin, chunk_end) on them, returning when all are
// done. Exceptions from fn are rethrown on the caller.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

int num_threads();
void set_num_threads(int n);  // n >= 1

}  // namespace tandem
