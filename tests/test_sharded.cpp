// Norms sharded across ranks (ShardedNormDesc, sharded.cuh): what runs
// without a GPU: descriptor and pointer checks, the launch geometry, the
// kernels' compiles for sm_80 and sm_90, the C ABI's descriptor. The GPU
// tests (test_gpu_sharded.cpp) check the numbers against float64.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compile/cubin.hpp"
#include "compile/jit.hpp"
#include "compile/specialization.hpp"
#include "core/parallel.hpp"
#include "normjit/normjit.h"
#include "normjit/normjit.hpp"
#include "runtime/ops.hpp"
#include "test_util.hpp"

using namespace normjit;
using namespace normjit::detail;
using namespace normjit_test;

namespace {

ShardedNormDesc shard_desc(std::int64_t M, std::int64_t N, std::int64_t N_total, NormKind norm = NormKind::RMSNorm,
                           DType t = DType::BF16) {
  ShardedNormDesc d;
  d.norm = norm;
  d.M = M;
  d.N = N;
  d.N_total = N_total;
  d.x_dtype = d.y_dtype = d.weight_dtype = t;
  return d;
}

}  // namespace

TEST_CASE("sharded: ShardedNormDesc::validate names the bad field and its value") {
  CHECK_NOTHROW(shard_desc(8, 2048, 4096).validate());
  CHECK_NOTHROW(shard_desc(0, 1, 1).validate());
  check_invalid([] { shard_desc(-1, 64, 128).validate(); }, {"M = -1"});
  check_invalid([] { shard_desc(8, 0, 128).validate(); }, {"N = 0"});
  check_invalid([] { shard_desc(8, 262145, 524290).validate(); }, {"N = 262145", "262144"});
  check_invalid([] { shard_desc(8, 64, 63).validate(); }, {"N_total = 63", "N = 64"});
  check_invalid([] { shard_desc(std::int64_t{1} << 30, 4096, 8192).validate(); }, {"M = 1073741824", "2^40"});
  ShardedNormDesc d = shard_desc(8, 64, 128);
  d.x_dtype = DType::E4M3;
  check_invalid([&] { d.validate(); }, {"x_dtype = 3", "fp32, fp16 or bf16"});
  d = shard_desc(8, 64, 128);
  d.eps = std::numeric_limits<float>::quiet_NaN();
  check_invalid([&] { d.validate(); }, {"eps = nan"});
  d = shard_desc(8, 64, 128);
  d.has_bias = true;
  check_invalid([&] { d.validate(); }, {"has_bias = true", "LayerNorm only"});
  d = shard_desc(8, 64, 128);
  d.has_weight = false;
  d.weight_offset = 1.f;
  check_invalid([&] { d.validate(); }, {"weight_offset = 1", "has_weight"});
  CHECK(shard_desc(8, 2048, 4096, NormKind::LayerNorm).str() == "ln 8x2048/4096 x=bf16 y=bf16 w=bf16");
}

TEST_CASE("sharded: engine calls name a missing pointer and the op before anything runs") {
  Engine e;  // no GPU needed: descriptors and pointers are checked first
  int dummy = 0;
  void* p = &dummy;
  double* s = reinterpret_cast<double*>(p);
  float* f = reinterpret_cast<float*>(p);
  ShardedNormDesc d = shard_desc(4, 64, 128, NormKind::LayerNorm);
  d.has_bias = true;
  check_invalid([&] { e.sharded_stats(d, nullptr, s, nullptr); }, {"x = null", "ln_shard_fwd", "4x64/128"});
  check_invalid([&] { e.sharded_stats(d, p, nullptr, nullptr); }, {"stats = null"});
  check_invalid([&] { e.sharded_apply(d, p, p, nullptr, s, p, f, f, nullptr); }, {"bias = null", "has_bias"});
  check_invalid([&] { e.sharded_backward_stats(d, p, p, p, nullptr, f, s, nullptr); },
                {"mean = null", "LayerNorm", "ln_shard_bwd"});
  check_invalid([&] { e.sharded_backward_apply(d, p, p, p, f, f, s, p, p, nullptr, p, 64, nullptr); },
                {"dbias = null", "has_bias"});
  d.N_total = 32;
  check_invalid([&] { e.sharded_stats(d, p, s, nullptr); }, {"N_total = 32", "ln_shard_fwd"});
  // M = 0: nothing to do, no pointer needed and no GPU touched.
  CHECK_NOTHROW(e.sharded_stats(shard_desc(0, 64, 128), nullptr, nullptr, nullptr));
}

TEST_CASE("sharded: the launch geometry: widest vectors the operands allow, whole warps, partial rows fixed") {
  alignas(64) static unsigned char buf[256];
  const ShardedNormDesc bf = shard_desc(4096, 4096, 8192);
  ShardGeometry g = shard_geometry(bf, 132, {{buf, DType::BF16}, {buf + 64, DType::BF16}});
  CHECK(g.vec == 8);  // 16 bytes
  CHECK(g.threads == 128);  // 512 chunks: four a thread
  CHECK(g.grid == 132 * 16);
  CHECK(g.programs == 264);
  // An operand 2 bytes off a 16-byte boundary: one element a vector.
  g = shard_geometry(bf, 132, {{buf, DType::BF16}, {buf + 2, DType::BF16}});
  CHECK(g.vec == 1);
  CHECK(g.threads == 1024);
  CHECK(g.programs == 264);  // the workspace does not depend on alignment
  // fp32 anywhere: 4-element vectors; N odd: 1.
  CHECK(shard_geometry(shard_desc(8, 4096, 8192, NormKind::RMSNorm, DType::F32), 132, {{buf, DType::F32}}).vec == 4);
  CHECK(shard_geometry(shard_desc(8, 4097, 8194), 132, {{buf, DType::BF16}}).vec == 1);
  // Few rows: a block a row; small rows still whole warps.
  g = shard_geometry(shard_desc(3, 64, 128), 132, {{buf, DType::BF16}});
  CHECK(g.grid == 3);
  CHECK(g.threads == 64);
  CHECK(g.programs == 3);
  // The workspace: programs x N x (weight, bias) x 4 bytes.
  ShardedNormDesc ln = shard_desc(4096, 1000, 2000, NormKind::LayerNorm);
  ln.has_bias = true;
  CHECK(shard_workspace_bytes(ln, 132) == 264u * 1000 * 2 * 4);
  ln.has_weight = false;
  CHECK(shard_workspace_bytes(ln, 132) == 264u * 1000 * 4);
}

TEST_CASE("sharded: the four kernels compile for sm_80 and sm_90 for every dtype and variant, spilling nothing") {
  std::vector<KernelSpec> specs;
  for (NormKind norm : {NormKind::RMSNorm, NormKind::LayerNorm})
    for (DType t : {DType::F32, DType::F16, DType::BF16})
      for (int variant = 0; variant < 3; ++variant) {
        ShardedNormDesc d = shard_desc(64, 2048, 8192, norm, t);
        d.y_dtype = t == DType::F32 ? DType::BF16 : t;  // mixed x and y too
        d.weight_dtype = variant == 1 ? DType::F32 : t;
        if (variant == 2) {
          d.has_weight = norm == NormKind::RMSNorm;  // LayerNorm: bias without weight
          d.has_bias = norm == NormKind::LayerNorm;
        } else if (norm == NormKind::LayerNorm) {
          d.has_bias = true;
        }
        if (variant == 1 && d.has_weight) d.weight_offset = 1.f;
        for (int vec : {1, 16 / dtype_size(t)}) specs.push_back(sharded_spec(d, vec, vec == 1 ? 1024 : 64));
      }
  // A wide shard: 131072 columns in 1024 threads of 8 (16 chunks a thread).
  specs.push_back(sharded_spec(shard_desc(8, 131072, 262144), 8, 1024));
  std::vector<std::string> failures(specs.size() * 2);
  parallel_for(static_cast<int>(failures.size()), [&](int i) {
    const KernelSpec& s = specs[i / 2];
    const std::string arch = i % 2 ? "sm_90" : "sm_80";
    try {
      const KernelBinary b = compile_spec(s, arch, "");
      for (ShardKernel k :
           {ShardKernel::Stats, ShardKernel::Apply, ShardKernel::BackwardStats, ShardKernel::BackwardApply})
        if (const std::string why = cubin_problem(b.cubin, shard_kernel_name(k)); !why.empty())
          failures[i] = fmt::format("{} {}: {}", s.name(), arch, why);
      const CubinResources r = cubin_resources(b.cubin);
      if (r.frame_bytes != 0) failures[i] = fmt::format("{} {}: a {}-byte stack frame", s.name(), arch, r.frame_bytes);
    } catch (const std::exception& e) {
      failures[i] = fmt::format("{} {}: {}", s.name(), arch, e.what());
    }
  });
  for (const auto& f : failures) CHECK_MESSAGE(f.empty(), f);
  // Names are unique per spec (they key the cubin cache).
  CHECK(specs[0].name() == "shard.rms.x=fp32.y=bf16.w=fp32.N2048.v1.t1024");
  CHECK(specs[0].source().find("#include \"sharded.cuh\"") != std::string::npos);
}

TEST_CASE("sharded: the C ABI's descriptor: defaults, and bad fields named") {
  normjit_sharded_desc c;
  REQUIRE(normjit_sharded_desc_init(&c) == NORMJIT_SUCCESS);
  CHECK(c.struct_size == sizeof(normjit_sharded_desc));
  CHECK(c.norm == NORMJIT_NORM_RMS);
  CHECK(c.has_weight == 1);
  CHECK(c.has_bias == 0);
  CHECK(c.eps == doctest::Approx(1e-6f));
  normjit_engine e = nullptr;
  normjit_engine_options o;
  REQUIRE(normjit_engine_options_init(&o) == NORMJIT_SUCCESS);
  REQUIRE(normjit_engine_create(&o, &e) == NORMJIT_SUCCESS);
  c.M = 4;
  c.N = 64;
  c.N_total = 128;
  int dummy = 0;
  double stats[8];
  c.x_dtype = 9;
  CHECK(normjit_sharded_stats(e, &c, &dummy, stats, nullptr) == NORMJIT_INVALID_ARGUMENT);
  CHECK(contains(normjit_last_error_message(), "x_dtype = 9"));
  c.x_dtype = NORMJIT_BF16;
  c.struct_size = 3;
  CHECK(normjit_sharded_stats(e, &c, &dummy, stats, nullptr) == NORMJIT_INVALID_ARGUMENT);
  CHECK(contains(normjit_last_error_message(), "normjit_sharded_desc_init"));
  c.struct_size = sizeof(normjit_sharded_desc);
  CHECK(normjit_sharded_stats(e, &c, nullptr, stats, nullptr) == NORMJIT_INVALID_ARGUMENT);
  CHECK(contains(normjit_last_error_message(), "x = null"));
  size_t bytes = 0;
  CHECK(normjit_sharded_backward_workspace_size(e, &c, nullptr) == NORMJIT_INVALID_ARGUMENT);
  c.M = 0;
  CHECK(normjit_sharded_backward_workspace_size(e, &c, &bytes) == NORMJIT_SUCCESS);
  CHECK(bytes == 0);
  normjit_engine_destroy(e);
}
