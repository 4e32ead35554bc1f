#include "autotune.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "config_grid.hpp"
#include "host_dtype.hpp"
#include "ops.hpp"
#include "tuned_cache.hpp"

namespace normjit::detail {

void parallel_for(int n, const std::function<void(int)>& fn) {
  const int workers = std::max(1, std::min<int>(n, static_cast<int>(std::thread::hardware_concurrency())));
  std::atomic<int> next{0};
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> pool;
  for (int t = 0; t < workers; ++t)
    pool.emplace_back([&] {
      for (int i; (i = next++) < n;) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lk(mu);
          if (!first) first = std::current_exception();
        }
      }
    });
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

int pick_winner(const std::vector<CandidateTiming>& candidates, double tie) {
  double best = -1;
  for (const auto& c : candidates)
    if (c.median_us > 0 && (best < 0 || c.median_us < best)) best = c.median_us;
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].median_us > 0 && candidates[i].median_us <= best * tie) return static_cast<int>(i);
  return -1;
}

DeviceBuffer make_flush_buffer(const DeviceInfo& dev) {
  return DeviceBuffer(static_cast<std::size_t>(std::max<std::int64_t>(dev.l2_bytes, 1 << 20)) * 2);
}

double median_us(const std::function<void(CUstream)>& fn, const DeviceBuffer& flush, int reps, int warmup,
                 CUstream stream) {
  reps = std::max(reps, 10);
  for (int i = 0; i < warmup; ++i) fn(stream);
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
  std::vector<unsigned char> host(n * dtype_size(t.dtype));
  Random rng(seed);
  for (std::size_t i = 0; i < n; ++i) store_as(t.dtype, host.data(), i, rng.uniform(lo, hi));
  DeviceBuffer b(std::max<std::size_t>(host.size(), 16));
  if (!host.empty()) NJ_CU(cuMemcpyHtoD(b.get(), host.data(), host.size()));
  return b;
}

namespace {

// Rows of each candidate's outputs compared with the reference config's:
// about 4M elements (at least 8 rows, at most 4096), so a wide shape's check
// takes milliseconds, not seconds.
std::int64_t checked_rows(std::int64_t N) { return std::clamp<std::int64_t>((std::int64_t{1} << 22) / std::max<std::int64_t>(1, N), 8, 4096); }

// Candidate outputs against the reference config's: a few roundings apart at
// most (reduction order differs between configs); NaN (poison) never passes.
std::string mismatch(const std::vector<float>& got, const std::vector<float>& ref, DType t, const std::string& what) {
  double ss = 0;
  for (float r : ref) ss += static_cast<double>(r) * r;
  const double scale = std::sqrt(ss / std::max<std::size_t>(1, ref.size()));
  const double rtol = t == DType::F32 ? 1e-4 : 4 * unit_roundoff(t);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(d <= rtol * (std::fabs(ref[i]) + scale)))
      return fmt::format("{}[{}] = {} but the reference config gives {}", what, i, got[i], ref[i]);
  }
  return {};
}

// Value ranges of the random inputs: activations around 0, weights around 1,
// statistics as a forward would give them.
std::pair<float, float> input_range(const std::string& name) {
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
      auto [lo, hi] = input_range(t.name);
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

TuneResult autotune(Op op, const NormDesc& desc, const DeviceInfo& dev, KernelCache& jit,
                    const ProgressFn& progress) {
  TuneResult res;
  res.shape_key = shape_key(op, desc);
  const std::vector<LaunchConfig> grid = candidate_grid(op, desc, dev.max_cluster);
  const LaunchConfig ref_cfg = heuristic_config(op, desc, dev.max_cluster);
  const int total = static_cast<int>(grid.size());
  auto report = [&](int done, const std::string& text) {
    if (progress) progress(done, total, text);
  };

  // 1. Compile every candidate in parallel (NVRTC is thread-safe); the disk
  //    cache makes a second tuning run skip this.
  std::vector<std::string> compile_error(grid.size());
  std::vector<KernelBinary> binaries(grid.size());
  std::atomic<int> compiled{0};
  parallel_for(total, [&](int i) {
    try {
      // Configs differing only in launch parameters share a cubin.
      for (int j = 0; j < i; ++j)
        if (make_spec(op, desc, grid[j]).name() == make_spec(op, desc, grid[i]).name()) return report(++compiled, "");
      binaries[i] = compile_spec(make_spec(op, desc, grid[i]), dev.arch(), jit.kernel_dir());
    } catch (const Error& e) {
      compile_error[i] = e.message();
    }
    report(++compiled, "compiled " + grid[i].str());
  });

  // 2. Load and prune on what the compiler decided: spills, registers.
  std::vector<std::shared_ptr<const LoadedKernel>> kernels(grid.size());
  for (int i = 0; i < total; ++i) {
    CandidateTiming ct{grid[i], -1, compile_error[i]};
    if (ct.rejected.empty()) {
      try {
        const KernelBinary* bin = binaries[i].cubin.empty() ? nullptr : &binaries[i];
        kernels[i] = jit.get(make_spec(op, desc, grid[i]), dev.arch(), bin);
        const auto& k = *kernels[i];
        if (k.local_bytes > 0)
          ct.rejected = fmt::format("spills: {} bytes of local memory per thread", k.local_bytes);
        else if (k.blocks_per_sm < 1 || k.max_threads < grid[i].threads())
          ct.rejected = fmt::format("cannot launch: {} registers x {} threads", k.num_regs, grid[i].threads());
      } catch (const Error& e) {
        ct.rejected = e.message();
      }
    }
    if (!ct.rejected.empty()) kernels[i].reset();
    res.candidates.push_back(ct);
  }
  const auto fin = op == Op::Backward ? jit.get(finalize_spec(desc), dev.arch()) : nullptr;

  // 3. The reference config's outputs on random data.
  Scratch s(op, desc, 0x5eed0000u + static_cast<std::uint64_t>(desc.N));
  std::size_t ws_bytes = 0;
  for (const auto& k : kernels)
    if (k && op == Op::Backward)
      ws_bytes = std::max(ws_bytes, backward_workspace_bytes(backward_geometry(*k, desc, {}, dev.sm_count), desc));
  if (ws_bytes) s.workspace = DeviceBuffer(ws_bytes);
  const ForwardTensors ft = s.forward_tensors();
  const BackwardTensors bt = s.backward_tensors();
  auto run = [&](int i, CUstream st) {
    const LoadedKernel& k = *kernels[i];
    if (op == Op::Forward)
      launch_forward(k, desc, ft, dev.sm_count, st);
    else
      launch_backward(k, *fin, desc, bt, backward_geometry(k, desc, grid[i], dev.sm_count), st);
  };
  std::vector<const TensorSpec*> outs;
  for (const auto& t : s.specs)
    if (t.output) outs.push_back(&t);
  auto outputs = [&](int i) {
    s.poison();
    run(i, nullptr);
    std::vector<std::vector<float>> o;
    // Rows are independent, so the first rows (and every vector, dweight
    // included, which sums all rows) tell a wrong config from a right one;
    // converting every row of a large shape for each candidate would make
    // tuning it take minutes.
    for (const TensorSpec* t : outs) o.push_back(s.download(t->name, checked_rows(desc.N)));
    return o;
  };
  // The reference is the heuristic config, or, when the compiler rejected it
  // (spills, say), the simplest candidate that survived.
  int ref_i = static_cast<int>(std::find(grid.begin(), grid.end(), ref_cfg) - grid.begin());
  if (ref_i == total || !kernels[ref_i])
    ref_i = static_cast<int>(std::find_if(kernels.begin(), kernels.end(), [](const auto& k) { return k != nullptr; }) -
                             kernels.begin());
  if (ref_i == total)
    throw Error(ErrorKind::Tuning, "no candidate compiled and fits the device", op_label(op, desc.norm), desc.str());
  const auto ref = outputs(ref_i);

  // 4. Check, then time, every survivor.
  DeviceBuffer flush = make_flush_buffer(dev);
  for (int i = 0; i < total; ++i) {
    auto& ct = res.candidates[i];
    if (!kernels[i]) continue;
    const auto got = outputs(i);
    for (std::size_t j = 0; j < ref.size() && ct.rejected.empty(); ++j)
      ct.rejected = mismatch(got[j], ref[j], outs[j]->dtype, outs[j]->name);
    if (!ct.rejected.empty()) continue;
    ct.median_us = median_us([&](CUstream st) { run(i, st); }, flush);
    report(i + 1, fmt::format("timed {} {:.2f} us", ct.config.str(), ct.median_us));
  }

  // 5. Fastest, with ties going to the simpler config.
  const int w = pick_winner(res.candidates);
  if (w < 0) throw Error(ErrorKind::Tuning, "no candidate passed", op_label(op, desc.norm), desc.str());
  res.winner = res.candidates[w].config;
  res.winner_us = res.candidates[w].median_us;
  return res;
}

}  // namespace normjit::detail
