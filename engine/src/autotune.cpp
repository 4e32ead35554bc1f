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

namespace {

DeviceBuffer random_buffer(DType t, std::int64_t rows, std::int64_t ld, std::int64_t N, float lo, float hi,
                           std::uint64_t seed) {
  const std::size_t n = static_cast<std::size_t>(rows > 0 ? (rows - 1) * ld + N : 0);
  std::vector<unsigned char> host(n * dtype_size(t));
  Random rng(seed);
  for (std::size_t i = 0; i < n; ++i) store_as(t, host.data(), i, rng.uniform(lo, hi));
  DeviceBuffer b(std::max<std::size_t>(host.size(), 16));
  if (!host.empty()) NJ_CU(cuMemcpyHtoD(b.get(), host.data(), host.size()));
  return b;
}

std::size_t tensor_bytes(DType t, std::int64_t rows, std::int64_t ld, std::int64_t N) {
  return std::max<std::size_t>(16, static_cast<std::size_t>(rows > 0 ? (rows - 1) * ld + N : 0) * dtype_size(t));
}

std::vector<float> download(const DeviceBuffer& b, DType t, std::size_t n) {
  std::vector<unsigned char> raw(n * dtype_size(t));
  NJ_CU(cuCtxSynchronize());
  if (n) NJ_CU(cuMemcpyDtoH(raw.data(), b.get(), raw.size()));
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = load_as(t, raw.data(), i);
  return out;
}

// Candidate outputs against the reference config's: a few roundings apart at
// most (reduction order differs between configs); NaN (poison) never passes.
std::string mismatch(const std::vector<float>& got, const std::vector<float>& ref, DType t, const char* what) {
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

}  // namespace

Scratch::Scratch(Op op, const NormDesc& d, std::uint64_t seed) {
  x = random_buffer(d.x_dtype, d.M, d.x_ld(), d.N, -2.f, 2.f, seed);
  w = random_buffer(d.weight_dtype, 1, d.N, d.N, 0.5f, 1.5f, seed + 1);
  if (op == Op::RmsForward) {
    y = DeviceBuffer(tensor_bytes(d.y_dtype, d.M, d.y_ld(), d.N));
    rstd = DeviceBuffer(std::max<std::size_t>(16, d.M * sizeof(float)));
  } else {
    dy = random_buffer(d.y_dtype, d.M, d.dy_ld(), d.N, -1.f, 1.f, seed + 2);
    rstd = random_buffer(DType::F32, 1, d.M, d.M, 0.5f, 1.0f, seed + 3);
    dx = DeviceBuffer(tensor_bytes(d.x_dtype, d.M, d.dx_ld(), d.N));
    dw = DeviceBuffer(tensor_bytes(d.weight_dtype, 1, d.N, d.N));
  }
}

void Scratch::poison(Op op, const NormDesc&) const {
  for (const DeviceBuffer* b : op == Op::RmsForward ? std::vector<const DeviceBuffer*>{&y, &rstd}
                                                    : std::vector<const DeviceBuffer*>{&dx, &dw})
    NJ_CU(cuMemsetD8Async(b->get(), 0xff, b->bytes(), nullptr));
}

TuneResult autotune(Op op, const NormDesc& desc, const DeviceInfo& dev, KernelCache& jit,
                    const ProgressFn& progress) {
  TuneResult res;
  res.shape_key = shape_key(op, desc);
  const std::vector<LaunchConfig> grid = candidate_grid(op, desc);
  const LaunchConfig ref_cfg = heuristic_config(op, desc);
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
  const auto fin = op == Op::RmsBackward ? jit.get(finalize_spec(desc), dev.arch()) : nullptr;

  // 3. The reference config's outputs on random data.
  Scratch s(op, desc, 0x5eed0000u + static_cast<std::uint64_t>(desc.N));
  std::size_t ws_bytes = 16;
  for (const auto& k : kernels)
    if (k && op == Op::RmsBackward)
      ws_bytes = std::max(ws_bytes, backward_workspace_bytes(backward_geometry(*k, desc, {}, dev.sm_count), desc));
  s.workspace = DeviceBuffer(ws_bytes);
  auto run = [&](int i, CUstream st) {
    const LoadedKernel& k = *kernels[i];
    if (op == Op::RmsForward)
      launch_forward(k, desc, {s.x.get(), s.w.get(), s.y.get(), desc.store_rstd ? s.rstd.get() : 0}, dev.sm_count, st);
    else
      launch_backward(k, *fin, desc, {s.dy.get(), s.x.get(), s.w.get(), s.rstd.get(), s.dx.get(), s.dw.get(), s.workspace.get()},
                      backward_geometry(k, desc, grid[i], dev.sm_count), st);
  };
  const DType out_t = op == Op::RmsForward ? desc.y_dtype : desc.x_dtype;
  const DeviceBuffer& out = op == Op::RmsForward ? s.y : s.dx;
  const std::size_t out_n = static_cast<std::size_t>(
      desc.M > 0 ? (desc.M - 1) * (op == Op::RmsForward ? desc.y_ld() : desc.dx_ld()) + desc.N : 0);
  auto outputs = [&](int i) {
    s.poison(op, desc);
    run(i, nullptr);
    std::vector<std::vector<float>> o{download(out, out_t, out_n)};
    if (op == Op::RmsForward && desc.store_rstd) o.push_back(download(s.rstd, DType::F32, desc.M));
    if (op == Op::RmsBackward) o.push_back(download(s.dw, desc.weight_dtype, desc.N));
    // Padding between rows of a strided output is not written: compare rows only.
    if (desc.M > 0) {
      const std::int64_t ld = op == Op::RmsForward ? desc.y_ld() : desc.dx_ld();
      std::vector<float> rows;
      rows.reserve(desc.M * desc.N);
      for (std::int64_t r = 0; r < desc.M; ++r)
        rows.insert(rows.end(), o[0].begin() + r * ld, o[0].begin() + r * ld + desc.N);
      o[0] = std::move(rows);
    }
    return o;
  };
  // The reference is the heuristic config, or, when the compiler rejected it
  // (spills, say), the simplest candidate that survived.
  int ref_i = static_cast<int>(std::find(grid.begin(), grid.end(), ref_cfg) - grid.begin());
  if (ref_i == total || !kernels[ref_i])
    ref_i = static_cast<int>(std::find_if(kernels.begin(), kernels.end(), [](const auto& k) { return k != nullptr; }) -
                             kernels.begin());
  if (ref_i == total)
    throw Error(ErrorKind::Tuning, "no candidate compiled and fits the device", op_name(op), desc.str());
  const auto ref = outputs(ref_i);

  // 4. Check, then time, every survivor.
  DeviceBuffer flush = make_flush_buffer(dev);
  for (int i = 0; i < total; ++i) {
    auto& ct = res.candidates[i];
    if (!kernels[i]) continue;
    const auto got = outputs(i);
    const char* names[] = {op == Op::RmsForward ? "y" : "dx", op == Op::RmsForward ? "rstd" : "dweight"};
    const DType types[] = {out_t, op == Op::RmsForward ? DType::F32 : desc.weight_dtype};
    for (std::size_t j = 0; j < ref.size() && ct.rejected.empty(); ++j)
      ct.rejected = mismatch(got[j], ref[j], types[j], names[j]);
    if (!ct.rejected.empty()) continue;
    ct.median_us = median_us([&](CUstream st) { run(i, st); }, flush);
    report(i + 1, fmt::format("timed {} {:.2f} us", ct.config.str(), ct.median_us));
  }

  // 5. Fastest, with ties going to the simpler config.
  const int w = pick_winner(res.candidates);
  if (w < 0) throw Error(ErrorKind::Tuning, "no candidate passed", op_name(op), desc.str());
  res.winner = res.candidates[w].config;
  res.winner_us = res.candidates[w].median_us;
  return res;
}

}  // namespace normjit::detail
