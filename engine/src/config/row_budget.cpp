#include "config/row_budget.hpp"

#include <algorithm>

#include "config/config_grid.hpp"

namespace normjit::detail {

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
    // Rows quantized with a row's or tensor's amax read them twice: up to
    // kRowAmaxWeightBytes with the row (their preludes carry it).
    s.with_row = iters * per_chunk <= (row_amax_quant(v) ? kRowAmaxWeightBytes : kUnstagedWeightBytes);
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

std::int64_t backward_stage_bytes(const Variant& v, std::int64_t N, const LaunchConfig& c, bool dw_smem) {
  const std::int64_t slice = slice_columns(N, c);
  return static_cast<std::int64_t>(c.stages) * c.rows_per_pid * slice * (dtype_size(v.x) + dtype_size(v.y)) +
         (dw_smem ? slice * (4 * v.partials() + (v.has_w ? dtype_size(v.w) : 0)) : 0);
}

}  // namespace normjit::detail
