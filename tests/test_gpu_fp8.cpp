// FP8 on the GPU against the float64 reference: every quantized-output
// granularity and FP8 input of fp8_variants (forward; the backward of FP8
// inputs), all-zero rows, NaN inputs and saturation; the transposed output
// bit for bit; every autotune candidate of FP8 shapes (of decode rows, those
// split over clusters).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "tuning/check.hpp"
#include "config/config_grid.hpp"
#include "gpu_harness.hpp"
#include "runtime/ops.hpp"
#include "core/shape_spec.hpp"
#include "test_util.hpp"

using namespace normjit;
using namespace normjit::test;

namespace {

Engine& fp8_engine() {
  current_device();
  static Engine e(suite_engine_options("fp8"));
  return e;
}

// Writes `v` into every element of row `row` (or element `col` only) of input `name`.
void set_input(const Scratch& s, const std::string& name, std::int64_t row, float v, std::int64_t col = -1) {
  const TensorSpec& t = *std::find_if(s.specs.begin(), s.specs.end(), [&](const TensorSpec& x) { return x.name == name; });
  const int es = dtype_size(t.dtype);
  std::vector<unsigned char> bytes(static_cast<std::size_t>(t.cols) * es);
  for (std::int64_t j = 0; j < t.cols; ++j) store_as(t.dtype, bytes.data(), j, v);
  const std::int64_t j0 = col < 0 ? 0 : col, n = col < 0 ? t.cols : 1;
  NJ_CU(cuMemcpyHtoD(s.buf.at(name).get() + (t.offset(row) + j0) * es, bytes.data() + j0 * es, n * es));
}

void run_forward(Engine& e, const NormDesc& d, Scratch& s) {
  s.poison();
  e.forward(d, s.forward_tensors(), nullptr);
}

}  // namespace

GPU_TEST_CASE("fp8: every quantized output and FP8 input matches float64 (forward, and the FP8-input backward)" *
              doctest::test_suite("quick")) {
  // A usual row (register cache), a row over 2 x 4096 elements of several
  // groups per thread, a decode row, and a two-pass row (LayerNorm's with
  // its own variance path); odd N (rows peeled: vectors inside, edges one
  // element at a time) in registers, at decode (q transposed by the row
  // kernel) and in two passes.
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{64, 4096}, {33, 7168},  {1, 2048},
                                                          {4, 131072}, {37, 5111}, {3, 2881}, {2, 131071}};
  {
    std::vector<Call> calls;
    for (auto [M, N] : shapes)
      for (DType t : {DType::BF16, DType::F16})
        for (const auto& v : normjit_test::fp8_variants(M, N, t)) {
          if (t == DType::F16 && N != 4096) continue;
          calls.push_back({Op::Forward, v.desc});
          if (is_fp8(v.desc.x_dtype) && !v.desc.residual) calls.push_back({Op::Backward, v.desc});
        }
    precompile_calls(fp8_engine(), calls);
  }
  for (auto [M, N] : shapes)
    for (DType t : {DType::BF16, DType::F16})
      for (const auto& v : normjit_test::fp8_variants(M, N, t)) {
        if (t == DType::F16 && N != 4096) continue;  // fp16 on one shape
        const std::uint64_t seed = fresh_seed();
        CAPTURE(v.name);
        CAPTURE(seed);
        const NormDesc& d = v.desc;
        Scratch s(Op::Forward, d, seed);
        run_forward(fp8_engine(), d, s);
        for (const auto& c : check_outputs(Op::Forward, d, s)) {
          CAPTURE(c.name);
          CHECK(c.err <= c.tol);
        }
        // An all-zero row, a NaN in another: every output still matches
        // (amax ignores NaN; a zero row gets the minimum scale and q = 0;
        // the NaN row's y, rstd, mean are NaN where the reference's are).
        if (M >= 2 && !d.residual) {
          set_input(s, "x", 0, 0.f);
          set_input(s, "x", M - 1, NAN, 3);
          run_forward(fp8_engine(), d, s);
          for (const auto& c : check_outputs(Op::Forward, d, s)) {
            CAPTURE(c.name);
            CHECK(c.err <= c.tol);
          }
        }
        if (d.store_y_t) {  // the transpose of q, bit for bit
          const auto q = s.download("y"), qt = s.download("y_t");
          std::int64_t differ = 0;
          for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j)
              differ += std::memcmp(&q[i * N + j], &qt[j * M + i], sizeof(float)) != 0;
          CHECK(differ == 0);
        }
        if (is_fp8(d.x_dtype) && !d.residual) {
          Scratch b(Op::Backward, d, seed + 1);
          const std::size_t ws = fp8_engine().backward_workspace_size(d);
          if (ws) b.workspace = DeviceBuffer(ws);
          b.poison();
          fp8_engine().backward(d, b.backward_tensors(), nullptr);
          for (const auto& c : check_outputs(Op::Backward, d, b)) {
            CAPTURE(c.name);
            CHECK(c.err <= c.tol);
          }
        }
      }
}

GPU_TEST_CASE("fp8: values past the FP8 range saturate; an upper bound on the per-token scale saturates too") {
  for (const char* spec : {"rms:bf16:64x4096:quant=e4m3/tensor-static", "rms:bf16:64x4096:quant=e5m2/token:ub=0.00001"}) {
    CAPTURE(spec);
    const NormDesc d = detail::parse_shape_spec(spec).desc;
    Scratch s(Op::Forward, d, fresh_seed());
    if (d.quant == QuantScaling::TensorStatic) set_input(s, "y_scale", 0, 1e-3f);  // |y| / scale up to ~4000 > 448
    run_forward(fp8_engine(), d, s);
    const auto q = s.download("y");
    const float fmax = fp8_max(d.y_dtype);
    int at_max = 0;
    for (float v : q) at_max += std::fabs(v) == fmax;
    CHECK(at_max > 0);
    for (const auto& c : check_outputs(Op::Forward, d, s)) {
      CAPTURE(c.name);
      CHECK(c.err <= c.tol);
    }
  }
}

GPU_TEST_CASE("fp8: every autotune candidate of FP8 shapes matches float64 (of decode rows, every cluster one)") {
  const DeviceInfo dev = device_info(current_device());
  KernelCache jit(suite_kernel_dir());
  // The whole grid of two shapes; of three decode rows, the candidates that
  // split a row over a cluster: token rows (RMSNorm's amax measured after
  // rstd with the Llama cast and exchanged apart; LayerNorm's) and tensor
  // scaling in two launches.
  const std::pair<const char*, bool> specs[] = {{"rms:bf16:160x7168:quant=e4m3/group128:colmajor", false},
                                                {"ln:bf16:61x4096:x=e4m3/group16:quant=e4m3/tensor:transpose", false},
                                                {"rms:bf16:5x16384:quant=e4m3/token:cast=llama", true},
                                                {"ln:bf16:3x12288:quant=e5m2/token:nb", true},
                                                {"rms:bf16:6x16384:quant=e4m3/tensor:yhp", true}};
  auto taken = [](const LaunchConfig& c, bool clusters_only) { return !clusters_only || c.cluster > 1; };
  {
    std::vector<KernelSpec> ks;
    for (const auto& [spec, clusters_only] : specs) {
      const NormDesc d = detail::parse_shape_spec(spec).desc;
      for (Op op : {Op::Forward, Op::Backward})
        if (op == Op::Forward || is_fp8(d.x_dtype))
          for (auto& k : grid_specs(op, d, dev.max_cluster))
            if (taken(k.cfg, clusters_only)) ks.push_back(std::move(k));
    }
    compile_all(ks);
  }
  for (const auto& [spec_text, clusters_only] : specs) {
    const std::string spec = spec_text;
    const NormDesc d = detail::parse_shape_spec(spec).desc;
    CAPTURE(spec);
    for (Op op : {Op::Forward, Op::Backward}) {
      if (op == Op::Backward && !is_fp8(d.x_dtype)) continue;
      Scratch s(op, d, fresh_seed());
      const Reference ref = reference_outputs(op, d, s);
      int ran = 0, one_cluster = 0;
      for (const auto& cfg : candidate_grid(op, d, dev.max_cluster)) {
        if (!taken(cfg, clusters_only)) continue;
        CAPTURE(cfg.str());
        if (!launch_candidate(jit, dev, op, d, cfg, s)) continue;  // pruned, as the tuner prunes it
        ++ran;
        // Tensor scaling whose row groups one cluster holds: one launch,
        // the cluster's CTAs agreeing on amax through DSMEM.
        const std::int64_t groups = (d.M + cfg.rows_per_pid - 1) / cfg.rows_per_pid;
        one_cluster +=
            op == Op::Forward && d.quant == QuantScaling::Tensor && cfg.cluster <= 1 && groups > 1 && groups <= 16;
        for (const auto& c : compare_outputs(s, ref)) {
          CAPTURE(c.name);
          CHECK(c.err <= c.tol);
        }
      }
      MESSAGE(fmt::format("{} {}: {} candidates checked, {} of them tensor scaling in one cluster", spec,
                          op_name(op), ran, one_cluster));
      CHECK(ran > 1);
      if (op == Op::Forward && d.quant == QuantScaling::Tensor && !clusters_only && dev.max_cluster >= 16)
        CHECK(one_cluster > 0);
    }
  }
}
