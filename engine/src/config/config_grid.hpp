// Launch configs: the autotune grid, its declarative pruning, the heuristic,
// and the one launch-geometry function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/variant.hpp"
#include "device/device_facts.hpp"
#include "normjit/normjit.hpp"

namespace normjit::detail {

/// Per-thread register budget for caching a row, in bytes of the row's
/// dtype (forward: x, or the residual sum; backward: elements of x and dy). A block of
/// 1024 threads gets half: it may use 64 registers a thread at most.
inline constexpr int kFwdCacheBytesPerThread = 128;
inline constexpr int kBwdCachedElemsPerThread = 16;
/// Shared memory the cp.async stages and dweight sums of one backward program
/// may use (227 KiB is the most a block can have on sm_90).
inline constexpr int kMaxStageBytes = 224 * 1024;

/// Whether the backward under `cfg` keeps weight and dw sums in shared
/// memory (after its cp.async stages) because its share of a row exceeds the
/// register budget. The spec and the config rules both ask this function.
bool dweight_in_smem(Op op, const NormDesc& desc, const LaunchConfig& cfg);
/// The same with `desc`'s variant (make_variant) given.
bool dweight_in_smem(Op op, const NormDesc& desc, const Variant& v, const LaunchConfig& cfg);

/// Columns of a row one CTA holds: all N, or its slice of a cluster's row
/// (whole chunks of cfg.vec).
std::int64_t slice_columns(std::int64_t N, const LaunchConfig& cfg);

/// Whether `op`'s rows under vectors of `vec` are peeled (norm_fwd.cuh's
/// FwdRow): a forward row of plain dtypes (neither FP8 in nor out) whose row
/// strides are not all multiples of vec (an odd N, say) starts anywhere in a
/// vector; its inner chunks (wholly inside it) move as vectors, the
/// elements of its partial first and last chunk apart.
bool peeled(Op op, const NormDesc& desc, int vec);

/// A peeled row's view under vectors of `vec`: its N columns and the vec - 1
/// before it, where a row may start inside its first vector.
std::int64_t peeled_view(std::int64_t N, int vec);

/// Columns a peeled forward row's chunk slots cover under `c` (norm_fwd.cuh's
/// span_of): its view (peeled_view), or in clusters only its inner chunks,
/// at most N / vec of them (vec columns where N < vec).
std::int64_t peeled_span(std::int64_t N, const LaunchConfig& c);

/// Columns a row's chunk slots cover under `c`: N, or when peeled
/// peeled_span (forward) or peeled_view (backward: norm_bwd.cuh's
/// bwd_span_of).
std::int64_t row_span(Op op, const NormDesc& desc, const LaunchConfig& c);

/// The largest vec (elements) allowed for the dtypes `op` moves (16-byte
/// accesses) and N: one that divides every row stride, unless the rows can be
/// peeled.
int max_vec(Op op, const NormDesc& desc);
int max_vec(Op op, const NormDesc& desc, const Variant& v);

/// Every candidate config for `op` on `desc`, after the rules that need no
/// compiler: vec <= 16 bytes and <= N; threads_per_row no wider than the row
/// needs; the row fits the per-thread register budget, else two-pass with one
/// row per program; block sizes of 128..1024 (32 or 64 for a lone narrow row);
/// no more rows per program than the M bucket needs; backward grids of 1, 2
/// or 4 programs per SM or as many as fit, and rows staged through 0, 2 or 3
/// cp.async buffers where rows split into whole 4..16-byte chunks. Sorted
/// simplest first.
/// Clusters (2..max_cluster CTAs sharing a row, max_cluster = 1 on GPUs
/// without them): one row per program, rows in registers, no stages; only
/// for rows of 16 KiB or more, or M <= 32 (a decode row spread over SMs).
std::vector<LaunchConfig> candidate_grid(Op op, const NormDesc& desc, int max_cluster = 1);

/// Is `cfg` valid for `op` on `desc` (would candidate_grid's rules allow it,
/// ignoring the M-bucket rule)? `why` says which rule fails.
bool config_valid(Op op, const NormDesc& desc, const LaunchConfig& cfg, std::string* why = nullptr,
                  int max_cluster = 1);
/// The same with `desc`'s variant (make_variant) given: derived once by a
/// caller that asks about many configs (candidate_grid, the config model).
bool config_valid(Op op, const NormDesc& desc, const Variant& v, const LaunchConfig& cfg, std::string* why = nullptr,
                  int max_cluster = 1);

/// The config model (config_model.hpp): the launch config used when no
/// tuned one exists, derived from the device's facts and the shape; always a
/// member of the grid.
LaunchConfig heuristic_config(Op op, const NormDesc& desc, const DeviceFacts& dev);

/// `cfg` with its weight and bias staged (forward stages 1), where that is a
/// valid config of `desc` (config_valid: rows kept in registers, a kernel
/// that staging changes, registers that fit); else nullopt.
std::optional<LaunchConfig> staged_variant(Op op, const NormDesc& desc, const LaunchConfig& cfg,
                                           int max_cluster = kMaxCluster);
std::optional<LaunchConfig> staged_variant(Op op, const NormDesc& desc, const Variant& v, const LaunchConfig& cfg,
                                           int max_cluster = kMaxCluster);

/// The config a forward launch of `desc` runs: `cfg` with its weight and
/// bias staged (stages 1, see weight_staging) when every CTA of the launch
/// is resident at once even with the staged kernel's registers: then those
/// registers cost no CTAs, and the staging saves memory round trips of a
/// launch that waits on latency (decode, a few hundred rows). Else `cfg`.
/// Applied after the config is resolved (tuned, shipped or the model's), so
/// tuned entries and the grid hold unstaged configs only.
LaunchConfig staged_for_launch(Op op, const NormDesc& desc, const LaunchConfig& cfg, const DeviceFacts& dev);

/// A tensor of rows: its pointer (null: unused), dtype, and the element
/// strides between its tokens (ld) and heads (hs; 0 for 2-D rows), so that
/// row t * heads + h starts at element t * ld + h * hs.
struct RowPointer {
  const void* p = nullptr;
  DType t = DType::BF16;
  std::int64_t ld = 0, hs = 0;
};

/// Lowers cfg.vec until the vectors are single aligned 4/8/16-byte
/// accesses, and drops cp.async stages when a chunk becomes narrower than 4
/// bytes; keeps the rest, unless the row's dweight share needed those
/// stages: then a two-pass config. `pointers` and `strides` must be aligned
/// to whole vectors; so must `rows`, unless the config's rows are peeled:
/// then each row of every row tensor must start at the same element of a
/// vector (equal base residues, strides equal modulo vec).
LaunchConfig fit_alignment(const LaunchConfig& cfg, Op op, const NormDesc& desc,
                           const std::vector<std::pair<const void*, DType>>& pointers,
                           const std::vector<std::int64_t>& strides, const std::vector<RowPointer>& rows = {});

/// fit_alignment for a forward call's tensors (those the call leaves unused
/// null): the weight, bias and y_hp aligned; x, y, residual and
/// residual_out as rows.
LaunchConfig fit_forward_alignment(const LaunchConfig& cfg, const NormDesc& desc, const ForwardTensors& t);

/// fit_alignment for a backward call's tensors: the weight aligned; dy, x
/// (h with a fused residual add), dx and dresidual as rows.
LaunchConfig fit_backward_alignment(const LaunchConfig& cfg, const NormDesc& desc, const BackwardTensors& t);

/// Rank for ties: a smaller key is simpler (one pass, fewer threads, fewer
/// rows per program, wider vectors, register rows, the occupancy-sized grid).
std::vector<int> simplicity_key(const LaunchConfig& cfg);

/// The dweight / dbias finalize launch (dweight_finalize.cuh) over
/// `programs` partial rows of N: VEC columns a lane (4 or 2, dividing N, the
/// widest that still gives each SM a block; else 1, the scalar loop), tiles
/// of 32 x VEC columns, slices of 32 threads over the partial rows; a
/// launch a partial array (dweight, dbias: `partials`).
struct FinalizeGeometry {
  std::int64_t programs = 0, N = 0;
  int partials = 0;
  unsigned tiles = 0, threads = 0;
  int vec = 1;
};
FinalizeGeometry finalize_geometry(std::int64_t programs, std::int64_t N, int partials, int sm_count);

struct Geometry {
  unsigned grid = 0, block = 0;  ///< CTAs (a multiple of cfg.cluster) and threads per CTA
  unsigned programs = 0;         ///< programs (CTAs, or clusters): backward partial dweight rows
  FinalizeGeometry finalize;     ///< backward with more than one program: the finalize launch
};
/// The backward's persistent programs under `cfg` where `resident` of them
/// (CTAs, or clusters) run at once: min(row groups, resident); peeled rows,
/// a multiple of their row step in vectors (or one a row group), the count of
/// least time counting idle slots, waves and partial dweight rows.
std::int64_t backward_programs(const NormDesc& desc, const LaunchConfig& cfg, std::int64_t resident);

/// Grid and block of `op`. A program is a CTA, or a cluster of cfg.cluster
/// CTAs. Forward: one program per ROWS_PER_PID rows, except cluster rows
/// that keep their weight in shared memory (weight_smem_bytes), persistent
/// as the backward is. Backward: a persistent grid of min(programs needed,
/// resident programs): sm_count * P CTAs, with P = cfg.programs_per_sm
/// capped at blocks_per_sm (0: blocks_per_sm), divided by the cluster size,
/// and at most `max_clusters` clusters (the driver's count of co-resident
/// clusters; 0: unknown), peeled rows as backward_programs rounds them.
/// dw_cluster: one cluster of cfg.cluster CTAs, one program.
Geometry launch_geometry(Op op, const NormDesc& desc, const LaunchConfig& cfg, int sm_count,
                         int blocks_per_sm, int max_clusters = 0);

}  // namespace normjit::detail
