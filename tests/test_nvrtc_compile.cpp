// NVRTC (no GPU needed): every grid variant compiles for sm_80 and sm_90, the
// generated sources, the binary-cache key, the on-disk kernel cache and
// CompileError.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "tuning/autotune.hpp"
#include "config/config_grid.hpp"
#include "config/row_budget.hpp"
#include "compile/cubin.hpp"
#include "compile/jit.hpp"
#include "compile/nvrtc.hpp"
#include "compile/specialization.hpp"
#include "test_util.hpp"
#include "core/parallel.hpp"
#include "core/shape_spec.hpp"
#include "core/variant.hpp"

using namespace normjit;
using namespace normjit::detail;
namespace fs = std::filesystem;

using namespace normjit_test;  // shared helpers (test_util.hpp)

namespace {

bool is_elf(const std::string& bytes) { return bytes.size() > 4 && bytes.compare(0, 4, "\x7f" "ELF") == 0; }

std::string read_binary(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every spec the engine can ask for on `descs`: both ops' whole grids and the
// backward's finalize kernel, without repeats.
std::vector<KernelSpec> every_spec(const std::vector<NormDesc>& descs) {
  std::vector<KernelSpec> specs;
  std::set<std::string> seen;
  auto add = [&](const KernelSpec& s) {
    if (seen.insert(s.name()).second) specs.push_back(s);
  };
  for (const auto& d : descs) {
    for (Op op : {Op::Forward, Op::Backward})
      for (const auto& cfg : candidate_grid(op, d)) add(make_spec(op, d, cfg));
    add(finalize_spec(d));
  }
  return specs;
}

void check_contains_all(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& part : parts) CHECK_MESSAGE(contains(text, part), "lacks '" << part << "' in:\n" << text);
}

// A forward kernel compiled to hold spec.min_blocks CTAs an SM: "" when its
// registers fit them and nothing spilled (no stack frame), else why not.
std::string min_blocks_problem(const KernelSpec& spec, const std::string& cubin) {
  if (spec.kind != KernelKind::Forward || spec.min_blocks <= 1) return {};
  const CubinResources r = cubin_resources(cubin);
  const int cap = 65536 / (spec.min_blocks * spec.threads());
  if (r.regs < 0 || r.frame_bytes < 0) return "no register count or frame size in the cubin";
  if (r.regs > cap || r.frame_bytes > 0)
    return fmt::format("min blocks {}: {} registers (cap {}), a {}-byte stack frame (spilled)", spec.min_blocks,
                       r.regs, cap, r.frame_bytes);
  return {};
}

// Compiles `specs` for sm_90 on every core; each must give a cubin, and a
// forward one its min blocks without spilling.
void check_compiles_for_sm90(const std::vector<KernelSpec>& specs) {
  std::vector<std::string> failures(specs.size());
  parallel_for(static_cast<int>(specs.size()), [&](int i) {
    try {
      const std::string cubin = compile_spec(specs[i], "sm_90", "").cubin;
      if (!is_elf(cubin)) failures[i] = "not an ELF file";
      else failures[i] = min_blocks_problem(specs[i], cubin);
    } catch (const Error& e) {
      failures[i] = e.what();
    }
  });
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].name());
    CHECK_MESSAGE(failures[i].empty(), failures[i]);
  }
}

KernelSpec bf16_4096_fwd() {
  return make_spec(Op::Forward, make_desc(8192, 4096), LaunchConfig::parse("v8.t512.r1"));
}

}  // namespace

TEST_CASE("nvrtc: every variant compiles for sm_80 and sm_90") {
  const std::vector<NormDesc> descs = {
      make_desc(8192, 128),
      make_desc(8192, 4096),
      make_desc(8192, 4096, DType::F32, DType::F32),
      make_desc(8192, 1000, DType::F16, DType::F32),
      make_desc(8192, 7, DType::F32, DType::F32),
      make_desc(64, 262144),
      make_desc(600000, 4096),  // M * N > 2^31: 64-bit offsets
  };
  const auto specs = every_spec(descs);
  CHECK(std::count_if(specs.begin(), specs.end(), [](const KernelSpec& s) { return s.index64; }) > 0);
  CHECK(std::count_if(specs.begin(), specs.end(), [](const KernelSpec& s) { return s.cfg.two_pass; }) > 0);
  CHECK(std::count_if(specs.begin(), specs.end(),
                      [](const KernelSpec& s) { return s.kind == KernelKind::DweightFinalize; }) == 2);

  const std::string archs[] = {"sm_80", "sm_90"};
  const int jobs = static_cast<int>(specs.size()) * 2;
  std::vector<std::string> failures(jobs);  // filled by the workers, checked here
  const auto start = std::chrono::steady_clock::now();
  parallel_for(jobs, [&](int i) {
    const KernelSpec& spec = specs[i / 2];
    const std::string& arch = archs[i % 2];
    try {
      const KernelBinary b = compile_spec(spec, arch, "");
      if (!is_elf(b.cubin)) failures[i] = "not an ELF file";
      else if (b.from_disk || b.arch != arch) failures[i] = "wrong from_disk or arch";
      else if (arch == "sm_90") failures[i] = min_blocks_problem(spec, b.cubin);
    } catch (const Error& e) {
      failures[i] = e.what();
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE(fmt::format("compiled {} variants ({} specs x 2 archs) in {:.1f} s", jobs, specs.size(), seconds));
  for (int i = 0; i < jobs; ++i) {
    CAPTURE(specs[i / 2].name());
    CAPTURE(archs[i % 2]);
    CHECK_MESSAGE(failures[i].empty(), failures[i]);
  }
}

TEST_CASE("nvrtc: peeled rows compile on every kernel path") {
  // Odd N: rows start anywhere in a vector. Registers (one and several rows
  // per program), a cluster's slices, two-pass; RMSNorm and LayerNorm, a
  // fused residual add, 3-D rows.
  std::vector<KernelSpec> specs;
  std::set<std::string> seen;
  auto add = [&](const NormDesc& d, const char* text) {
    LaunchConfig c = LaunchConfig::parse(text);
    c.vec = std::min(c.vec, max_vec(Op::Forward, d));  // wider dtypes: 16 bytes at most
    if (!config_valid(Op::Forward, d, c, nullptr, kMaxCluster) || !peeled(Op::Forward, d, c.vec)) return;
    if (KernelSpec s = make_spec(Op::Forward, d, c); seen.insert(s.name()).second) specs.push_back(s);
  };
  for (const auto& v : norm_variants(4096, 12345, DType::BF16))
    for (const char* c : {"v8.t256.r1", "v8.t512.r1.c4"}) add(v.desc, c);
  for (const auto& v : norm_variants(64, 100003, DType::BF16)) add(v.desc, "v8.t1024.r1.2p");
  add(make_desc(8192, 77, DType::F16), "v8.t16.r4");
  add(make_desc(8192, 77, DType::F32), "v4.t32.r1");
  // A cluster's packed slices of 5 and 7 chunks a thread (the edges
  // included): LayerNorm's four CTAs of 256 an SM at both, RMSNorm's at 5
  // and three at 7; each unspilled (check_compiles_for_sm90).
  for (const auto& [N, ln, blocks] : {std::tuple{98305, true, 4}, std::tuple{98305, false, 3},
                                      std::tuple{65537, true, 4}, std::tuple{65537, false, 4}}) {
    NormDesc d = make_desc(3000, N);
    if (ln) d.norm = NormKind::LayerNorm, d.has_bias = true;
    const KernelSpec k = make_spec(Op::Forward, d, LaunchConfig::parse("v8.t256.r1.c8"));
    CHECK(k.peel);
    CHECK(k.min_blocks == blocks);
    if (seen.insert(k.name()).second) specs.push_back(k);
  }
  const std::size_t unquantized = specs.size();
  // Quantized y scaled by the row or the tensor: registers (q transposed by
  // the row kernel at decode, by its own launch past it) and two-pass.
  for (auto [M, N, c] : {std::tuple{4096, 12345, "v8.t256.r1"}, std::tuple{3, 2881, "v8.t128.r1"},
                         std::tuple{2, 100003, "v8.t1024.r1.2p"}})
    for (const auto& v : fp8_variants(M, N, DType::BF16))
      if (v.desc.quant != QuantScaling::None) add(v.desc, c);
  MESSAGE(fmt::format("{} peeled specs, {} quantized", specs.size(), specs.size() - unquantized));
  CHECK(specs.size() - unquantized >= 20);
  CHECK(specs.size() >= 40);
  CHECK(std::all_of(specs.begin(), specs.end(), [](const KernelSpec& k) { return k.peel; }));
  check_compiles_for_sm90(specs);
}

TEST_CASE("nvrtc: backward clusters compile: slices streamed twice, and a grid of one cluster") {
  // Two-pass cluster slices (fp32 rows no cluster holds); a grid of one
  // cluster summing dweight / dbias through DSMEM: register and staged rows,
  // row groups; RMSNorm and LayerNorm (weight and bias, bias only), odd N.
  std::vector<KernelSpec> specs;
  std::set<std::string> seen;
  int two_pass = 0, dc = 0;
  // One config of each path a variant's grid offers (its first).
  auto add = [&](const NormDesc& d, const LaunchConfig& c, int& count) {
    const std::string path = fmt::format("{}.c{}.s{}.r{}.{}", make_variant(Op::Backward, d).tags(KernelKind::Backward),
                                         c.cluster, c.stages > 0, c.rows_per_pid > 1, d.N);
    if (seen.insert(path).second) specs.push_back(make_spec(Op::Backward, d, c)), ++count;
  };
  for (const auto& v : norm_variants(4, 234232, DType::F32))
    for (const auto& c : candidate_grid(Op::Backward, v.desc, kMaxCluster))
      if (c.cluster > 1 && c.two_pass && c.threads_per_row == 1024) add(v.desc, c, two_pass);
  for (std::int64_t N : {4096, 5001})
    for (const auto& v : norm_variants(8, N, DType::BF16))
      for (const auto& c : candidate_grid(Op::Backward, v.desc, kMaxCluster))
        if (c.dw_cluster && c.cluster == 4) add(v.desc, c, dc);
  MESSAGE(fmt::format("{} two-pass cluster specs, {} dw_cluster specs", two_pass, dc));
  CHECK(two_pass >= 4);
  CHECK(dc >= 12);
  check_compiles_for_sm90(specs);
}

TEST_CASE("nvrtc: every norm-family variant compiles for sm_90") {
  // LayerNorm, residual add, no weight / bias, offsets, casting modes, mixed
  // dtypes and 3-D rows, on a narrow (many rows per program), a usual, a
  // shared-memory-dweight and a two-pass row width.
  // Every 48th config of each grid (the grids differ in their kernel paths
  // by vec, tpr, rows, stages) and the heuristic one: the whole set takes
  // minutes; the GPU tests run the rest.
  std::vector<KernelSpec> specs;
  std::set<std::string> seen;
  for (auto [M, N, t] : {std::tuple{8192, 128, DType::BF16}, std::tuple{8192, 4096, DType::F16},
                         std::tuple{4096, 12288, DType::BF16}, std::tuple{64, 65536, DType::F32}})
    for (const auto& v : norm_variants(M, N, t))
      for (Op op : {Op::Forward, Op::Backward}) {
        const auto grid = candidate_grid(op, v.desc);
        for (std::size_t i = 0; i < grid.size(); ++i)
          if (i % 48 == 0 || grid[i] == heuristic_config(op, v.desc, normjit_test::test_facts(1)))
            if (KernelSpec s = make_spec(op, v.desc, grid[i]); seen.insert(s.name()).second) specs.push_back(s);
      }
  MESSAGE(fmt::format("{} variant specs", specs.size()));
  check_compiles_for_sm90(specs);
}

TEST_CASE("nvrtc: every FP8 variant compiles for sm_80 (software conversions), sm_89 and sm_90") {
  // The heuristic config and the grid's extremes (first and last: narrow
  // vectors, many threads, two-pass) of both ops, on a register row and a
  // two-pass row.
  std::vector<KernelSpec> specs;
  std::set<std::string> seen;
  for (auto [M, N] : {std::pair{4096, 4096}, std::pair{64, 131072}})
    for (const auto& v : fp8_variants(M, N, DType::BF16))
      for (Op op : {Op::Forward, Op::Backward}) {
        if (op == Op::Backward && !is_fp8(v.desc.x_dtype)) continue;  // the backward of a quantized y is not FP8
        const auto grid = candidate_grid(op, v.desc, 8);
        REQUIRE_MESSAGE(!grid.empty(), v.name);
        for (const auto& cfg : {grid.front(), grid.back(), heuristic_config(op, v.desc, normjit_test::test_facts(8))})
          if (KernelSpec s = make_spec(op, v.desc, cfg); seen.insert(s.name()).second) specs.push_back(s);
      }
  // Quantized rows split over a cluster (decode rows of 16K), every variant
  // (tensor scaling's without the one-launch kernel: its clusters are row groups).
  for (const auto& v : fp8_variants(4, 16384, DType::BF16)) {
    const LaunchConfig c = LaunchConfig::parse("v8.t256.r1.c8");
    if (v.desc.quant == QuantScaling::None) continue;
    CAPTURE(v.name);
    REQUIRE(config_valid(Op::Forward, v.desc, c, nullptr, 8));
    KernelSpec s = make_spec(Op::Forward, v.desc, c);
    CHECK(s.once_kernel_name() == nullptr);
    if (seen.insert(s.name()).second) specs.push_back(s);
  }
  CHECK(std::count_if(specs.begin(), specs.end(), [](const KernelSpec& s) { return s.cfg.cluster > 1; }) >= 20);
  CHECK(std::count_if(specs.begin(), specs.end(), [](const KernelSpec& s) { return s.cfg.two_pass; }) > 0);
  const std::string archs[] = {"sm_80", "sm_89", "sm_90"};
  const int jobs = static_cast<int>(specs.size()) * 3;
  std::vector<std::string> failures(jobs);
  parallel_for(jobs, [&](int i) {
    if (specs[i / 3].cfg.cluster > 1 && archs[i % 3] != "sm_90") return;  // clusters are sm_90+
    try {
      const std::string cubin = compile_spec(specs[i / 3], archs[i % 3], "").cubin;
      if (!is_elf(cubin)) failures[i] = "not an ELF file";
      // The module's other kernels: q transposed, tensor scaling in one program.
      for (const char* k : {specs[i / 3].transpose_kernel_name(), specs[i / 3].once_kernel_name()})
        if (k && cubin.find(k) == std::string::npos) failures[i] = fmt::format("no {} in the cubin", k);
    } catch (const Error& e) {
      failures[i] = e.what();
    }
  });
  CHECK(std::count_if(specs.begin(), specs.end(), [](const KernelSpec& s) { return s.transpose_kernel_name(); }) > 0);
  CHECK(std::count_if(specs.begin(), specs.end(), [](const KernelSpec& s) { return s.once_kernel_name(); }) > 0);
  MESSAGE(fmt::format("{} FP8 specs x 3 archs", specs.size()));
  for (int i = 0; i < jobs; ++i) {
    CAPTURE(specs[i / 3].name());
    CAPTURE(archs[i % 3]);
    CHECK_MESSAGE(failures[i].empty(), failures[i]);
  }
}

TEST_CASE("nvrtc: FP8 rows keep u only where an SM holds two CTAs, bounded to them, and spill nothing") {
  // Every config of two register-row grids: where keeps_u_rows, the prelude
  // says KEEP_U and its launch bounds hold two or more CTAs an SM within
  // the registers ptxas used, with no stack frame (the schedulers' quarter
  // of the register file counted: 9 CTAs of 64 threads spilled a group128
  // row of 4096).
  std::vector<KernelSpec> kept;
  int declined = 0;
  for (const char* spec : {"rms:bf16:8192x4096:quant=e4m3/group128", "rms:bf16:8192x7168:quant=e4m3/token:res",
                           "rms:bf16:8192x4096:quant=e5m2/mx32:yhp"}) {
    const NormDesc d = parse_shape_spec(spec).desc;
    for (const auto& cfg : candidate_grid(Op::Forward, d, 8)) {
      const KernelSpec s = make_spec(Op::Forward, d, cfg);
      const bool keep = keeps_u_rows(s.v, s.cfg, static_cast<int>(s.N), s.peel);
      CAPTURE(s.name());
      CHECK(contains(s.source(), "KEEP_U") == keep);
      if (keep) {
        CHECK(s.min_blocks >= 2);
        kept.push_back(s);
      } else if (!cfg.two_pass && !cfg.stages) {
        ++declined;
      }
    }
  }
  CHECK(kept.size() >= 20);
  CHECK(declined > 0);  // 1024-thread rows, at least
  // A 512-thread token row of 16384 would hold one CTA an SM keeping u (74
  // registers): it keeps x and w instead; 256 threads keep u, two CTAs.
  const NormDesc t = parse_shape_spec("rms:bf16:4096x16384:quant=e4m3/token").desc;
  CHECK_FALSE(keeps_u_rows(make_variant(Op::Forward, t), LaunchConfig::parse("v8.t512.r1"), 16384, false));
  CHECK(keeps_u_rows(make_variant(Op::Forward, t), LaunchConfig::parse("v8.t256.r1"), 16384, false));
  // Neither a static scale without amax, nor LayerNorm, keeps u.
  for (const char* spec : {"rms:bf16:64x4096:quant=e4m3/tensor-static", "ln:bf16:64x4096:quant=e4m3/token:nb"}) {
    const NormDesc d = parse_shape_spec(spec).desc;
    CHECK_FALSE(keeps_u_rows(make_variant(Op::Forward, d), LaunchConfig::parse("v8.t128.r1"), 4096, false));
  }
  std::vector<std::string> failures(kept.size());
  parallel_for(static_cast<int>(kept.size()), [&](int i) {
    try {
      const std::string cubin = compile_spec(kept[i], "sm_90", "").cubin;
      failures[i] = min_blocks_problem(kept[i], cubin);
    } catch (const Error& e) {
      failures[i] = e.what();
    }
  });
  for (std::size_t i = 0; i < kept.size(); ++i) {
    CAPTURE(kept[i].name());
    CHECK_MESSAGE(failures[i].empty(), failures[i]);
  }
}

TEST_CASE("nvrtc: the generated source holds the spec's constants and includes its template") {
  const KernelSpec fwd = bf16_4096_fwd();
  CHECK(fwd.name() == "rms_fwd.x=bf16.y=bf16.w=bf16.rstd.N4096.v8.t512.r1.i32");
  CHECK(std::string(fwd.kernel_name()) == "normjit_norm_fwd");
  CHECK(fwd.threads() == 512);
  check_contains_all(fwd.source(), {"N = 4096", "VEC = 8", "TPR = 512", "ROWS = 1", "TWO_PASS = false",
                                    "STORE_RSTD = true", "using x_t = nj::bf16_t", "using w_t = nj::bf16_t",
                                    "using index_t = int;", "#include \"norm_fwd.cuh\"", "LAYERNORM = false",
                                    "#include \"common.cuh\"", fwd.name()});

  NormDesc d = make_desc(3000000, 1000, DType::F16, DType::F32);
  d.x_dtype = DType::F32;
  const KernelSpec bwd = make_spec(Op::Backward, d, LaunchConfig::parse("v4.t256.r1.2p"));
  CHECK(bwd.index64);
  CHECK_FALSE(bwd.v.store_rstd);
  CHECK(bwd.name() == "rms_bwd.x=fp32.y=fp16.w=fp32.N1000.v4.t256.r1.2p.i64");
  check_contains_all(bwd.source(), {"N = 1000", "VEC = 4", "TPR = 256", "TWO_PASS = true", "STORE_RSTD = false",
                                    "using x_t = float", "using y_t = nj::half_t", "using index_t = long long",
                                    "#include \"norm_bwd.cuh\""});
  CHECK_FALSE(contains(bwd.source(), "norm_fwd.cuh"));

  // A LayerNorm variant: its switches reach the prelude and the name.
  NormDesc ln = make_desc(64, 768, DType::F16, DType::F16);
  ln.norm = NormKind::LayerNorm;
  ln.has_bias = true;
  ln.weight_offset = 1.f;
  ln.residual = ln.store_residual_out = true;
  ln.residual_dtype = ln.residual_out_dtype = DType::F32;
  const KernelSpec lf = make_spec(Op::Forward, ln, LaunchConfig::parse("v4.t64.r1"));
  check_contains_all(lf.source(), {"LAYERNORM = true", "HAS_B = true", "W_OFFSET = 0x1p+0f", "RESIDUAL = true",
                                   "STORE_RES = true", "ROUND_RES = true", "using r_t = float", "using h_t = float",
                                   "STORE_MEAN = true"});
  CHECK(lf.name() == "ln_fwd.x=fp16.y=fp16.w=fp16.bias.off=1.res=fp32.ro=fp32.h=fp32.mean.rstd.N768.v4.t64.r1.i32");

  // q transposed past decode: the forward module holds the transpose kernel
  // too, and its row kernel no code for the transpose; no other module does.
  const NormDesc yt = parse_shape_spec("rms:bf16:4096x4096:quant=e4m3/tensor:transpose").desc;
  const KernelSpec ytf = make_spec(Op::Forward, yt, LaunchConfig::parse("v8.t512.r1"));
  CHECK(std::string(ytf.transpose_kernel_name()) == "normjit_q_transpose");
  check_contains_all(ytf.source(), {"STORE_YT = false", "#include \"norm_fwd.cuh\"\n#include \"q_transpose.cuh\""});
  // At decode the row kernel stores the transposed bytes, and no transpose kernel exists.
  for (const char* spec : {"rms:bf16:1x8192:quant=e4m3/tensor:transpose", "rms:bf16:8x4096:quant=e4m3/tensor:transpose"}) {
    CAPTURE(spec);
    const KernelSpec rows = make_spec(Op::Forward, parse_shape_spec(spec).desc, LaunchConfig::parse("v8.t512.r1"));
    CHECK(rows.transpose_kernel_name() == nullptr);
    CHECK(contains(rows.source(), "STORE_YT = true"));
    CHECK_FALSE(contains(rows.source(), "q_transpose.cuh"));
    CHECK(contains(rows.name(), ".yt=rows."));
  }
  NormDesc plain = yt;
  plain.store_y_t = false;
  const KernelSpec pf = make_spec(Op::Forward, plain, LaunchConfig::parse("v8.t512.r1"));
  CHECK(pf.transpose_kernel_name() == nullptr);
  CHECK_FALSE(contains(pf.source(), "q_transpose.cuh"));
  CHECK(fwd.transpose_kernel_name() == nullptr);
  // Tensor scaling: the one-program kernel too, named by the prelude's define.
  CHECK(std::string(ytf.once_kernel_name()) == "normjit_norm_fwd_once");
  CHECK(contains(ytf.source(), "#define NJ_FWD_ONCE"));
  CHECK(fwd.once_kernel_name() == nullptr);
  CHECK_FALSE(contains(fwd.source(), "NJ_FWD_ONCE"));

  const KernelSpec fin = finalize_spec(make_desc(8, 64, DType::BF16, DType::F32));
  CHECK(fin.name() == "dw_finalize.fp32");
  CHECK(fin.threads() == 1024);
  CHECK(contains(fin.source(), "#include \"dweight_finalize.cuh\""));

  // 64-bit offsets exactly when an offset leaves the int range.
  const LaunchConfig c = LaunchConfig::parse("v8.t512.r1");
  CHECK_FALSE(make_spec(Op::Forward, make_desc(524287, 4096), c).index64);
  CHECK(make_spec(Op::Forward, make_desc(524288, 4096), c).index64);
  NormDesc strided = make_desc(2, 4096);
  strided.y_stride = std::int64_t{1} << 31;
  CHECK(make_spec(Op::Forward, strided, c).index64);
  CHECK_FALSE(make_spec(Op::Backward, strided, c).index64);  // y is not read backward
}

TEST_CASE("nvrtc: a forward kernel is compiled to hold its min blocks an SM, and its cubin says so") {
  // RMSNorm bf16 4096 in 512 threads: 8 elements a thread, 32 registers,
  // four CTAs an SM; LayerNorm of 6560 in 1024 threads needs more than 32
  // (it spilled at 32): one CTA, and no bound in the source.
  const KernelSpec rms = bf16_4096_fwd();
  CHECK(forward_register_need(rms.v, rms.cfg, rms.N, rms.peel) == 32);
  CHECK(rms.min_blocks == 4);
  CHECK(contains(rms.source(), "#define NJ_MIN_BLOCKS 4\n"));
  NormDesc ln = make_desc(147, 6560);
  ln.norm = NormKind::LayerNorm;
  ln.has_bias = true;
  const KernelSpec lf = make_spec(Op::Forward, ln, LaunchConfig::parse("v8.t1024.r1"));
  CHECK(lf.min_blocks == 1);
  CHECK_FALSE(contains(lf.source(), "NJ_MIN_BLOCKS"));
  // More elements a thread, fewer CTAs: 64 of them in 128 threads.
  const KernelSpec wide = make_spec(Op::Forward, make_desc(64, 8192), LaunchConfig::parse("v8.t128.r1"));
  CHECK(forward_register_need(wide.v, wide.cfg, wide.N, wide.peel) == 96);
  CHECK(wide.min_blocks == 5);
  // Quantized kernels that keep no u keep ptxas's own choice (a static
  // scale); those that do are bounded (token: 8 elements a thread, 24 + 8 +
  // 16 registers, two CTAs); the backward has no bound.
  NormDesc q = make_desc(64, 4096);
  q.quant = QuantScaling::TensorStatic;
  q.y_dtype = DType::E4M3;
  CHECK(make_spec(Op::Forward, q, LaunchConfig::parse("v8.t512.r1")).min_blocks == 1);
  q.quant = QuantScaling::Token;
  CHECK(make_spec(Op::Forward, q, LaunchConfig::parse("v8.t512.r1")).min_blocks == 2);
  CHECK(make_spec(Op::Backward, make_desc(64, 4096), LaunchConfig::parse("v8.t512.r1")).min_blocks == 1);

  // A cluster's slice of 64 bf16 elements a thread stays packed (the
  // template widens it again after each pass): four 256-thread CTAs an SM
  // (64 registers), where a register an element allowed two; LayerNorm's
  // too; a residual row's is counted as before; a v4 slice of 52 elements
  // keeps elems / 2 + 8.
  const KernelSpec slice = make_spec(Op::Forward, make_desc(256, 131072), LaunchConfig::parse("v8.t256.r1.c8"));
  CHECK(slice.min_blocks == 4);
  // In clusters of 16, persistent with the weight in shared memory: the
  // loop's registers cost a CTA.
  const KernelSpec persistent = make_spec(Op::Forward, make_desc(256, 262144), LaunchConfig::parse("v8.t256.r1.c16"));
  CHECK(persistent.dynamic_smem() == 256 * 64 * 2);  // 64 bf16 elements a thread
  CHECK(persistent.min_blocks == 3);
  CHECK(persistent.source().find("WB_SMEM = true") != std::string::npos);
  CHECK(slice.source().find("WB_SMEM") == std::string::npos);
  NormDesc ln_desc = make_desc(256, 262144);
  ln_desc.norm = NormKind::LayerNorm;
  ln_desc.has_bias = true;
  const KernelSpec ln_slice = make_spec(Op::Forward, ln_desc, LaunchConfig::parse("v8.t256.r1.c16"));
  CHECK(ln_slice.min_blocks == 4);
  NormDesc with_res = make_desc(256, 262144);
  with_res.residual = true;
  CHECK(make_spec(Op::Forward, with_res, LaunchConfig::parse("v8.t256.r1.c16")).min_blocks == 2);
  CHECK(make_spec(Op::Forward, make_desc(512, 100000), LaunchConfig::parse("v4.t256.r1.c8")).min_blocks == 3);
  // A cluster's slice reads its weight through the read-only path only
  // where its launch bound leaves ptxas registers to hoist the loads into:
  // not the packed 64-element slice at its bound of 64 (it spilled 8 bytes).
  const KernelSpec headroom = make_spec(Op::Forward, make_desc(3000, 40960), LaunchConfig::parse("v8.t256.r1.c4"));
  CHECK(headroom.source().find("WB_RO = true") != std::string::npos);
  CHECK(slice.source().find("WB_RO") == std::string::npos);
  CHECK(rms.source().find("WB_RO") == std::string::npos);

  for (const KernelSpec& s : {rms, lf, wide, slice, ln_slice, persistent, headroom}) {
    CAPTURE(s.name());
    const std::string cubin = compile_spec(s, "sm_90", "").cubin;
    const CubinResources r = cubin_resources(cubin);
    CHECK(r.regs > 0);
    CHECK(r.regs * s.min_blocks * s.threads() <= 65536);
    CHECK(r.frame_bytes == 0);
    CHECK(min_blocks_problem(s, cubin).empty());
  }
  CHECK(cubin_resources("not an ELF file").regs == -1);

  // Staged kernels (stages 1) hold their weight and bias in registers too:
  // every staged variant of two grids stays within its bound, unspilled.
  NormDesc res = make_desc(19, 7400);
  res.residual = res.store_residual_out = true;
  std::vector<KernelSpec> staged;
  for (const NormDesc& d : {res, ln})
    for (const LaunchConfig& c : candidate_grid(Op::Forward, d))
      if (const auto s = staged_variant(Op::Forward, d, c)) staged.push_back(make_spec(Op::Forward, d, *s));
  CHECK(staged.size() > 10);
  std::vector<std::string> failures(staged.size());
  parallel_for(static_cast<int>(staged.size()),
               [&](int i) { failures[i] = min_blocks_problem(staged[i], compile_spec(staged[i], "sm_90", "").cubin); });
  for (std::size_t i = 0; i < staged.size(); ++i) {
    CAPTURE(staged[i].name());
    CHECK(failures[i].empty());
  }
}

TEST_CASE("nvrtc: binary_cache_key is stable and changes with arch, N, dtype and config") {
  const KernelSpec base = bf16_4096_fwd();
  const std::string key = binary_cache_key(base, "sm_90");
  CHECK(key.size() == 32);
  CHECK(key.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(binary_cache_key(bf16_4096_fwd(), "sm_90") == key);

  std::vector<KernelSpec> variants(6, base);
  variants[0].N = 5120;
  variants[1].v.x = DType::F16;
  variants[2].v.w = DType::F32;
  variants[3].cfg.vec = 4;
  variants[4].index64 = true;
  variants[5].v.store_rstd = false;
  std::set<std::string> keys = {key, binary_cache_key(base, "sm_80")};
  for (const auto& v : variants) keys.insert(binary_cache_key(v, "sm_90"));
  CHECK(keys.size() == variants.size() + 2);

  // programs_per_sm is a launch parameter: every value shares one cubin.
  const NormDesc d = make_desc(8192, 4096);
  const KernelSpec p0 = make_spec(Op::Backward, d, LaunchConfig::parse("v8.t512.r1"));
  const KernelSpec p4 = make_spec(Op::Backward, d, LaunchConfig::parse("v8.t512.r1.p4"));
  CHECK(p4.name() == p0.name());
  CHECK(binary_cache_key(p4, "sm_90") == binary_cache_key(p0, "sm_90"));
}

TEST_CASE("nvrtc: the disk cache serves a second compile and replaces a damaged file") {
  const auto dir = make_temp_dir("kernels");
  const std::string kernel_dir = (*dir / "kernels").string();  // created on first write
  const KernelSpec spec = make_spec(Op::Forward, make_desc(64, 128), LaunchConfig::parse("v8.t16.r2"));

  const KernelBinary first = compile_spec(spec, "sm_90", kernel_dir);
  CHECK_FALSE(first.from_disk);
  REQUIRE(is_elf(first.cubin));
  CHECK(first.cache_key == binary_cache_key(spec, "sm_90"));
  const fs::path file = fs::path(kernel_dir) / (first.cache_key + ".cubin");
  REQUIRE(fs::exists(file));
  CHECK(read_binary(file) == first.cubin);
  CHECK(std::distance(fs::directory_iterator(kernel_dir), fs::directory_iterator()) == 1);  // no temp file left

  const KernelBinary second = compile_spec(spec, "sm_90", kernel_dir);
  CHECK(second.from_disk);
  CHECK(second.cubin == first.cubin);
  CHECK(second.cache_key == first.cache_key);

  // Another arch is another file.
  CHECK_FALSE(compile_spec(spec, "sm_80", kernel_dir).from_disk);
  CHECK(std::distance(fs::directory_iterator(kernel_dir), fs::directory_iterator()) == 2);

  for (const std::string damage : {"garbage, not a cubin", "", "\x7f" "ELF"}) {
    CAPTURE(damage);
    write_text_file(file, damage);
    const KernelBinary again = compile_spec(spec, "sm_90", kernel_dir);
    CHECK_FALSE(again.from_disk);
    CHECK(is_elf(again.cubin));
    CHECK(read_binary(file) == again.cubin);
    CHECK(compile_spec(spec, "sm_90", kernel_dir).from_disk);
  }
}

TEST_CASE("nvrtc: a syntax error gives a CompileError with log, options, kernel name and arch") {
  const std::string src = "extern \"C\" __global__ void broken_kernel(float* p) { p[0] = ; }\n";
  const std::vector<std::string> options = {"-std=c++17"};
  try {
    compile_cubin(src, "broken.cu", {}, options, "broken_kernel", "sm_90");
    FAIL_CHECK("compile_cubin accepted a syntax error");
  } catch (const CompileError& e) {
    CHECK(e.kind() == ErrorKind::Compile);
    CHECK_FALSE(e.log().empty());
    CHECK(contains(e.log(), "broken.cu"));
    const auto& o = e.options();
    CHECK(std::find(o.begin(), o.end(), "--gpu-architecture=sm_90") != o.end());
    CHECK(std::find(o.begin(), o.end(), "-std=c++17") != o.end());
    CHECK(e.kernel_name() == "broken_kernel");
    CHECK(e.arch() == "sm_90");
    CHECK(contains(e.what(), "nvrtcCompileProgram"));
    CHECK(contains(e.what(), e.log()));
  }

  // The same source, fixed, with a header from the map.
  const std::map<std::string, std::string> headers = {{"value.cuh", "#define VALUE 42.0f\n"}};
  const CompiledKernel ok = compile_cubin(
      "#include \"value.cuh\"\nextern \"C\" __global__ void fixed_kernel(float* p) { p[0] = VALUE; }\n", "fixed.cu",
      headers, options, "fixed_kernel", "sm_80");
  CHECK(is_elf(ok.cubin));

  // A missing header is a compile error too, naming the header in the log.
  CHECK_THROWS_WITH_AS(compile_cubin("#include \"absent.cuh\"\n", "absent.cu", {}, options, "k", "sm_90"),
                       doctest::Contains("absent.cuh"), CompileError);
}
