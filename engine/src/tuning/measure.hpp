// Measuring a launch: the one timing method (shared by the tuner and the
// benchmark) and the scratch tensors candidates run on.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensors.hpp"
#include "device/driver.hpp"

namespace normjit::detail {

/// Timing method (one place): `warmup` untimed runs, then per repetition an
/// L2 flush (a memset of `flush`, at least twice the L2) and fn(stream); the
/// median over `reps` (>= 10) of the summed GPU durations of the kernels and
/// copies fn launched, read from CUPTI (kernel_clock.hpp: as profilers
/// report kernel time), in microseconds. Without CUPTI: event records around
/// fn(stream) (which add the launch: about 3 us at decode).
double median_us(const std::function<void(CUstream)>& fn, const DeviceBuffer& flush, int reps = 25,
                 int warmup = 3, CUstream stream = nullptr);

/// A device buffer of at least twice the L2 size, for median_us.
DeviceBuffer make_flush_buffer(const DeviceInfo& dev);

/// Device buffers for every tensor of `op` on `desc` (op_tensors), inputs
/// filled with random data (fixed seed), plus a workspace.
struct Scratch {
  std::vector<TensorSpec> specs;
  std::map<std::string, DeviceBuffer> buf;
  DeviceBuffer workspace;
  Scratch(Op op, const NormDesc& d, std::uint64_t seed);
  /// The device address of tensor `name`, or null when the op has none.
  void* ptr(const std::string& name) const;
  ForwardTensors forward_tensors() const;
  BackwardTensors backward_tensors() const;
  /// Fills the outputs with NaN bit patterns (0xFF bytes).
  void poison() const;
  /// The elements of tensor `name` (its rows only, not the gaps between
  /// them), as floats; of a row tensor, its first `max_rows` rows at most.
  std::vector<float> download(const std::string& name, std::int64_t max_rows = INT64_MAX) const;
};

/// A device buffer of `t`'s span filled with uniform random values in [lo, hi).
DeviceBuffer random_tensor(const TensorSpec& t, float lo, float hi, std::uint64_t seed);

}  // namespace normjit::detail
