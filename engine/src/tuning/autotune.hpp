// The autotuner: a grid compiled in parallel, every candidate checked, timed
// (measure.hpp), and the model's config kept unless clearly beaten.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "device/driver.hpp"
#include "compile/jit.hpp"
#include "core/tensors.hpp"
#include "tuning/measure.hpp"

namespace normjit::detail {

/// Progress callback: (done, total, text).
using ProgressFn = std::function<void(int, int, const std::string&)>;

/// How autotune searches.
struct TuneOptions {
  /// false: time the whole candidate grid. true: local search: start from
  /// `start` (default: the heuristic config) and move to the fastest config
  /// one step away (one_step in autotune.cpp) while it is >1% faster; compiles
  /// and times a tenth of the grid or less (the grid sweep of tools/tune_grid.sh).
  bool local = false;
  std::optional<LaunchConfig> start;
  int reps = 25;  ///< timed repetitions per candidate (median)
  /// Elements of each output compared with the reference config's (rows of
  /// at least 8 and at most 4096): a wide shape's check takes milliseconds.
  std::int64_t check_elements = std::int64_t{1} << 22;
  /// Kernels (spec name and programs per SM) already checked on this variant
  /// and N at another M: not checked again. Filled as candidates pass.
  std::set<std::string>* checked = nullptr;
  /// Buffers of the same variant and N with at least desc.M rows (contiguous
  /// rows); default: fresh ones.
  const Scratch* scratch = nullptr;
};

/// Tunes `op` on `desc`: compiles the grid in parallel, drops candidates that
/// fail to compile, would spill or cannot launch, checks each survivor's
/// outputs against the model's config's (the simplest survivor's when the
/// model's config itself was rejected), times the rest (median_us) and
/// picks the fastest; a candidate within 2% of the fastest that is simpler
/// (simplicity_key) wins instead, so repeated tuning gives the same answer.
/// Last, the pick and the model's config are timed in alternating rounds:
/// the model's config wins unless beaten by more than 2% (TuneResult).
TuneResult autotune(Op op, const NormDesc& desc, const DeviceInfo& dev, KernelCache& jit,
                    const ProgressFn& progress = {}, const TuneOptions& options = {});

/// Index of the winner among `candidates` (in grid order, simplest first):
/// the first whose median is within `tie` (2%) of the fastest. -1 when none
/// was timed. Pure, so the tie rule is testable without a GPU.
int pick_winner(const std::vector<CandidateTiming>& candidates, double tie = 1.02);

/// Held by a tuner while it uses its GPU (loading, checking, timing), so
/// tuners in several threads overlap their compiles with one another's
/// timing but never time on one GPU at once: the mutex of the current
/// context's device (tuners of different GPUs time in parallel).
std::mutex& gpu_mutex();
/// The same for `device`.
std::mutex& gpu_mutex(CUdevice device);

}  // namespace normjit::detail
