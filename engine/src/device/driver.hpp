// The CUDA Driver API, opened with dlopen so that binaries start (and explain
// what is missing) on machines without a driver. RAII owners for the handles
// the engine creates.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>

#include "device/device_facts.hpp"
#include "normjit/normjit.hpp"

namespace normjit::detail {

// One table entry per driver function used. The member is named after the
// versioned symbol cuda.h maps the call to (cuMemAlloc -> cuMemAlloc_v2).
#define NORMJIT_DRIVER_FUNCTIONS(X)                                                      \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                  \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute)          \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent)            \
  X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize)                               \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncGetAttribute)     \
  X(cuFuncSetAttribute) X(cuLaunchKernel) X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
  X(cuLaunchKernelEx) X(cuOccupancyMaxActiveClusters) X(cuOccupancyMaxPotentialClusterSize) \
  X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuMemcpyHtoD) X(cuMemcpyDtoH)             \
  X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) X(cuMemsetD32Async) X(cuStreamSynchronize)     \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)              \
  X(cuEventElapsedTime)

struct DriverApi {
#define NORMJIT_DECLARE(name) decltype(&::name) name = nullptr;
  NORMJIT_DRIVER_FUNCTIONS(NORMJIT_DECLARE)
#undef NORMJIT_DECLARE
};

/// The loaded driver; throws Error(LibraryNotFound) naming the library and
/// dlerror() when libcuda.so.1 or one of its symbols cannot be loaded.
/// cuInit(0) has been called when this returns.
const DriverApi& cu();

/// Whether the driver loads and reports at least one device; `why` says what
/// is missing otherwise. Never throws.
bool gpu_available(std::string* why = nullptr);

/// Throws Error(Driver) with the call text, the driver's error name and
/// message, and file:line.
[[noreturn]] void throw_driver_error(CUresult r, const char* call, const char* file, int line);

#define NJ_CU(call)                                                                      \
  do {                                                                                   \
    CUresult nj_r_ = ::normjit::detail::cu().call;                                       \
    if (nj_r_ != CUDA_SUCCESS) ::normjit::detail::throw_driver_error(nj_r_, #call, __FILE__, __LINE__); \
  } while (0)

/// The device of the current context; retains the primary context of device
/// 0 and makes it current when the thread has none.
CUdevice current_device();

/// How many devices the driver reports (0 without a driver or GPU; never throws).
int device_count();

/// Makes device `ordinal`'s primary context current on this thread (retained
/// for the process, as current_device does for device 0) and returns the
/// device. Throws Error(InvalidArgument) naming the ordinal and the device
/// count when no such device exists.
CUdevice use_device(int ordinal);

struct DeviceInfo {
  CUdevice device = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0, sm_count = 0;
  std::int64_t l2_bytes = 0;
  int max_smem_per_block_optin = 0;
  int max_regs_per_sm = 0, max_threads_per_sm = 0;
  std::int64_t smem_per_sm = 0;
  double memory_gbps = 0;  ///< 2 * memory clock * bus width
  double sm_clock_ghz = 0;
  /// The largest thread-block cluster a config may use here: kMaxCluster
  /// where the device launches clusters (sm_90+), else 1.
  int max_cluster = 1;
  std::string arch() const { return "sm_" + std::to_string(cc_major * 10 + cc_minor); }
  /// What the config model reads of this device (the driver's attributes).
  DeviceFacts facts() const;
};
DeviceInfo device_info(CUdevice dev);


/// Owns a device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = 0; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr get() const { return ptr_; }
  void* ptr() const { return reinterpret_cast<void*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

/// Owns a CUevent (timing enabled).
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent get() const { return ev_; }

 private:
  CUevent ev_ = nullptr;
};

/// Milliseconds between two recorded events (waits for `end`).
float elapsed_ms(const Event& start, const Event& end);

}  // namespace normjit::detail
