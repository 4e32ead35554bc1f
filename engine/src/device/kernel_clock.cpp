#include "device/kernel_clock.hpp"

#include <cupti_activity.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "core/cuda_libraries.hpp"
#include "normjit/normjit.hpp"

namespace normjit::detail {

namespace {

// The start and end of kernel and copy records are read through the newest
// record structs of the CUPTI headers built against; the fields keep their
// place across versions (both after 16 bytes of kind and configuration).
static_assert(offsetof(CUpti_ActivityKernel10, start) == 16 && offsetof(CUpti_ActivityKernel10, end) == 24);
// So does the device (the ordinal of the record's context), which keeps the
// regions that threads time on different GPUs at once apart.
static_assert(offsetof(CUpti_ActivityKernel10, deviceId) == 40 && offsetof(CUpti_ActivityKernel4, deviceId) == 40);
static_assert(offsetof(CUpti_ActivityMemcpy6, deviceId) == 32 && offsetof(CUpti_ActivityMemcpy, deviceId) == 32);
static_assert(offsetof(CUpti_ActivityMemcpy6, start) == 16 && offsetof(CUpti_ActivityMemcpy6, end) == 24);

struct Cupti {
  decltype(&::cuptiActivityRegisterCallbacks) registerCallbacks = nullptr;
  decltype(&::cuptiActivityEnable) enable = nullptr;
  decltype(&::cuptiActivityDisable) disable = nullptr;
  decltype(&::cuptiActivityFlushAll) flushAll = nullptr;
  decltype(&::cuptiActivityGetNextRecord) getNextRecord = nullptr;
  std::string error;  // why CUPTI cannot be used; empty when it can
};

// Records delivered by CUPTI's buffer callbacks, per device, until end()
// takes them; `recording` counts the devices between begin() and end()
// (CUPTI's activity kinds are enabled for the process, so they stay on
// while any device records).
std::mutex sink_mu;
std::map<std::uint32_t, std::vector<Activity>> sink;
int recording = 0;

constexpr std::size_t kBufferBytes = 1 << 20;

std::atomic<bool> cupti_preferred{false};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

const Cupti& cupti();

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lk(sink_mu);
  while (cupti().getNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      sink[k->deviceId].push_back({k->start, k->end});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      sink[m->deviceId].push_back({m->start, m->end});
    }
  }
  std::free(buffer);
}

std::vector<std::string> candidate_paths() {
  return library_candidates("NORMJIT_CUPTI_LIBRARY", {"libcupti.so.13", "libcupti.so.12", "libcupti.so"},
                            {"lib64", "extras/CUPTI/lib64"});
}

#define NORMJIT_STR2(x) #x
#define NORMJIT_STR(x) NORMJIT_STR2(x)

const Cupti& cupti() {
  static const Cupti api = [] {
    Cupti r;
    const char* t = std::getenv("NORMJIT_TIMER");
    const std::string timer = t ? t : "";
    if (timer == "events") {
      r.error = "NORMJIT_TIMER=events";
      return r;
    }
    if (timer != "cupti" && !cupti_preferred) {
      r.error = "CUPTI not asked for (a library process leaves it to its profilers; NORMJIT_TIMER=cupti)";
      return r;
    }
    std::string path, tried;
    void* h = open_first(candidate_paths(), &path, &tried);
    if (!h) {
      r.error = "libcupti not found (NORMJIT_CUPTI_LIBRARY names it)";
      return r;
    }
#define NORMJIT_LOAD(field, name)                                               \
  r.field = reinterpret_cast<decltype(r.field)>(dlsym(h, NORMJIT_STR(name)));  \
  if (!r.field && r.error.empty()) r.error = fmt::format("libcupti lacks {}", NORMJIT_STR(name));
    NORMJIT_LOAD(registerCallbacks, cuptiActivityRegisterCallbacks)
    NORMJIT_LOAD(enable, cuptiActivityEnable)
    NORMJIT_LOAD(disable, cuptiActivityDisable)
    NORMJIT_LOAD(flushAll, cuptiActivityFlushAll)
    NORMJIT_LOAD(getNextRecord, cuptiActivityGetNextRecord)
#undef NORMJIT_LOAD
    if (r.error.empty() && r.registerCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS)
      r.error = "CUPTI refused its buffer callbacks (another profiler attached?)";
    return r;
  }();
  return api;
}

void check(CUptiResult r, const char* call) {
  if (r != CUPTI_SUCCESS) throw Error(ErrorKind::Driver, fmt::format("{} failed: CUPTI error {}", call, static_cast<int>(r)));
}

}  // namespace

void KernelClock::prefer_cupti() { cupti_preferred = true; }

KernelClock* KernelClock::get() {
  static KernelClock clock;
  return cupti().error.empty() ? &clock : nullptr;
}

const std::string& KernelClock::unavailable_reason() { return cupti().error; }

void KernelClock::begin(CUdevice device) {
  std::lock_guard<std::mutex> lk(sink_mu);
  sink[static_cast<std::uint32_t>(device)].clear();
  if (recording == 0) {
    check(cupti().enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
    check(cupti().enable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(MEMCPY)");
  }
  ++recording;
}

std::vector<Activity> KernelClock::end(CUdevice device) {
  // Outside sink_mu: the flush delivers buffers through buffer_completed,
  // which takes it.
  check(cupti().flushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::vector<Activity> out;
  {
    std::lock_guard<std::mutex> lk(sink_mu);
    if (--recording == 0) {
      check(cupti().disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable(CONCURRENT_KERNEL)");
      check(cupti().disable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityDisable(MEMCPY)");
    }
    out.swap(sink[static_cast<std::uint32_t>(device)]);
  }
  std::sort(out.begin(), out.end(), [](const Activity& a, const Activity& b) { return a.start < b.start; });
  return out;
}

std::string timing_method() {
  return KernelClock::get() ? "profiler (CUPTI kernel durations)" : "events (" + KernelClock::unavailable_reason() + ")";
}

}  // namespace normjit::detail
