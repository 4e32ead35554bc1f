#include "config/config_grid.hpp"

#include <algorithm>
#include <numeric>
#include <cstdint>

#include <fmt/format.h>

#include "config/row_budget.hpp"
#include "core/variant.hpp"  // m_bucket

#include <cmath>

namespace normjit::detail {

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t next_pow2(std::int64_t v) {
  std::int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}
constexpr int kBlockSizes[] = {128, 256, 512, 1024};
}  // namespace

std::int64_t slice_columns(std::int64_t N, const LaunchConfig& c) {
  return ceil_div(ceil_div(N, c.vec), c.row_split()) * c.vec;
}

namespace {
// Forward rows, but not those with groups aligned to the row's start (FP8
// x's scale groups, y's group and MX scales): those never peel. Backward
// rows of 2-D tensors without FP8 x (norm_bwd.cuh's PEEL: a program's rows
// all start at the same column of a vector, which 3-D rows do not).
bool peelable(Op op, const NormDesc& d) {
  if (op == Op::Backward) return !is_fp8(d.normed_dtype()) && d.heads <= 1;
  return d.quant != QuantScaling::Group && d.quant != QuantScaling::MX && !is_fp8(d.x_dtype);
}
}  // namespace

bool peeled(Op op, const NormDesc& d, int vec) {
  if (vec <= 1 || !peelable(op, d)) return false;
  for (std::int64_t s : row_strides(op, d))
    if (s % vec) return true;
  return false;
}

std::int64_t peeled_view(std::int64_t N, int vec) { return N + vec - 1; }

std::int64_t peeled_span(std::int64_t N, const LaunchConfig& c) {
  if (c.cluster <= 1) return peeled_view(N, c.vec);
  return N >= c.vec ? N / c.vec * c.vec : c.vec;
}

std::int64_t row_span(Op op, const NormDesc& d, const LaunchConfig& c) {
  if (!peeled(op, d, c.vec)) return d.N;
  return op == Op::Backward ? peeled_view(d.N, c.vec) : peeled_span(d.N, c);
}

int max_vec(Op op, const NormDesc& d) { return max_vec(op, d, make_variant(op, d)); }

int max_vec(Op op, const NormDesc& d, const Variant& v) {
  // Every tensor the kernel moves in vectors (unused dtypes equal x's).
  const int widest = std::max({dtype_size(v.x), dtype_size(v.y), dtype_size(v.w), dtype_size(v.r), dtype_size(v.ro),
                               dtype_size(v.dx), v.store_yhp ? dtype_size(v.yhp) : 1});
  int vec = static_cast<int>(std::min<std::int64_t>(16 / widest, next_pow2(d.N)));
  if (peelable(op, d)) return vec;
  for (std::int64_t s : row_strides(op, d))
    while (vec > 1 && s % vec) vec /= 2;
  return vec;
}

namespace {
// Elements of a row one thread handles, and whether that fits the register
// budget (a 1024-thread block gets half: 64 registers a thread at most).
struct Share {
  std::int64_t per_thread;
  bool in_registers;
};
Share thread_share(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c) {
  // A cluster's CTA holds its slice of the row.
  const std::int64_t per_thread = ceil_div(slice_columns(row_span(op, d, c), c) / c.vec, c.threads_per_row) * c.vec;
  const int full_block = c.threads() == 1024 ? 2 : 1;
  // Forward rows are cached as h_t (x's dtype, or the residual sum's).
  const bool regs = op == Op::Forward
                        ? per_thread * dtype_size(v.h) * full_block <= kFwdCacheBytesPerThread
                        : per_thread * full_block <= kBwdCachedElemsPerThread;
  return {per_thread, regs};
}

// Whether one 1024-thread block holds a row in registers (vectors of vec).
bool one_block_holds(Op op, const NormDesc& d, const Variant& v, int vec) {
  return thread_share(op, d, v, LaunchConfig{vec, 1024, 1, false}).in_registers;
}
}  // namespace

bool dweight_in_smem(Op op, const NormDesc& d, const LaunchConfig& c) {
  return dweight_in_smem(op, d, make_variant(op, d), c);
}

bool dweight_in_smem(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c) {
  return op == Op::Backward && !c.two_pass && !thread_share(op, d, v, c).in_registers && v.partials() > 0;
}

bool config_valid(Op op, const NormDesc& d, const LaunchConfig& c, std::string* why, int max_cluster) {
  return config_valid(op, d, make_variant(op, d), c, why, max_cluster);
}

namespace {
// config_valid's rules, in its order; each returns why `c` breaks one, or "".
// The block, vector, cluster and dw_cluster rules.
std::string geometry_rule(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c, int max_cluster) {
  auto pow2 = [](int x) { return x > 0 && (x & (x - 1)) == 0; };
  const int vmax = max_vec(op, d, v);
  if (!pow2(c.vec) || c.vec > vmax) return fmt::format("vec {} is not a power of two <= {}", c.vec, vmax);
  if (!pow2(c.threads_per_row) || !pow2(c.rows_per_pid)) return "threads_per_row and rows_per_pid must be powers of two";
  const int threads = c.threads();
  if (threads < 32 || threads > 1024) return fmt::format("block of {} threads is outside [32, 1024]", threads);
  const std::int64_t chunks = ceil_div(row_span(op, d, c), c.vec);
  if (!pow2(c.cluster) || c.cluster > max_cluster)
    return fmt::format("cluster {} is not a power of two <= {} (the device's largest cluster)", c.cluster,
                       max_cluster);
  if (static_cast<std::int64_t>(c.threads_per_row) * c.row_split() > next_pow2(chunks))
    return c.row_split() > 1 ? fmt::format("{} threads per row x cluster {} for {} chunks", c.threads_per_row,
                                           c.cluster, chunks)
                             : fmt::format("{} threads per row for {} chunks", c.threads_per_row, chunks);
  if (c.cluster > 1 && !c.dw_cluster) {
    // The exchange reads one value per lane of a whole warp. The forward's
    // two-pass path has no exchange; the backward's streams its slices.
    if (c.rows_per_pid != 1 || c.threads_per_row < 32 || (c.two_pass && op == Op::Forward))
      return "a cluster shares one row over >= 32 threads per CTA (no forward two-pass)";
  }
  if (c.dw_cluster) {
    // The grid is one cluster: for a few rows, where a second launch to sum
    // the programs' dweight rows costs more than the rows themselves.
    if (op != Op::Backward || c.cluster < 2 || c.two_pass || c.programs_per_sm || c.stages || v.partials() == 0 ||
        is_fp8(d.normed_dtype()))
      return "dw_cluster is for backward rows with dweight or dbias, a cluster, no two-pass, stages or "
             "programs_per_sm, no FP8 x";
    // Its rows move by cp.async (4 bytes at least): 2-byte chunks copied
    // through registers ran 2.5x slower than the two-launch configs (H200,
    // ln fp16 61x2881: 13.7 us against 5.4).
    if (c.vec * std::min({dtype_size(v.x), dtype_size(v.y), v.dres ? dtype_size(v.ro) : 4}) < 4)
      return "dw_cluster moves its rows by cp.async: 4-byte chunks at least";
    if (dc_batch(v, d.N, c).rows == 0) return "dw_cluster's row slices exceed the shared-memory budget";
  }
  return {};
}

// Quantized rows and FP8 x: vectors within a group.
std::string quant_rule(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c) {
  if (op == Op::Forward && d.quant != QuantScaling::None) {
    // A cluster's CTAs hold whole groups.
    if (c.cluster > 1 && v.qgroup && slice_columns(d.N, c) % v.qgroup)
      return fmt::format("a cluster of {} splits the row's groups of {}", c.cluster, v.qgroup);
    // A group's lanes find its amax with shuffles: whole vectors, one warp at most.
    if (v.qgroup && (v.qgroup % c.vec || v.qgroup / c.vec > 32))
      return fmt::format("a quantization group of {} is not 1..32 whole vectors of {}", v.qgroup, c.vec);
    if (v.qgroup && c.threads_per_row < v.qgroup / c.vec)
      return fmt::format("{} threads per row split a group of {} vectors", c.threads_per_row, v.qgroup / c.vec);
  }
  if (is_fp8(d.normed_dtype()) && d.x_group % c.vec)
    return fmt::format("a vector of {} straddles two x scale groups of {}", c.vec, d.x_group);
  return {};
}

// Whether a thread's share of the row fits its registers, else two-pass;
// `smem_dw`: a staged backward row whose dw sums move to shared memory.
std::string register_rule(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c, int max_cluster,
                          bool& smem_dw) {
  const auto [per_thread, in_registers] = thread_share(op, d, v, c);
  const int full_block = c.threads() == 1024 ? 2 : 1;
  // A staged backward row may still be cached when its dw sums and weight
  // move to shared memory (the stages' budget below covers them).
  smem_dw = op == Op::Backward && !in_registers && c.rows_per_pid == 1 && c.stages >= 2 && !c.dw_cluster &&
            per_thread * full_block <= 2 * kBwdCachedElemsPerThread;
  const bool fits = in_registers || smem_dw;
  if (c.two_pass) {
    if (fits) return "two-pass is only for rows that do not fit in registers";
    if (c.rows_per_pid != 1) return "two-pass handles one row per program";
    if (op == Op::Backward && c.cluster > 1) {
      // Streaming a cluster's slices twice only for rows that the largest
      // cluster cannot hold (fp32 rows of 128K and more).
      LaunchConfig whole = c;
      whole.two_pass = false;
      whole.cluster = max_cluster;
      const std::int64_t chunks = ceil_div(row_span(op, d, c), c.vec);
      whole.threads_per_row = static_cast<int>(std::min<std::int64_t>(1024, next_pow2(chunks) / max_cluster));
      for (int st : {0, 2}) {
        whole.stages = st;
        if (whole.threads_per_row >= 32 && config_valid(op, d, v, whole, nullptr, max_cluster))
          return "a cluster streams a row twice only where the largest cluster cannot hold it";
      }
    }
    if (op == Op::Forward) {
      // Reading a row twice loses to any block that holds it (measured: 1.5x
      // and more on H100 and H200), and a narrow block streams it slowly.
      if (one_block_holds(op, d, v, c.vec)) return "two-pass is only for rows no block holds in registers";
      if (c.threads_per_row < 256) return "a two-pass row streams through 256 threads or more";
    }
  } else if (!fits) {
    return fmt::format("{} elements per thread exceed the register budget", per_thread);
  }
  return {};
}

// dweight staging of row groups, programs_per_sm, and the stages.
std::string stage_rule(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c, bool smem_dw) {
  // Row groups add their dw / db shares through static shared memory.
  if (op == Op::Backward && c.rows_per_pid > 1 && v.partials() * d.N * 4 > 32768)
    return "dweight staging exceeds 32 KiB of shared memory";
  if (c.programs_per_sm < 0 || (op == Op::Forward && c.programs_per_sm != 0))
    return "programs_per_sm is a backward launch parameter >= 0";
  if (op == Op::Forward && c.stages != 0) {
    // Forward stages 1: the weight and bias staged ahead of their stores
    // (weight_staging), where that changes the kernel.
    if (c.stages != 1 || c.two_pass || v.quant != QuantScaling::None || v.xgroup)
      return "forward stages is 1 (staged weight and bias) or 0, for rows kept in registers, not quantized nor FP8 in";
    const bool peel = peeled(op, d, c.vec);
    LaunchConfig unstaged = c;
    unstaged.stages = 0;
    if (weight_staging(v, unstaged, static_cast<int>(d.N), peel).with_row)
      return "the unstaged kernel already loads its weight and bias with the row";
    // Without a residual, staging one chunk's weight at a time after the
    // reduction is what the unstaged kernel does.
    const WeightStaging st = weight_staging(v, c, static_cast<int>(d.N), peel);
    if (!st.with_row && st.batch == 1 && !v.residual)
      return "a thread's registers leave room to stage no more than the unstaged kernel does";
    // Staged rows issue all their loads first: a row whose registers pass
    // what a thread of this block may hold would spill.
    const int need = forward_register_need(v, c, static_cast<int>(d.N), peel);
    const int cap = thread_register_cap(c.threads());
    if (need > cap)
      return fmt::format("the staged row needs {} registers a thread, over the {} a {}-thread block allows", need,
                         cap, c.threads());
  } else if (c.stages != 0) {
    // A two-pass row reads its slice from one stage; a one-pass row overlaps two or more.
    if (op != Op::Backward || c.stages < (c.two_pass ? 1 : 2))
      return "stages are for the backward: >= 2 for one pass, >= 1 for two";
    if (d.N % c.vec && !peeled(op, d, c.vec)) return "staged rows must split into whole chunks";
    if (c.vec * std::min(dtype_size(v.x), dtype_size(v.y)) < 4) return "cp.async moves 4 bytes or more";
    if (backward_stage_bytes(v, row_span(op, d, c), c, smem_dw) > kMaxStageBytes)
      return "stages exceed the shared-memory budget";
  }
  return {};
}
// Peeled backward rows (norm_bwd.cuh's PEEL) keep the weight and dweight
// sums of a program's columns in registers, shifted once to where its rows
// start in a vector: one pass over each row, many rows a program.
std::string peel_rule(Op op, const NormDesc& d, const LaunchConfig& c, bool smem_dw) {
  if (op == Op::Backward && peeled(op, d, c.vec) && (c.two_pass || c.dw_cluster || smem_dw))
    return fmt::format("backward rows not aligned to vectors of {} take one pass with dweight in registers (no "
                       "two-pass, dw_cluster or dweight in shared memory)", c.vec);
  return {};
}
}  // namespace

bool config_valid(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c, std::string* why,
                  int max_cluster) {
  bool smem_dw = false;
  std::string r = geometry_rule(op, d, v, c, max_cluster);
  if (r.empty()) r = quant_rule(op, d, v, c);
  if (r.empty()) r = register_rule(op, d, v, c, max_cluster, smem_dw);
  if (r.empty()) r = peel_rule(op, d, c, smem_dw);
  if (r.empty()) r = stage_rule(op, d, v, c, smem_dw);
  if (r.empty()) return true;
  if (why) *why = std::move(r);
  return false;
}

std::optional<LaunchConfig> staged_variant(Op op, const NormDesc& d, const LaunchConfig& cfg, int max_cluster) {
  return staged_variant(op, d, make_variant(op, d), cfg, max_cluster);
}

std::optional<LaunchConfig> staged_variant(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& cfg,
                                           int max_cluster) {
  if (op != Op::Forward || cfg.stages != 0 || cfg.two_pass) return std::nullopt;
  LaunchConfig s = cfg;
  s.stages = 1;
  if (!config_valid(op, d, v, s, nullptr, max_cluster)) return std::nullopt;
  return s;
}

std::vector<LaunchConfig> candidate_grid(Op op, const NormDesc& d, int max_cluster) {
  std::vector<LaunchConfig> out;
  const Variant v = make_variant(op, d);  // derived once for the whole grid
  const int vmax = max_vec(op, d, v);
  const std::int64_t mb = std::max<std::int64_t>(1, m_bucket(d.M));
  // Clusters pay where a row is too wide for one CTA to keep many bytes in
  // flight (16 KiB and more), or where M is too small to fill the SMs. Past
  // decode (M > 32), forward rows that fit one block's registers lose by
  // splitting over a cluster (on 40 + 279 fully timed shapes, 3 won by it):
  // the H200's ln fp16 734x21888 ran v8.t512.r1 in 31 us, v8.t128.r1.c4 in
  // 46; rms fp16 117x9464 v8.t1024.r1 5.7 us, v8.t128.r1.c16 9.7.
  const bool clusters = (d.N * dtype_size(v.x) >= 16384 || mb <= 32) &&
                        !(op == Op::Forward && mb >= 64 && one_block_holds(op, d, v, vmax));
  // And past decode a forward cluster's CTAs take 256 threads or more: of
  // 62 fully timed forward shapes with M > 64, a 128-thread cluster was the
  // fastest config on 6, by 0.8% at most, and such configs ran at a median
  // 1.46x the fastest. The H200's ln fp16 162x113662 ran v8.t128.r1.c16 in
  // 84 us, v8.t512.r1.c4 in 47.
  const int cluster_min_tpr = op == Op::Forward && mb >= 64 ? 256 : 128;
  // Vectors of the widest width and half of it; where backward rows peel at
  // those (norm_bwd.cuh's PEEL), also the widest that do not and half of it,
  // the grid rows had before they peeled: they keep its two-pass and
  // one-cluster configs, which peeled rows have not.
  int whole = vmax;
  while (op == Op::Backward && whole > 1 && peeled(op, d, whole)) whole /= 2;
  std::vector<int> vecs{vmax};
  for (int v : {vmax / 2, whole, whole / 2})
    if (v >= 1 && std::find(vecs.begin(), vecs.end(), v) == vecs.end()) vecs.push_back(v);
  for (int vec : vecs) {
    for (int tpr = 1; tpr <= 1024; tpr *= 2) {
      for (bool two_pass : {false, true}) {
        if (two_pass && vec != whole) continue;
        // Narrow rows may use a lone warp (or two) per program; otherwise 128..1024 threads.
        std::vector<int> blocks(std::begin(kBlockSizes), std::end(kBlockSizes));
        if (tpr <= 64) blocks.insert(blocks.begin(), tpr == 64 ? 64 : 32);
        for (int threads : blocks) {
          if (threads < tpr) continue;
          LaunchConfig c{vec, tpr, threads / tpr, two_pass};
          // Rows per program beyond what M needs only idle threads, but keep
          // the smallest block for each tpr.
          if (c.rows_per_pid > mb && threads > std::max(32, tpr)) continue;
          for (int cl = 1; cl <= max_cluster; cl *= 2)
            for (bool dc : {false, true}) {
              if (!dc && cl > 1 && (!clusters || c.rows_per_pid != 1 || tpr < cluster_min_tpr)) continue;
              // One cluster as the grid: decode rows.
              if (dc && (op != Op::Backward || cl == 1 || mb > kDcMaxRows || threads < 128 || tpr < 32)) continue;
              for (int st : op != Op::Backward || dc ? std::vector<int>{0}
                            : two_pass     ? std::vector<int>{0, 1, 2}
                                           : std::vector<int>{0, 2, 3})
                for (int p : op == Op::Backward && !dc ? std::vector<int>{0, 1, 2, 4} : std::vector<int>{0}) {
                  c.cluster = cl;
                  c.dw_cluster = dc;
                  c.stages = st;
                  c.programs_per_sm = p;
                  if (config_valid(op, d, v, c, nullptr, max_cluster) && std::find(out.begin(), out.end(), c) == out.end())
                    out.push_back(c);
                }
            }
        }
      }
    }
  }
  std::sort(out.begin(), out.end(),
            [](const LaunchConfig& a, const LaunchConfig& b) { return simplicity_key(a) < simplicity_key(b); });
  return out;
}

LaunchConfig fit_alignment(const LaunchConfig& cfg, Op op, const NormDesc& d,
                           const std::vector<std::pair<const void*, DType>>& pointers,
                           const std::vector<std::int64_t>& strides, const std::vector<RowPointer>& rows) {
  LaunchConfig c = cfg;
  auto addr = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  auto aligned = [&](int vec) {
    for (auto& [p, t] : pointers)
      if (p && addr(p) % (static_cast<std::uintptr_t>(vec) * dtype_size(t))) return false;
    for (auto s : strides)
      if (s % vec) return false;
    const bool peel = peeled(op, d, vec);
    const RowPointer* first = nullptr;
    for (const RowPointer& r : rows) {
      if (!r.p) continue;
      const auto size = static_cast<std::uintptr_t>(dtype_size(r.t));
      if (!peel) {
        if (addr(r.p) % (vec * size) || r.ld % vec || r.hs % vec) return false;
        continue;
      }
      // Peeled: every row starts at the same element of a vector in each tensor.
      if (addr(r.p) % size) return false;
      if (!first) {
        first = &r;
        continue;
      }
      auto residue = [&](const RowPointer& q) {
        return static_cast<std::int64_t>(addr(q.p) / dtype_size(q.t) % static_cast<std::uintptr_t>(vec));
      };
      if (residue(r) != residue(*first) || (r.ld - first->ld) % vec || (r.hs - first->hs) % vec) return false;
    }
    return true;
  };
  while (c.vec > 1 && !aligned(c.vec)) c.vec /= 2;
  // The config's own cluster is one the device has (it was resolved for it).
  const int mc = std::max(1, c.cluster);
  if (op == Op::Forward && c.vec != cfg.vec && (d.quant == QuantScaling::Group || d.quant == QuantScaling::MX)) {
    // Narrower vectors: a quantization group spans more lanes.
    const int lanes = (d.quant == QuantScaling::MX ? 32 : d.quant_group) / c.vec;
    if (lanes > 32)
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("the tensors allow only {}-element vectors: too narrow for quantization groups of {} "
                              "(align x, y and their row strides to 16 bytes)", c.vec, lanes * c.vec));
    c.threads_per_row = std::max(c.threads_per_row, lanes);
    c.rows_per_pid = std::max(1, std::min(c.rows_per_pid, 1024 / c.threads_per_row));
  }
  if (c.stages && !config_valid(op, d, c, nullptr, mc)) c.stages = 0;  // cp.async needs 4-byte chunks
  if (dweight_in_smem(op, d, c) && c.stages == 0) {
    // The row's dweight share lives in shared memory after the stages, and
    // the stages are gone: read the row twice instead, which fits any row.
    const std::int64_t chunks = ceil_div(d.N, c.vec);
    c.cluster = 1;
    c.rows_per_pid = 1;
    c.two_pass = true;
    c.threads_per_row = static_cast<int>(std::clamp<std::int64_t>(next_pow2(chunks), 32, 1024));
  }
  return c;
}

LaunchConfig fit_forward_alignment(const LaunchConfig& cfg, const NormDesc& d, const ForwardTensors& t) {
  // The residual's rows are 2-D (row r at r * ld): as heads, token t at
  // t * heads * ld and head h at h * ld.
  const std::int64_t H = d.heads;
  auto flat = [&](const void* p, DType type, std::int64_t ld) {
    return RowPointer{p, type, H > 1 ? H * ld : ld, H > 1 ? ld : 0};
  };
  // y_hp's rows are laid out as y's.
  return fit_alignment(cfg, Op::Forward, d, {{t.weight, d.weight_dtype}, {t.bias, d.weight_dtype}}, {},
                       {{t.x, d.x_dtype, d.x_ld(), H > 1 ? d.x_hs() : 0},
                        {t.y, d.y_dtype, d.y_ld(), H > 1 ? d.y_hs() : 0},
                        {t.y_hp, d.y_hp_dtype, d.y_ld(), H > 1 ? d.y_hs() : 0},
                        flat(t.residual, d.residual_dtype, d.residual ? d.residual_ld() : 0),
                        flat(t.residual_out, d.residual_out_dtype, d.store_residual_out ? d.residual_out_ld() : 0)});
}

LaunchConfig fit_backward_alignment(const LaunchConfig& cfg, const NormDesc& d, const BackwardTensors& t) {
  // The row tensors as row_strides lists them: a peeled config needs their
  // rows to start at the same column of a vector.
  const bool h3 = d.heads > 1;
  return fit_alignment(cfg, Op::Backward, d, {{t.weight, d.weight_dtype}}, {},
                       {{t.dy, d.dy_dtype(), d.dy_ld(), h3 ? d.dy_hs() : 0},
                        {t.x, d.normed_dtype(), d.residual ? d.residual_out_ld() : d.x_ld(), h3 ? d.x_hs() : 0},
                        {t.dx, d.dx_dtype(), d.dx_ld(), h3 ? d.dx_hs() : 0},
                        {t.dresidual, d.residual_out_dtype, d.has_dresidual ? d.dresidual_ld() : 0, 0}});
}

std::vector<int> simplicity_key(const LaunchConfig& c) {
  return {c.two_pass ? 1 : 0, c.cluster, c.dw_cluster ? 1 : 0, c.threads(), c.rows_per_pid, -c.vec, c.stages,
          c.programs_per_sm};
}

namespace {
// 1, or for peeled backward rows under c the least program count whose row
// step (programs x ROWS_PER_PID rows) is a whole number of vectors in every
// row tensor (at most c.vec).
std::int64_t peel_program_multiple(const NormDesc& d, const LaunchConfig& c) {
  if (!peeled(Op::Backward, d, c.vec)) return 1;
  auto whole = [&](std::int64_t k) {
    for (std::int64_t s : row_strides(Op::Backward, d))
      if (k * c.rows_per_pid * s % c.vec) return false;
    return true;
  };
  std::int64_t m = 1;
  while (!whole(m)) ++m;
  return m;
}
}  // namespace

std::int64_t backward_programs(const NormDesc& d, const LaunchConfig& c, std::int64_t resident) {
  const std::int64_t needed = ceil_div(d.M, c.rows_per_pid);
  const std::int64_t R = std::max<std::int64_t>(1, resident);
  const std::int64_t fit = std::min(needed, R);
  const std::int64_t m = peel_program_multiple(d, c);
  if (fit == needed || m == 1) return std::max<std::int64_t>(1, fit);
  // A peeled program shifts its weight once for all its rows: they start at
  // one column of a vector, so its row step (programs x ROWS_PER_PID rows)
  // is a whole number of vectors in every row tensor: programs are a
  // multiple of m, or one a row group. Rounding down to a multiple of m
  // idles up to m - 1 of the resident programs (all but m of 7 clusters of
  // 16, the H200's count); more programs than are resident run in waves,
  // each program adding a partial dweight row written, then read by the
  // finalize. Of the counts up to lcm(R, m) (waves that fill every slot) or
  // one a row group, the least time in row-group steps of one SM; within
  // one wave the most programs (the loads of more rows in flight).
  const Variant v = make_variant(Op::Backward, d);
  const double row_bytes = static_cast<double>(c.rows_per_pid) *
                           (dtype_size(v.x) + dtype_size(v.y) + dtype_size(v.dx) + (v.dres ? dtype_size(v.ro) : 0));
  const double partial = 2.0 * 4 * v.partials() / row_bytes;  // a partial row against a row-group step
  auto cost = [&](std::int64_t p) {
    return static_cast<double>(ceil_div(p, R)) * static_cast<double>(ceil_div(needed, p)) +
           static_cast<double>(p) * partial / static_cast<double>(R);
  };
  const std::int64_t last = std::min(needed, R / std::gcd(R, m) * m);
  std::int64_t best = needed;  // one program a row group: no row step to align
  for (std::int64_t p = std::max(m, R / m * m); p <= last; p += m)
    if (p < needed && cost(p) < cost(best)) best = p;
  return best;
}

Geometry launch_geometry(Op op, const NormDesc& d, const LaunchConfig& c, int sm_count, int blocks_per_sm,
                         int max_clusters) {
  Geometry g;
  g.block = static_cast<unsigned>(c.threads());
  const int cl = std::max(1, c.cluster);
  const std::int64_t needed = ceil_div(d.M, c.rows_per_pid);
  std::int64_t programs = needed;
  if (c.dw_cluster) {
    // One cluster, one program: its CTAs split the rows and write dweight.
    g.programs = 1;
    g.grid = static_cast<unsigned>(cl);
    return g;
  }
  // Cluster rows that keep their weight in shared memory (weight_smem_bytes)
  // stride over the rows from a resident grid.
  const bool persistent = op == Op::Backward || (cl > 1 && weight_smem_bytes(make_variant(op, d), c,
                                                                              static_cast<int>(d.N),
                                                                              peeled(op, d, c.vec)) > 0);
  if (persistent) {
    const int per_sm = c.programs_per_sm ? std::min(c.programs_per_sm, blocks_per_sm) : blocks_per_sm;
    std::int64_t resident = static_cast<std::int64_t>(sm_count) * std::max(1, per_sm) / cl;
    if (cl > 1 && max_clusters > 0) resident = std::min<std::int64_t>(resident, max_clusters);
    programs = op == Op::Backward ? backward_programs(d, c, resident)
                                  : std::max<std::int64_t>(1, std::min(needed, resident));
  }
  g.programs = static_cast<unsigned>(programs);
  g.grid = static_cast<unsigned>(programs * cl);
  if (op == Op::Backward && programs > 1)
    g.finalize = finalize_geometry(programs, d.N, make_variant(op, d).partials(), sm_count);
  return g;
}

FinalizeGeometry finalize_geometry(std::int64_t programs, std::int64_t N, int partials, int sm_count) {
  FinalizeGeometry f;
  f.programs = programs;
  f.N = N;
  f.partials = partials;
  for (int v : {4, 2}) {
    if (N % v == 0 && ceil_div(N, 32 * v) * std::max(1, partials) >= sm_count) {
      f.vec = v;
      break;
    }
  }
  f.tiles = static_cast<unsigned>(ceil_div(N, 32 * f.vec));
  // Slices: VEC 1 (the scalar loop), as many as leave each four rows or
  // more; wider, at most 4 rows a slice (one or two rounds of loads), and
  // 32 / VEC slices (the shared tile holds 1024 floats).
  unsigned slices = 1;
  if (f.vec == 1)
    while (slices < 32 && static_cast<std::int64_t>(slices) * 8 <= programs) slices *= 2;
  else
    while (slices < 32u / f.vec && static_cast<std::int64_t>(slices) * 4 < programs) slices *= 2;
  f.threads = 32 * slices;
  return f;
}

}  // namespace normjit::detail
