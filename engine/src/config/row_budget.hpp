// The row-budget rules of the forward: how a thread holding its row in
// registers loads weight and bias, the registers it needs, and from them the
// CTAs an SM holds. Read by the grid's validity rules, the config model and
// the kernel prelude (compile/specialization.cpp).
#pragma once

#include "core/variant.hpp"
#include "normjit/normjit.hpp"

namespace normjit::detail {

/// How a forward thread that keeps its row in registers loads the weight
/// and bias of its chunks. Its pointers are not restrict, so the compiler
/// keeps every load behind the stores before it: chunk by chunk, a
/// load-store pair waits one memory round trip each (8 for a 128-thread row
/// of 7400 bf16). with_row: all of them with the row, before the reduction;
/// else `batch` chunks at a time after it, all loaded before their stores.
/// cfg.stages 0 (unstaged, what the grid holds): with the row up to
/// kUnstagedWeightBytes, else one chunk at a time, so the row's registers
/// alone decide how many CTAs an SM holds. cfg.stages 1 (staged,
/// launch_config's choice for launches whose CTAs are all resident at once,
/// where registers cost no CTAs): up to kWeightStagingBytes at once, as far
/// as a thread's registers allow. The prelude carries both as WB_WITH_ROW
/// and WB_BATCH.
struct WeightStaging {
  bool with_row = false;
  int batch = 1;  ///< chunks whose weight and bias load at once
  int bytes = 0;  ///< bytes of weight and bias a thread holds at once
};
inline constexpr int kUnstagedWeightBytes = 32;
/// Unstaged rows quantized with one scale a row or tensor (token, tensor, a
/// static scale that writes amax: row_amax_quant) and rows that keep u
/// (keeps_u_rows) need their weight and bias before the reduction: they
/// hold them from the row's load up to this many bytes a thread, and their
/// preludes carry the choice (WB_WITH_ROW).
inline constexpr int kRowAmaxWeightBytes = 128;
/// Whether `v`'s forward measures each row's amax before its first store
/// (a token or tensor scale, or a static scale that writes amax).
inline bool row_amax_quant(const Variant& v) {
  return v.quant == QuantScaling::Token || v.quant == QuantScaling::Tensor ||
         (v.quant == QuantScaling::TensorStatic && v.store_amax);
}
/// Whether `v`'s forward may keep u = h * w' of its row (fp32, in
/// registers) from the row's load to its stores: RMSNorm rows with a
/// quantized y and neither the Llama cast nor a bias, whose y = u * rstd.
/// They read their weight once, in the pass that sums, and take the maxima
/// of y (a row's, a group's) from u's: rounding is monotonic, so
/// max|fl(u * rstd)| = fl(max|u| * rstd) exactly. Measured on an H200 and
/// left out: a static scale that writes no amax (it takes no maximum, and
/// holds its row in the 16-bit dtype, half the registers: keeping u,
/// 16384x7168 ran at 83% of the copy, not 101%), tensor (current) scaling
/// (5-10% slower) and a residual added before group or MX scales (73-82%
/// of the copy, not 80-92%).
inline bool keeps_u(const Variant& v) {
  const bool grouped = v.quant == QuantScaling::Group || v.quant == QuantScaling::MX;
  return v.quant != QuantScaling::None && !(v.quant == QuantScaling::TensorStatic && !v.store_amax) &&
         v.quant != QuantScaling::Tensor && !(v.residual && grouped) && v.norm == NormKind::RMSNorm && !v.llama &&
         !v.has_b;
}
/// Whether the forward of `v` under `cfg` keeps u (the prelude's KEEP_U):
/// keeps_u's rows, unstaged and in registers, where an SM still holds two
/// CTAs of them (see forward_register_need).
bool keeps_u_rows(const Variant& v, const LaunchConfig& cfg, int N, bool peel);
inline constexpr int kWeightStagingBytes = 128;
WeightStaging weight_staging(const Variant& v, const LaunchConfig& cfg, int N, bool peel);

/// Shared memory (bytes) in which a CTA of an unquantized RMSNorm row of a
/// 16-bit weight split over a cluster of 16 CTAs keeps its slice's weight
/// (the prelude's WB_SMEM; 0: none). Such
/// rows are persistent: a resident grid of clusters strides over the rows
/// (launch_geometry), the weight and bias copied once a CTA (cp.async) and
/// read from shared memory by every row's stores. Loaded a chunk at a time
/// after each row's reduction (the slices of weight_staging's unstaged
/// rows past kUnstagedWeightBytes), they were as much L2 traffic as the
/// row's x. Not for staged, two-pass or peeled rows, FP8 x, chunks under 4
/// bytes, nor where the bytes would cost the SM CTAs its registers allow.
int weight_smem_bytes(const Variant& v, const LaunchConfig& cfg, int N, bool peel);
/// A forward CTA's static shared memory, about (its reduction and cluster
/// exchange arrays), and what the driver reserves for each CTA (bytes).
inline constexpr int kForwardStaticSmemBytes = 2048;
inline constexpr int kDriverSmemPerCta = 1024;

/// Registers a thread of the forward kernel of `v` under `cfg` needs to keep
/// its row without spilling (N: the row's columns; peel: peeled rows), and
/// from it the CTAs of cfg.threads() an SM can hold at once: the kernel is
/// compiled with __launch_bounds__(threads, min blocks), so ptxas keeps its
/// registers within 65536 / (min blocks * threads), and the config model
/// counts that many programs an SM. The need: 24, one register per element
/// a thread caches (16-bit rows are widened to fp32), 8 more from 16
/// elements on, and shares for LayerNorm's second sum (4), a cluster's
/// exchange (8), peeled edges (16), a residual summed in fp32 (8), u kept
/// (16: keeps_u_rows) and, when
/// staged (cfg.stages 1), the weight and bias weight_staging holds;
/// two-pass rows 32 (LayerNorm 40) and the fp32 sum's share.
/// Fitted to the lowest register caps at which ptxas (CUDA 13.0, sm_90)
/// spilled nothing over the forward grids of 22 shapes (every dtype, both
/// norms, residual, odd N, clusters); tests/test_nvrtc_compile.cpp checks
/// that the grids it compiles spill nothing. Rows that keep u take the same
/// rule, with the register file split among an SM's 4 schedulers (left to
/// itself ptxas took 74 registers for a 512-thread token row of 16384).
/// Other quantized, FP8-input and two-pass kernels: 1 (ptxas chooses). The
/// register file (65536) and the 2048 threads and 32 CTAs an SM are those
/// of sm_80 and sm_90.
int forward_register_need(const Variant& v, const LaunchConfig& cfg, int N, bool peel);
/// Registers a thread of a `threads`-thread block may hold: 65536 a CTA, 255 a thread.
int thread_register_cap(int threads);
/// Elements a thread up to which a peeled 512-thread row that
/// forward_register_need leaves at one CTA an SM is bounded to two
/// (row_budget.cpp's peel_two_ctas; rows of 64 lost to their spills).
inline constexpr int kPeelTwoCtaElems = 56;
/// The CTAs an SM holds of the forward kernel of `cfg`: the prelude's
/// launch bound (NJ_MIN_BLOCKS where > 1), the two of peel_two_ctas included.
int forward_min_blocks(const Variant& v, const LaunchConfig& cfg, int N, bool peel);
/// Whether a forward cluster row under `cfg` (a CTA's slice, its weight and
/// bias loaded after the reduction) reads them through the read-only path
/// (the prelude's WB_RO): plain, each chunk's load waited for the store
/// before it (a y that may alias the weight), an L2 round trip a chunk.
/// ptxas then hoists the loads as far as the launch bound allows, so only
/// where forward_register_need leaves kReadOnlyWeightRegisters under it: at
/// the bound, 16-bit slices of 64 elements a thread spilled 8 bytes (there
/// RMSNorm rows read all chunks' weight but the last read-only instead, in
/// norm_fwd.cuh; LayerNorm rows keep plain loads).
bool weight_read_only(const Variant& v, const LaunchConfig& cfg, int N, bool peel);
inline constexpr int kReadOnlyWeightRegisters = 4;
/// The registers a thread of that kernel counts on: forward_register_need,
/// or the two-CTA cap of a peeled row bounded to two (what the config model
/// prices).
int forward_register_budget(const Variant& v, const LaunchConfig& cfg, int N, bool peel);

/// Shared memory (bytes) a backward CTA under `cfg` stages its rows in: its
/// cp.async stages of x and dy (cfg.stages rows of its slice each), and, when
/// its slice's weight and dweight sums live in shared memory (dw_smem,
/// config_grid.hpp's dweight_in_smem), those after them. The grid's budget
/// (kMaxStageBytes) and the launch's dynamic shared memory both read this.
/// `span`: the columns a row's chunks cover (config_grid.hpp's row_span).
std::int64_t backward_stage_bytes(const Variant& v, std::int64_t span, const LaunchConfig& cfg, bool dw_smem);

/// The decode backward (cfg.dw_cluster, norm_bwd.cuh's norm_bwd_dc) stages
/// its CTA's slice of `rows` rows at a time in shared memory: x, dy and
/// dresidual slices (after the last batch, the row groups' dweight / dbias
/// sums in their place), the slice's weight, the cluster's row-sum buffers
/// and the rows' statistics, `bytes` in all (the kernel's layout, 16-byte
/// aligned arrays). rows: the largest power of two up to kDcMaxRows whose
/// bytes fit kMaxStageBytes; 0 where not even one row fits.
struct DcBatch {
  int rows = 0;
  std::int64_t bytes = 0;
};
inline constexpr int kDcMaxRows = 64;
DcBatch dc_batch(const Variant& v, std::int64_t N, const LaunchConfig& cfg);

}  // namespace normjit::detail
