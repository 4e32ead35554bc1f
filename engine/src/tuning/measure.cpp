#include "tuning/measure.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/host_dtype.hpp"
#include "device/kernel_clock.hpp"

namespace normjit::detail {

DeviceBuffer make_flush_buffer(const DeviceInfo& dev) {
  return DeviceBuffer(static_cast<std::size_t>(std::max<std::int64_t>(dev.l2_bytes, 1 << 20)) * 2);
}

double median_us(const std::function<void(CUstream)>& fn, const DeviceBuffer& flush, int reps, int warmup,
                 CUstream stream) {
  reps = std::max(reps, 10);
  for (int i = 0; i < warmup; ++i) fn(stream);
  if (KernelClock* clock = KernelClock::get()) {
    const CUdevice device = current_device();
    NJ_CU(cuStreamSynchronize(stream));
    clock->begin(device);
    for (int i = 0; i < reps; ++i) {
      NJ_CU(cuMemsetD32Async(flush.get(), 0x5a5a5a5au + i, flush.bytes() / 4, stream));  // not recorded
      fn(stream);
    }
    NJ_CU(cuStreamSynchronize(stream));
    const std::vector<Activity> acts = clock->end(device);
    // Each repetition launched the same kernels and copies: sum their
    // durations per repetition (as profilers sum a call's kernels).
    if (!acts.empty() && acts.size() % reps == 0) {
      const std::size_t per = acts.size() / reps;
      std::vector<double> t(reps, 0.0);
      for (std::size_t j = 0; j < acts.size(); ++j) t[j / per] += (acts[j].end - acts[j].start) / 1000.0;
      std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
      return t[t.size() / 2];
    }
    // Another thread's work was recorded too: time again with events.
  }
  Event start, end;
  std::vector<double> t;
  t.reserve(reps);
  for (int i = 0; i < reps; ++i) {
    // Evict the L2 so every repetition reads the inputs from device memory.
    NJ_CU(cuMemsetD32Async(flush.get(), 0x5a5a5a5au + i, flush.bytes() / 4, stream));
    NJ_CU(cuEventRecord(start.get(), stream));
    fn(stream);
    NJ_CU(cuEventRecord(end.get(), stream));
    t.push_back(1000.0 * elapsed_ms(start, end));
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

DeviceBuffer random_tensor(const TensorSpec& t, float lo, float hi, std::uint64_t seed) {
  const std::size_t n = static_cast<std::size_t>(t.span());
  const std::size_t es = dtype_size(t.dtype);
  // 2^20 random values from the host, repeated on the device: filling a
  // tensor of 10^8 elements on the host would take seconds.
  const std::size_t fresh = std::min<std::size_t>(n, std::size_t{1} << 20);
  std::vector<unsigned char> host(fresh * es);
  Random rng(seed);
  for (std::size_t i = 0; i < fresh; ++i) store_as(t.dtype, host.data(), i, rng.uniform(lo, hi));
  DeviceBuffer b(std::max<std::size_t>(n * es, 16));
  if (!host.empty()) NJ_CU(cuMemcpyHtoD(b.get(), host.data(), host.size()));
  for (std::size_t done = fresh; done < n;) {
    const std::size_t k = std::min(done, n - done);
    NJ_CU(cuMemcpyDtoDAsync(b.get() + done * es, b.get(), k * es, nullptr));
    done += k;
  }
  if (fresh < n) NJ_CU(cuCtxSynchronize());
  return b;
}

namespace {

// Value ranges of the random inputs: activations around 0, weights around 1,
// statistics as a forward would give them.
std::pair<float, float> input_range(const std::string& name, DType t) {
  // FP8 x: codes over most of the format's range, with scales that bring
  // them to ~[-2, 2]; a static y scale small enough that some q saturate.
  if (is_fp8(t)) return {-fp8_max(t) / 2, fp8_max(t) / 2};
  if (name == "x_scale") return {0.002f, 0.01f};
  if (name == "y_scale") return {0.005f, 0.01f};
  if (name == "weight") return {0.5f, 1.5f};
  if (name == "bias" || name == "mean") return {-0.5f, 0.5f};
  if (name == "rstd") return {0.5f, 1.0f};
  if (name == "dy" || name == "dresidual") return {-1.f, 1.f};
  return {-2.f, 2.f};
}

}  // namespace

Scratch::Scratch(Op op, const NormDesc& d, std::uint64_t seed) : specs(op_tensors(op, d)) {
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& t = specs[i];
    if (t.output) {
      buf.emplace(t.name, DeviceBuffer(std::max<std::size_t>(16, t.span() * dtype_size(t.dtype))));
    } else {
      auto [lo, hi] = input_range(t.name, t.dtype);
      buf.emplace(t.name, random_tensor(t, lo, hi, seed + i));
    }
  }
}

void* Scratch::ptr(const std::string& name) const {
  auto it = buf.find(name);
  return it == buf.end() ? nullptr : it->second.ptr();
}

ForwardTensors Scratch::forward_tensors() const {
  ForwardTensors t;
  t.x = ptr("x");
  t.residual = ptr("residual");
  t.weight = ptr("weight");
  t.bias = ptr("bias");
  t.y = ptr("y");
  t.residual_out = ptr("residual_out");
  t.mean = static_cast<float*>(ptr("mean"));
  t.rstd = static_cast<float*>(ptr("rstd"));
  t.x_scale = static_cast<const float*>(ptr("x_scale"));
  t.y_scale = ptr("y_scale");
  t.amax = static_cast<float*>(ptr("amax"));
  t.y_hp = ptr("y_hp");
  t.y_t = ptr("y_t");
  return t;
}

BackwardTensors Scratch::backward_tensors() const {
  BackwardTensors t;
  t.dy = ptr("dy");
  t.x = ptr("x");
  t.weight = ptr("weight");
  t.mean = static_cast<const float*>(ptr("mean"));
  t.rstd = static_cast<const float*>(ptr("rstd"));
  t.dresidual = ptr("dresidual");
  t.x_scale = static_cast<const float*>(ptr("x_scale"));
  t.dx = ptr("dx");
  t.dweight = ptr("dweight");
  t.dbias = ptr("dbias");
  t.workspace = workspace.bytes() ? workspace.ptr() : nullptr;
  t.workspace_bytes = workspace.bytes();
  return t;
}

void Scratch::poison() const {
  for (const auto& t : specs)
    if (t.output) NJ_CU(cuMemsetD8Async(buf.at(t.name).get(), 0xff, buf.at(t.name).bytes(), nullptr));
}

std::vector<float> Scratch::download(const std::string& name, std::int64_t max_rows) const {
  TensorSpec t = *std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == name; });
  t.rows = std::min(t.rows, max_rows);
  std::vector<unsigned char> raw(static_cast<std::size_t>(t.span()) * dtype_size(t.dtype));
  NJ_CU(cuCtxSynchronize());
  if (!raw.empty()) NJ_CU(cuMemcpyDtoH(raw.data(), buf.at(name).get(), raw.size()));
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(t.rows * t.cols));
  for (std::int64_t r = 0; r < t.rows; ++r)
    for (std::int64_t j = 0; j < t.cols; ++j) out.push_back(load_as(t.dtype, raw.data(), t.offset(r) + j));
  return out;
}

}  // namespace normjit::detail
