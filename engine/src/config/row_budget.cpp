#include "config/row_budget.hpp"

#include <algorithm>

#include "config/config_grid.hpp"

namespace normjit::detail {

namespace {
// Chunks of its row a forward thread keeps in registers.
int forward_iters(const LaunchConfig& c, int N, bool peel) {
  const std::int64_t chunks = slice_columns(peel ? peeled_span(N, c) : N, c) / c.vec;
  return static_cast<int>((chunks + c.threads_per_row - 1) / c.threads_per_row);
}

// Unstaged rows that store residual_out with two chunks a thread or more:
// they load every chunk of x and residual before any store (norm_fwd.cuh
// LATE_RES).
bool late_res_rows(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  return v.store_res && !c.stages && !c.two_pass && forward_iters(c, N, peel) > 1 && (peel || N % c.vec == 0) &&
         !v.xgroup;
}

// forward_register_need without the staged weight and bias, nor u kept.
int row_register_base(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  const bool ln = v.norm == NormKind::LayerNorm;
  const int fp32_sum = v.residual && dtype_size(v.h) == 4 ? 8 : 0;  // a residual summed in fp32
  if (c.two_pass) return 32 + (ln ? 8 : 0) + fp32_sum;
  const int elems = forward_iters(c, N, peel) * c.vec;
  // A cluster's slice of a 16-bit row without a residual stays packed, two
  // elements a register: norm_fwd.cuh widens it again for each pass over
  // the row (repack) rather than keep the fp32 copies. v8 slices of 32-64
  // elements a thread (v8.t256 at N = 32768-262144 in clusters of 2-16)
  // then fit 64 registers with no stack frame (LayerNorm 63-64), four CTAs
  // an SM: 128 KB of loads in flight (H200: 1.03-1.14x over three CTAs,
  // rms bf16 4096x65536 90.6% -> 95.3% of the copy). Left alone by the
  // template, ptxas kept the fp32 copies (80 registers, three CTAs; at 64 a
  // 64-byte stack). Other slices: elems / 2 + 8 (at elems / 2 - 8, slices
  // of 8-16 elements spilled). It spilled at 72 for a v8.t128 slice of 64,
  // and at 128 for slices of 128 elements: those keep a register an element.
  const bool packed = c.row_split() > 1 && !v.residual && dtype_size(v.h) == 2 && elems <= 64;
  // (Slices whose last chunk not every thread holds spilled 24 bytes at 64
  // registers, rms bf16 N = 100000, and still ran 1.05x as fast as at 80.)
  const int held = !packed ? elems : c.vec == 8 && elems >= 32 ? elems / 2 - (ln ? 12 : 8) : elems / 2 + 8;
  // LATE_RES rows: half a register an element more, plus 8 (ptxas,
  // unbounded, took 56-134 registers over 13 such kernels; rms bf16
  // 4096x2048 v8.t128.r1 spilled at 48, fp16 4096 v8.t64.r1 at 128).
  // Peeled rows: their edges and bounds, 16; packed v8 slices of 32-64
  // elements, LayerNorm 4 and RMSNorm 12: the lowest bounds at which ptxas
  // spilled nothing over slices of 40-64 elements in clusters of 4-16
  // (RMSNorm held more: a slice of 48 spilled at 64 registers, LayerNorm's
  // of 56 did not). At four CTAs of 256 where 16 had held three: H200, ln
  // bf16 3000x98305 v8.t256.r1.c8 543.7 -> 468.9 us, rms bf16 4096x65537
  // 406.5 -> 347.2. (Not the staged ones: they spilled at those bounds; nor
  // v4 slices and v8.t512 slices of 24 elements: unbounded they held 40-47
  // registers, and bounded to two CTAs ptxas took 56.)
  const bool packed_peel = packed && c.vec == 8 && elems >= 32 && !c.stages;
  return 24 + held + (elems >= 16 ? 8 : 0) + (ln ? 4 : 0) + (c.row_split() > 1 ? 8 : 0) +
         (peel ? (packed_peel ? (ln ? 4 : 12) : 16) : 0) + fp32_sum +
         (late_res_rows(v, c, N, peel) ? std::max(16, elems / 2 + 8) : 0);
}

// Rows that keep u: their scales' maxima and the weight loaded with the row
// (ptxas took up to 74 registers for 32 elements, 99 for 64).
constexpr int kKeepURegisters = 16;

// The CTAs of `threads` an SM holds when each thread needs `need`
// registers. `smsp`: each of an SM's 4 schedulers has a quarter of the
// register file for the warps it holds, and ptxas caps a thread at what the
// fullest one allows (9 CTAs of 64 threads: 5 warps on one, 96 registers,
// not 113: a group128 row of 64 elements spilled, and so did an fp16
// residual row of 4096, v8.t64.r1). Counted for the rows that keep u and
// LATE_RES rows; the other kernels' bounds predate it, and their tuned
// entries were measured with them.
int ctas_for(int threads, int need, bool smsp) {
  const DeviceFacts sm90;  // its per-SM limits: those of sm_80 and sm_90
  const int alloc = (need + 7) / 8 * 8;  // allocated per warp in 8s a thread
  int b = std::max(1, std::min({sm90.regs_per_sm / (threads * alloc), sm90.max_threads_per_sm / threads,
                                sm90.max_blocks_per_sm}));
  const int warps = (threads + 31) / 32;
  while (smsp && b > 1 && (b * warps + 3) / 4 * 32 * alloc > sm90.regs_per_sm / 4) --b;
  return b;
}

// forward_register_need without the staged weight and bias. keeps_u's
// variants count kKeepURegisters whether a config keeps u or not: without
// u they hold the row and its weight, and ptxas, unbounded, took as many
// or more (128 registers for a 64-thread token row of 4096; counted as
// the row's alone, the config model chose a 512-thread row of 7168 that ran
// 2.1x as long as the 128-thread row that keeps u).
int row_register_need(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  const bool weights_early = keeps_u(v) && !c.stages && !c.two_pass;
  return row_register_base(v, c, N, peel) + (weights_early ? kKeepURegisters : 0);
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

bool keeps_u_rows(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  // (A cluster's slices: group scales of kept u index groups from the row's start.)
  if (!keeps_u(v) || c.stages || c.two_pass || c.row_split() > 1) return false;
  // Only where an SM still holds two CTAs: one CTA an SM cannot overlap a
  // row's stores with another row's loads (a 512-thread token row of 16384
  // keeping u took 74 registers, one CTA an SM, where 64 fit two: 0.72x the
  // speed on an H200), and 1024-thread rows spilled at their 64 registers.
  return ctas_for(c.threads(), row_register_need(v, c, N, peel), true) >= 2;
}

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
    // Rows quantized with a row's or tensor's amax, and rows that keep u,
    // need them before the reduction: up to kRowAmaxWeightBytes with the row
    // (their preludes carry it).
    const bool early = row_amax_quant(v) || keeps_u_rows(v, c, N, peel);
    s.with_row = iters * per_chunk <= (early ? kRowAmaxWeightBytes : kUnstagedWeightBytes);
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

namespace {
// forward_register_need before the persistent rows' share.
int held_register_need(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  const int staged = c.stages && !c.two_pass ? staged_registers(v, weight_staging(v, c, N, peel).bytes) : 0;
  return row_register_need(v, c, N, peel) + staged;
}
// The persistent rows' loop (its row, stride and the exchange's round): at
// the packed slices' 64 registers ptxas spilled 64 bytes.
constexpr int kPersistentRegisters = 16;
}  // namespace

int weight_smem_bytes(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  const int chunk = c.vec * dtype_size(v.w);
  const int per_chunk = chunk * ((v.has_w ? 1 : 0) + (v.has_b ? 1 : 0));
  // RMSNorm rows of a 16-bit weight in clusters of 16: an SM's CTAs of
  // smaller clusters more often share their slice of the weight, found in
  // L1 (H200, persistent / not: c16 1.06-1.16x; c8 0.96-1.10x, c4
  // 0.95-1.00x; fp32 c16 0.82x, LayerNorm c16 0.96x, both at a CTA an SM
  // fewer).
  // (Not measured, and left out: rows after a residual add.)
  if (c.row_split() < 16 || v.norm != NormKind::RMSNorm || dtype_size(v.w) != 2 || v.residual ||
      v.quant != QuantScaling::None ||
      v.xgroup || c.two_pass || c.stages || peel || N % c.vec || per_chunk == 0 || chunk < 4)
    return 0;
  const int iters = forward_iters(c, N, peel);
  if (iters * per_chunk <= kUnstagedWeightBytes) return 0;  // loaded with the row
  const int bytes = iters * per_chunk * c.threads();
  // Only where the SM still holds the CTAs its registers allow.
  const int ctas = ctas_for(c.threads(), held_register_need(v, c, N, peel) + kPersistentRegisters, false);
  if (ctas * (bytes + kForwardStaticSmemBytes + kDriverSmemPerCta) > DeviceFacts{}.smem_per_sm) return 0;
  return bytes;
}

int forward_register_need(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  return held_register_need(v, c, N, peel) + (weight_smem_bytes(v, c, N, peel) > 0 ? kPersistentRegisters : 0);
}

namespace {
// Peeled rows, one a 512-thread CTA, that forward_register_need (`need`)
// leaves at one CTA an SM, holding at most kPeelTwoCtaElems elements a
// thread, unquantized register rows without a residual: their prelude
// bounds them to two CTAs, 64 registers (ptxas spills 24-88 bytes of them).
bool peel_two_ctas(const Variant& v, const LaunchConfig& c, int N, bool peel, int need) {
  // Left unbounded, ptxas gave a peeled row of 56 elements a thread 99-113
  // registers (its even twin of the same chunks 64), one CTA an SM. Bounded
  // to two (H200, A/B, no cache, v8.t512.r1): ln fp16 3000x16385 1.48x, ln
  // bf16 8192x16385 1.44x, 1500x20003 1.29x, rms bf16 4096x20481 1.28x,
  // 2048x24577 1.09x, ln fp16 2000x27775 (56 elements) 1.07x; rows of 64
  // elements lost to their spills (rms fp16 300x30001 0.88x, 4000x30001
  // and 1024x31999 0.92x). Not programs of several rows (v8.t128.r4 and
  // v8.t32.r16, 512 threads, lost 0.79-0.84x) nor rows with a residual (ln
  // bf16 2048x24577:res 0.54x).
  return peel && v.quant == QuantScaling::None && !v.xgroup && !v.residual && !c.two_pass && c.threads() == 512 &&
         c.rows_per_pid == 1 && c.row_split() == 1 && forward_iters(c, N, peel) * c.vec <= kPeelTwoCtaElems &&
         ctas_for(c.threads(), need, late_res_rows(v, c, N, peel)) == 1;
}
}  // namespace

int forward_min_blocks(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  // Two-pass rows hold no row: ptxas's own choice is small (32 registers),
  // and a bound made it worse (64 and a stack frame for LayerNorm fp32).
  const bool keep_u = keeps_u_rows(v, c, N, peel);
  if ((v.quant != QuantScaling::None && !keep_u) || v.xgroup || c.two_pass) return 1;
  const int need = forward_register_need(v, c, N, peel);
  if (peel_two_ctas(v, c, N, peel, need)) return 2;
  return ctas_for(c.threads(), need, keep_u || late_res_rows(v, c, N, peel));
}

bool weight_read_only(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  if (c.row_split() < 2 || peel || N % c.vec || (!v.has_w && !v.has_b)) return false;
  const int bound = thread_register_cap(forward_min_blocks(v, c, N, peel) * c.threads());
  return forward_register_need(v, c, N, peel) + kReadOnlyWeightRegisters <= bound;
}

int forward_register_budget(const Variant& v, const LaunchConfig& c, int N, bool peel) {
  const int need = forward_register_need(v, c, N, peel);
  return peel_two_ctas(v, c, N, peel, need) ? thread_register_cap(2 * c.threads()) : need;
}

std::int64_t backward_stage_bytes(const Variant& v, std::int64_t span, const LaunchConfig& c, bool dw_smem) {
  const std::int64_t slice = slice_columns(span, c);
  return static_cast<std::int64_t>(c.stages) * c.rows_per_pid * slice * (dtype_size(v.x) + dtype_size(v.y)) +
         (dw_smem ? slice * (4 * v.partials() + (v.has_w ? dtype_size(v.w) : 0)) : 0);
}

DcBatch dc_batch(const Variant& v, std::int64_t N, const LaunchConfig& c) {
  const std::int64_t slice = slice_columns(N, c);
  const int sums = v.norm == NormKind::LayerNorm ? 2 : 1;
  auto pad16 = [](std::int64_t b) { return (b + 15) / 16 * 16; };
  // The row groups' dw / db sums take the rows' place after the last batch.
  const std::int64_t red = c.rows_per_pid > 1 ? pad16((c.rows_per_pid - 1) * v.partials() * slice * 4) : 0;
  auto bytes = [&](std::int64_t r) {
    const std::int64_t rows = pad16(r * slice * dtype_size(v.x)) + pad16(r * slice * dtype_size(v.y)) +
                              (v.dres ? pad16(r * slice * dtype_size(v.ro)) : 0);
    return std::max(rows, red) + (v.has_w ? pad16(slice * dtype_size(v.w)) : 0) +
           4 * (2 * c.cluster * r * sums + r * sums + 2 * r);
  };
  DcBatch b;
  for (int r = 1; r <= kDcMaxRows && bytes(r) <= kMaxStageBytes; r *= 2) b = {r, bytes(r)};
  return b;
}

}  // namespace normjit::detail
