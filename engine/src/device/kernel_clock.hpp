// Kernel durations as a profiler reads them: CUPTI activity records of the
// kernels and copies a region launches, each from its start to its end on
// the GPU. Events around one launch also count the launch and the events
// themselves: about 3 us over a decode kernel of 2 us on an H100, with
// 10-17% spread between identical configs, so at decode the tuner ranked
// configs on noise and timed them otherwise than the peers are compared
// (profiler kernel sums). libcupti is opened with dlopen; without it (or
// with another profiler holding CUPTI) median_us falls back to events.
//
// Only processes that ask for it use CUPTI (the CLI does: tune, bench, and
// so tools/heldout.py): CUPTI takes one set of activity callbacks a
// process, so a library that registered its own would break the profiler
// of the program it runs in (torch.profiler's, say). Elsewhere, first-call
// tuning times with events unless NORMJIT_TIMER=cupti.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

namespace normjit::detail {

/// Start and end (ns, the GPU's clock) of one kernel or copy.
struct Activity {
  std::uint64_t start = 0, end = 0;
};

class KernelClock {
 public:
  /// Asks for CUPTI timing in this process (before the first get();
  /// NORMJIT_TIMER overrides either way).
  static void prefer_cupti();
  /// The process's clock, or nullptr where CUPTI is not used: not asked for
  /// (prefer_cupti, NORMJIT_TIMER=cupti), NORMJIT_TIMER=events, libcupti not
  /// found (NORMJIT_CUPTI_LIBRARY names it), or CUPTI refused its callbacks
  /// (another profiler attached).
  static KernelClock* get();
  /// Why get() returned nullptr ("" when it did not).
  static const std::string& unavailable_reason();

  /// Records the kernels and device copies launched on `device` from now on
  /// (memsets, such as the L2 flush, are not recorded). Threads may record
  /// different devices at once; one device is recorded by one thread at a
  /// time (the tuner's gpu_mutex).
  void begin(CUdevice device);
  /// Stops recording `device`; its activities since begin(), ordered by
  /// start. The caller has synchronized the work it launched.
  std::vector<Activity> end(CUdevice device);

 private:
  KernelClock() = default;
};

/// "profiler (CUPTI)" or "events": the method median_us uses in this process.
std::string timing_method();

}  // namespace normjit::detail
