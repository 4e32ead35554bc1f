#include "device/driver.hpp"

#include <dlfcn.h>

#include <mutex>

#include <fmt/format.h>

namespace normjit::detail {

namespace {

#define NORMJIT_STR2(x) #x
#define NORMJIT_STR(x) NORMJIT_STR2(x)

struct Loaded {
  DriverApi api;
  std::string error;  // empty when loaded
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      r.error = fmt::format("libcuda.so.1 (the NVIDIA driver) could not be opened: {}",
                            e ? e : "unknown reason");
      return r;
    }
    // NORMJIT_STR expands cuda.h's macros first, giving the versioned symbol.
#define NORMJIT_LOAD(name)                                                        \
  r.api.name = reinterpret_cast<decltype(r.api.name)>(dlsym(h, NORMJIT_STR(name))); \
  if (!r.api.name && r.error.empty())                                             \
    r.error = fmt::format("libcuda.so.1 lacks {} (driver too old?)", NORMJIT_STR(name));
    NORMJIT_DRIVER_FUNCTIONS(NORMJIT_LOAD)
#undef NORMJIT_LOAD
    if (r.error.empty()) {
      CUresult rc = r.api.cuInit(0);
      if (rc != CUDA_SUCCESS) {
        const char* name = nullptr;
        r.api.cuGetErrorName(rc, &name);
        r.error = fmt::format("cuInit(0) failed: {} (no usable NVIDIA GPU or driver)", name ? name : "?");
      }
    }
    return r;
  }();
  return l;
}

}  // namespace

const DriverApi& cu() {
  const Loaded& l = loaded();
  if (!l.error.empty())
    throw Error(l.error.rfind("cuInit", 0) == 0 ? ErrorKind::NoDevice : ErrorKind::LibraryNotFound,
                l.error);
  return l.api;
}

bool gpu_available(std::string* why) {
  try {
    int n = 0;
    NJ_CU(cuDeviceGetCount(&n));
    if (n == 0) {
      if (why) *why = "the driver loaded but reports no CUDA device";
      return false;
    }
    return true;
  } catch (const Error& e) {
    if (why) *why = e.message();
    return false;
  }
}

void throw_driver_error(CUresult r, const char* call, const char* file, int line) {
  const char* name = nullptr;
  const char* msg = nullptr;
  const Loaded& l = loaded();
  if (l.api.cuGetErrorName) l.api.cuGetErrorName(r, &name);
  if (l.api.cuGetErrorString) l.api.cuGetErrorString(r, &msg);
  throw Error(ErrorKind::Driver,
              fmt::format("{} failed: {} ({})", call, name ? name : std::to_string(r).c_str(),
                          msg ? msg : "no message"),
              {}, {}, {}, fmt::format("{}:{}", file, line));
}

CUdevice current_device() {
  CUcontext ctx = nullptr;
  NJ_CU(cuCtxGetCurrent(&ctx));
  if (!ctx) {
    // No context on this thread: use device 0's primary context, as the
    // runtime API (and so PyTorch) does. It is retained for the process.
    CUdevice dev = 0;
    NJ_CU(cuDeviceGet(&dev, 0));
    NJ_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    NJ_CU(cuCtxSetCurrent(ctx));
  }
  CUdevice dev = 0;
  NJ_CU(cuCtxGetDevice(&dev));
  return dev;
}

int device_count() {
  std::string why;
  if (!gpu_available(&why)) return 0;
  int n = 0;
  return cu().cuDeviceGetCount(&n) == CUDA_SUCCESS ? n : 0;
}

CUdevice use_device(int ordinal) {
  const int n = device_count();
  if (ordinal < 0 || ordinal >= n)
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("device {} does not exist: this machine has {} GPU{}{}", ordinal, n, n == 1 ? "" : "s",
                            n ? fmt::format(" (0-{})", n - 1) : ""));
  CUdevice dev = 0;
  NJ_CU(cuDeviceGet(&dev, ordinal));
  CUcontext ctx = nullptr;
  NJ_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  NJ_CU(cuCtxSetCurrent(ctx));
  return dev;
}

DeviceInfo device_info(CUdevice dev) {
  DeviceInfo d;
  d.device = dev;
  char name[256] = {0};
  NJ_CU(cuDeviceGetName(name, sizeof name - 1, dev));
  d.name = name;
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    NJ_CU(cuDeviceGetAttribute(&v, a, dev));
    return v;
  };
  d.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  d.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  d.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  d.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  d.max_smem_per_block_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  d.max_regs_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  d.max_threads_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  d.smem_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  d.sm_clock_ghz = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE) / 1e6;
  // Double data rate: two transfers per clock (kHz) over the bus (bits).
  d.memory_gbps = 2.0 * attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) * 1e3 *
                  attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) / 8 / 1e9;
  d.max_cluster = attr(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH) ? max_cluster_of_arch(d.cc_major * 10 + d.cc_minor) : 1;
  return d;
}

DeviceFacts DeviceInfo::facts() const {
  DeviceFacts f = DeviceFacts::of(cc_major, cc_minor, sm_count, l2_bytes, memory_gbps);
  f.max_threads_per_sm = max_threads_per_sm;
  f.regs_per_sm = max_regs_per_sm;
  if (smem_per_sm > 0) f.smem_per_sm = smem_per_sm;
  if (sm_clock_ghz > 0) f.sm_clock_ghz = sm_clock_ghz;
  f.max_cluster = max_cluster;
  return f;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes) NJ_CU(cuMemAlloc(&ptr_, bytes));
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cu().cuMemFree(ptr_);  // no throw from a destructor
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cu().cuMemFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = 0;
    o.bytes_ = 0;
  }
  return *this;
}

Event::Event() { NJ_CU(cuEventCreate(&ev_, CU_EVENT_DEFAULT)); }
Event::~Event() {
  if (ev_) cu().cuEventDestroy(ev_);
}

float elapsed_ms(const Event& start, const Event& end) {
  NJ_CU(cuEventSynchronize(end.get()));
  float ms = 0;
  NJ_CU(cuEventElapsedTime(&ms, start.get(), end.get()));
  return ms;
}

}  // namespace normjit::detail
