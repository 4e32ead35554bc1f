#include "specialization.hpp"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "config_grid.hpp"
#include "kernel_sources.hpp"

namespace normjit::detail {

namespace {
const char* device_type(DType t) {
  switch (t) {
    case DType::F32: return "float";
    case DType::F16: return "nj::half_t";
    case DType::BF16: return "nj::bf16_t";
    case DType::E4M3: return "nj::e4m3_t";
    case DType::E5M2: return "nj::e5m2_t";
    case DType::E8M0: break;  // scales only: never a row's element type
  }
  return "void";
}

// Does the largest element offset of a [M / heads, heads, N] view overflow int?
bool needs_index64(const NormDesc& d, std::int64_t ld, std::int64_t hs, std::int64_t heads) {
  if (d.M == 0) return false;
  const std::int64_t tokens = d.M / heads;
  return (tokens - 1) * ld + (heads - 1) * hs + d.N > INT_MAX;
}
}  // namespace

std::string op_label(Op op, NormKind norm) { return fmt::format("{}_{}", norm_kind_name(norm), op_name(op)); }

std::string Variant::tags(KernelKind kind) const {
  const bool fwd = kind == KernelKind::Forward;
  std::string s = fmt::format("{}:x={}:y={}:w={}", op_label(fwd ? Op::Forward : Op::Backward, norm), dtype_name(x),
                              dtype_name(y), dtype_name(w));
  if (!has_w) s += ":nw";
  if (has_b) s += ":bias";
  if (w_offset != 0.f) s += fmt::format(":off={}", w_offset);
  if (fwd && residual)
    s += fmt::format(":res={}{}:h={}{}", dtype_name(r), store_res ? fmt::format(":ro={}", dtype_name(ro)) : "",
                     dtype_name(h), round_res ? "" : ":fp32sum");
  if (!fwd && dx != x) s += fmt::format(":dx={}", dtype_name(dx));
  if (!fwd && dres) s += fmt::format(":dres={}", dtype_name(ro));
  if (fwd && llama) s += ":llama";
  if (heads) s += ":3d";
  if (fwd && store_mean) s += ":mean";
  if (fwd && store_rstd) s += ":rstd";
  if (xgroup) s += fmt::format(":xg={}", xgroup);
  if (fwd && quant != QuantScaling::None) {
    s += fmt::format(":q={}", quant_scaling_name(quant));
    if (quant == QuantScaling::Group) s += fmt::format("{}{}{}", qgroup, ue8m0 ? ":ue8m0" : "", colmajor ? ":colmajor" : "");
    if (store_yhp) s += fmt::format(":yhp={}", dtype_name(yhp));
    if (store_yt) s += ":yt";
  }
  return s;
}

Variant make_variant(Op op, const NormDesc& d) {
  Variant v;
  const bool fwd = op == Op::Forward;
  const bool ln = d.norm == NormKind::LayerNorm;
  v.norm = d.norm;
  v.x = fwd ? d.x_dtype : d.normed_dtype();
  v.y = d.y_dtype;
  v.w = d.weight_dtype;
  v.has_w = d.has_weight;
  v.has_b = ln && d.has_bias;
  v.w_offset = d.has_weight ? d.weight_offset : 0.f;
  v.heads = d.heads > 1;
  v.h = v.r = v.ro = v.dx = v.x;
  if (fwd) {
    v.residual = d.residual;
    if (d.residual) {
      v.r = d.residual_dtype;
      v.store_res = d.store_residual_out;
      v.ro = d.store_residual_out ? d.residual_out_dtype : v.x;
      v.round_res = d.residual_rounding == ResidualRounding::ResidualDtype;
      v.h = v.round_res ? d.residual_dtype : DType::F32;
    }
    v.llama = d.cast_mode == CastMode::Llama;
    v.store_rstd = d.store_rstd;
    v.store_mean = ln && d.store_mean;
    // An FP8 x is dequantized on load: a cached row is fp32.
    if (is_fp8(d.x_dtype) && !d.residual) v.h = DType::F32;
    v.quant = d.quant;
    if (d.quant == QuantScaling::Group) v.qgroup = d.quant_group;
    if (d.quant == QuantScaling::MX) v.qgroup = 32;
    v.ue8m0 = d.quant == QuantScaling::Group && d.scale_ue8m0;
    v.colmajor = d.quant == QuantScaling::Group && d.scale_col_major;
    v.store_yhp = d.quant != QuantScaling::None && d.store_y_hp;
    if (v.store_yhp) v.yhp = d.y_hp_dtype;
    v.store_yt = d.store_y_t;
  } else {
    v.y = d.dy_dtype();
    v.dx = d.dx_dtype();
    v.dres = d.has_dresidual;
    if (d.has_dresidual) v.ro = d.residual_out_dtype;
  }
  if (is_fp8(v.x)) v.xgroup = d.x_group;
  return v;
}

int KernelSpec::dynamic_smem() const {
  if (kind != KernelKind::Backward) return 0;
  const std::int64_t stages = cfg.stages * cfg.rows_per_pid * slice_columns(N, cfg) * (dtype_size(v.x) + dtype_size(v.y)) +
         (dw_smem ? slice_columns(N, cfg) * (4 * v.partials() + (v.has_w ? dtype_size(v.w) : 0)) : 0);
  // dw_cluster: the CTA's dweight (and dbias) row, read by its peers, in the stages' place.
  return static_cast<int>(cfg.dw_cluster ? std::max<std::int64_t>(stages, 4LL * v.partials() * N) : stages);
}

const char* KernelSpec::kernel_name() const {
  switch (kind) {
    case KernelKind::Forward: return "normjit_norm_fwd";
    case KernelKind::Backward: return "normjit_norm_bwd";
    case KernelKind::DweightFinalize: return "normjit_dw_finalize";
  }
  return "";
}

const char* KernelSpec::template_file() const {
  switch (kind) {
    case KernelKind::Forward: return "norm_fwd.cuh";
    case KernelKind::Backward: return "norm_bwd.cuh";
    case KernelKind::DweightFinalize: return "dweight_finalize.cuh";
  }
  return "";
}

std::string KernelSpec::source() const {
  // The FP8 storage types live in fp8.cuh and the quantization helpers in
  // quant.cuh; only the variants that use them include them, so editing them
  // leaves every other kernel (and its tuned entries) as it was.
  const bool quant = kind == KernelKind::Forward && v.quant != QuantScaling::None;
  const char* first = quant ? "quant.cuh" : is_fp8(v.x) || is_fp8(v.y) ? "fp8.cuh" : "common.cuh";
  std::string s = "// Generated by normjit: " + name() + "\n#include \"" + first + "\"\n";
  // Only where > 1, so the other kernels' sources stay what they were.
  if (min_blocks > 1) s += fmt::format("#define NJ_MIN_BLOCKS {}\n", min_blocks);
  s += "struct Spec {\n";
  if (quant) s += "  using Q = nj::QuantOps;\n";
  s += fmt::format("  using x_t = {};\n  using y_t = {};\n  using w_t = {};\n", device_type(v.x), device_type(v.y),
                   device_type(v.w));
  s += fmt::format("  using r_t = {};\n  using ro_t = {};\n  using h_t = {};\n  using dx_t = {};\n", device_type(v.r),
                   device_type(v.ro), device_type(v.h), device_type(v.dx));
  s += fmt::format("  using index_t = {};\n", index64 ? "long long" : "int");
  s += fmt::format("  static constexpr int N = {}, VEC = {}, TPR = {}, ROWS = {}, STAGES = {}, CLUSTER = {};\n", N,
                   cfg.vec, cfg.threads_per_row, cfg.rows_per_pid, cfg.stages, cfg.row_split());
  s += fmt::format("  static constexpr bool LAYERNORM = {}, TWO_PASS = {}, STORE_RSTD = {}, STORE_MEAN = {};\n",
                   v.norm == NormKind::LayerNorm, cfg.two_pass, v.store_rstd, v.store_mean);
  s += fmt::format("  static constexpr bool HAS_W = {}, HAS_B = {}, LLAMA = {}, HEADS = {}, DW_SMEM = {};\n", v.has_w,
                   v.has_b, v.llama, v.heads, dw_smem);
  s += fmt::format("  static constexpr bool RESIDUAL = {}, STORE_RES = {}, ROUND_RES = {}, DRES = {};\n", v.residual,
                   v.store_res, v.round_res, v.dres);
  // Hexadecimal: the offset compiles in exactly.
  s += fmt::format("  static constexpr float W_OFFSET = {:a}f;\n", static_cast<double>(v.w_offset));
  // FP8 constants only where a variant has them (the templates read 0
  // otherwise), so the other variants' sources are what they were before FP8.
  if (v.xgroup) s += fmt::format("  static constexpr int XGROUP = {};\n", v.xgroup);
  if (peel) s += "  static constexpr bool PEEL = true;\n";
  // Only staged kernels (stages 1) carry their staging: the unstaged ones'
  // sources stay what they were (their rule is the template's).
  if (kind == KernelKind::Forward && cfg.stages) {
    const WeightStaging w = weight_staging(v, cfg, N, peel);
    s += fmt::format("  static constexpr bool WB_WITH_ROW = {};\n  static constexpr int WB_BATCH = {};\n", w.with_row,
                     w.batch);
  }
  if (cfg.dw_cluster) s += "  static constexpr bool DW_CLUSTER = true;\n";
  if (quant) {
    s += fmt::format("  using yhp_t = {};\n  static constexpr int QUANT = {}, QGROUP = {};\n", device_type(v.yhp),
                     static_cast<int>(v.quant), v.qgroup);
    s += fmt::format("  static constexpr bool UE8M0 = {}, COLMAJOR = {}, STORE_YHP = {}, STORE_YT = {};\n", v.ue8m0,
                     v.colmajor, v.store_yhp, v.store_yt);
  }
  s += fmt::format("}};\n#include \"{}\"\n", template_file());
  return s;
}

std::string KernelSpec::name() const {
  if (kind == KernelKind::DweightFinalize) return fmt::format("dw_finalize.{}", dtype_name(v.w));
  std::string t = v.tags(kind);
  for (char& c : t)
    if (c == ':') c = '.';
  return fmt::format("{}.N{}.{}.{}{}{}", t, N, cfg.str(), index64 ? "i64" : "i32", dw_smem ? ".dws" : "",
                     peel ? ".peel" : "");
}

namespace {
// Chunks of its row a forward thread keeps in registers.
int forward_iters(const LaunchConfig& c, int N, bool peel) {
  const std::int64_t chunks = slice_columns(N + (peel ? c.vec - 1 : 0), c) / c.vec;
  return static_cast<int>((chunks + c.threads_per_row - 1) / c.threads_per_row);
}

// forward_register_need without the staged weight and bias.
int row_register_need(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  const bool ln = v.norm == NormKind::LayerNorm;
  const int fp32_sum = v.residual && dtype_size(v.h) == 4 ? 8 : 0;  // a residual summed in fp32
  if (c.two_pass) return 32 + (ln ? 8 : 0) + fp32_sum;
  const int elems = forward_iters(c, N, peel) * c.vec;
  return 24 + elems + (elems >= 16 ? 8 : 0) + (ln ? 4 : 0) + (c.row_split() > 1 ? 8 : 0) + (peel ? 16 : 0) + fp32_sum;
}

// Registers that `bytes` of staged weight and bias add (LaunchConfig::stages
// 1): none for one 8-element chunk, else one an element past the first 12
// (ptxas widens them to fp32 ahead of use; 4 at least), 8 more past 32
// elements, and 8 with a residual. Fitted to the lowest
// register caps at which ptxas spilled nothing over the staged kernels of 16
// shapes' grids; tests/test_nvrtc_compile.cpp checks the caps
// forward_min_blocks sets.
int staged_registers(const Variant& v, int bytes) {
  const int elems = bytes / dtype_size(v.w);
  if (elems <= 8) return 0;
  return std::max(4, elems - 12) + (elems > 32 ? 8 : 0) + (v.residual ? 8 : 0);
}
}  // namespace

int thread_register_cap(int threads) { return std::min(255, DeviceFacts{}.regs_per_sm / threads); }

WeightStaging weight_staging(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  WeightStaging s;
  if (c.two_pass) return s;  // streams its row chunk by chunk (norm_fwd.cuh)
  const int iters = forward_iters(c, N, peel);
  const int per_chunk = c.vec * dtype_size(v.w) * ((v.has_w ? 1 : 0) + (v.has_b ? 1 : 0));
  if (per_chunk == 0) {
    s.with_row = true;  // nothing to load
    return s;
  }
  if (c.stages == 0) {
    // Unstaged: with the row when it costs at most 32 bytes, else a chunk at
    // a time after the reduction; no registers beyond the row's. (norm_fwd.cuh
    // applies the same rule itself: these kernels' preludes carry nothing.)
    s.with_row = iters * per_chunk <= kUnstagedWeightBytes;
    s.batch = s.with_row ? iters : 1;
  } else {
    // Staged: the largest batch within kWeightStagingBytes whose registers
    // still fit a thread of this block (65536 a CTA, 255 a thread).
    const int cap = thread_register_cap(c.threads());
    const int base = row_register_need(v, c, N, peel);
    int b = std::min(iters, std::max(1, kWeightStagingBytes / per_chunk));
    while (b > 1 && base + staged_registers(v, b * per_chunk) > cap) --b;
    s.with_row = b == iters;
    s.batch = b;
  }
  s.bytes = s.batch * per_chunk;
  return s;
}

int forward_register_need(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  const int staged = c.stages && !c.two_pass ? staged_registers(v, weight_staging(v, c, N, peel).bytes) : 0;
  return row_register_need(v, c, N, peel) + staged;
}

int forward_min_blocks(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  // Two-pass rows hold no row: ptxas's own choice is small (32 registers),
  // and a bound made it worse (64 and a stack frame for LayerNorm fp32).
  if (v.quant != QuantScaling::None || v.xgroup || c.two_pass) return 1;
  const DeviceFacts sm90;  // its per-SM limits: those of sm_80 and sm_90
  const int threads = c.threads();
  const int alloc = (forward_register_need(v, c, N, peel) + 7) / 8 * 8;  // allocated per warp in 8s a thread
  const int b = sm90.regs_per_sm / (threads * alloc);
  return std::max(1, std::min({b, sm90.max_threads_per_sm / threads, sm90.max_blocks_per_sm}));
}

KernelSpec make_spec(Op op, const NormDesc& d, const LaunchConfig& cfg) {
  KernelSpec s;
  s.kind = op == Op::Forward ? KernelKind::Forward : KernelKind::Backward;
  s.N = static_cast<int>(d.N);
  s.v = make_variant(op, d);
  s.cfg = cfg;
  s.cfg.programs_per_sm = 0;  // a launch parameter: one cubin serves every value
  s.dw_smem = dweight_in_smem(op, d, s.cfg);
  s.peel = peeled(op, d, cfg.vec);
  if (op == Op::Forward) s.min_blocks = forward_min_blocks(s.v, s.cfg, s.N, s.peel);
  const std::int64_t H = d.heads;
  if (op == Op::Forward) {
    s.index64 = needs_index64(d, d.x_ld(), d.x_hs(), H) || needs_index64(d, d.y_ld(), d.y_hs(), H) ||
                (d.residual && (needs_index64(d, d.residual_ld(), d.N, 1) ||
                                (d.store_residual_out && needs_index64(d, d.residual_out_ld(), d.N, 1))));
  } else {
    const bool h_in = d.residual;  // the backward reads h = residual_out as its x
    s.index64 = needs_index64(d, h_in ? d.residual_out_ld() : d.x_ld(), h_in ? d.N : d.x_hs(), H) ||
                needs_index64(d, d.dy_ld(), d.dy_hs(), H) || needs_index64(d, d.dx_ld(), d.dx_hs(), H) ||
                (d.has_dresidual && needs_index64(d, d.dresidual_ld(), d.N, 1));
  }
  return s;
}

std::string KernelSpec::source_hash(const SourceMap& files) const {
  std::string text = source();
  for (const auto& o : nvrtc_options()) text += "\n// option " + o;
  return closure_hash(text, files);
}

std::string tuned_kernel_hash(Op op, const NormDesc& desc, const LaunchConfig& cfg) {
  KernelSpec s = make_spec(op, desc, cfg);
  s.index64 = false;
  return s.source_hash();
}

KernelSpec finalize_spec(const NormDesc& d) {
  KernelSpec s;
  s.kind = KernelKind::DweightFinalize;
  s.v.w = d.weight_dtype;
  return s;
}

const std::vector<std::string>& nvrtc_options() {
  static const std::vector<std::string> o = {"-std=c++17", "--device-as-default-execution-space"};
  return o;
}

}  // namespace normjit::detail
