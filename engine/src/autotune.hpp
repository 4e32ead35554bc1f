// The autotuner and the timing method shared with the benchmark.
#pragma once

#include <cuda.h>

#include <functional>
#include <string>
#include <vector>

#include "driver.hpp"
#include "jit.hpp"

namespace normjit::detail {

/// Timing method (one place): `warmup` untimed runs, then per repetition an
/// L2 flush (a memset of `flush`, at least twice the L2), event record,
/// fn(stream), event record; the median of `reps` (>= 10) in microseconds.
double median_us(const std::function<void(CUstream)>& fn, const DeviceBuffer& flush, int reps = 25,
                 int warmup = 3, CUstream stream = nullptr);

/// A device buffer of at least twice the L2 size, for median_us.
DeviceBuffer make_flush_buffer(const DeviceInfo& dev);

/// Scratch tensors of one shape, filled with random data (fixed seed), plus
/// the outputs of `op`.
struct Scratch {
  DeviceBuffer x, w, y, rstd, dy, dx, dw, workspace;
  Scratch(Op op, const NormDesc& d, std::uint64_t seed);
  /// Fills the outputs with NaN bit patterns (0xFF bytes).
  void poison(Op op, const NormDesc& d) const;
};

/// Progress callback: (done, total, text).
using ProgressFn = std::function<void(int, int, const std::string&)>;

/// Tunes `op` on `desc`: compiles the grid in parallel, drops candidates that
/// fail to compile, would spill or cannot launch, checks each survivor's
/// outputs against the heuristic config's (the simplest survivor's when the
/// heuristic config itself was rejected), times the rest (median_us) and
/// picks the fastest; a candidate within 2% of the fastest that is simpler
/// (simplicity_key) wins instead, so repeated tuning gives the same answer.
TuneResult autotune(Op op, const NormDesc& desc, const DeviceInfo& dev, KernelCache& jit,
                    const ProgressFn& progress = {});

/// Index of the winner among `candidates` (in grid order, simplest first):
/// the first whose median is within `tie` (2%) of the fastest. -1 when none
/// was timed. Pure, so the tie rule is testable without a GPU.
int pick_winner(const std::vector<CandidateTiming>& candidates, double tie = 1.02);

/// Runs `fn(i)` for i in [0, n) on up to hardware_concurrency threads;
/// rethrows the first exception after all finished.
void parallel_for(int n, const std::function<void(int)>& fn);

}  // namespace normjit::detail
