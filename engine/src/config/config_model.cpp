#include "config/config_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "config/row_budget.hpp"
#include "core/variant.hpp"

namespace normjit::detail {

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Parameter slots (one meaning per op where it differs).
enum : int {
  kL0,        // fwd: a program's fixed latency (load, store); bwd: a row iteration's
  kLred,      // per halving step of a row reduction
  kLsync,     // a block-wide reduction (more than one warp a row)
  kLcl,       // a cluster's exchange through distributed shared memory
  kLk,        // per vector load in one thread's chain
  kReg0,      // bwd: registers of a thread besides its cached row (fwd: forward_register_need instead)
  kTail,      // fwd: the last round's share; bwd: overlap of a staged row's latency (0..1)
  kClPack,    // fwd: slots clusters lose to GPC packing, per 1024 threads of a cluster; bwd: share of the
              // slots clusters of 8 or 16 CTAs can fill
  kBwEff,     // share of the memory bandwidth a streaming kernel draws
  kTwoPass,   // fwd: a second pass's latency (from L2) as a share of L0; bwd: the finalize launch (ns)
  kRows,      // per doubling of the rows a program handles at once (bwd: dweight staging)
  kVec16,     // extra share of Lk a 16-byte vector load costs over a narrower one
  kClLog,     // per doubling of the cluster size, on top of Lcl
  kSmBw,      // bytes an SM moves per clock at most (its own limit when few SMs share DRAM)
  kAdd,       // share of the shorter of latency and transfer time not hidden by the other
  kCta,       // fwd: per CTA an SM starts (dispatch; the tiny CTAs of narrow rows); bwd: a dw_cluster grid's
              // own cost (its cluster launch, a batch's load latency and its barriers)
  kDcStep,    // bwd: a dw_cluster CTA's time per KiB of its rows moved (loaded, summed, written)
};

// Programs (CTAs) one SM holds at once: threads, registers (allocated per
// warp in units of 8 per thread) and shared memory.
int resident_ctas(const DeviceFacts& dev, int threads, double regs, std::int64_t smem) {
  const int r_alloc = static_cast<int>(std::ceil(std::max(24.0, regs) / 8) * 8);
  int r = std::min(dev.max_blocks_per_sm, dev.max_threads_per_sm / threads);
  r = std::min(r, std::max(1, dev.regs_per_sm / (threads * r_alloc)));
  if (smem > 0) r = std::min<std::int64_t>(r, std::max<std::int64_t>(1, dev.smem_per_sm / (smem + kDriverSmemPerCta)));
  return std::max(1, r);
}

// Rounds of `ctas` programs over `slots` resident ones: a partly filled last
// round costs `tail` of a round or its share, whichever is more.
double rounds_of(double ctas, double slots, double tail) {
  const double n = ctas / slots;
  if (n <= 1) return 1;
  const double whole = std::floor(n);
  return whole + std::min(1.0, n - whole > 0 ? n - whole + tail : 0.0);
}
}  // namespace

const char* ModelParams::name(int i) {
  static const char* names[kCount] = {"L0",     "Lred",   "Lsync",    "Lcl",  "Lk",   "reg0",
                                      "tail",   "clpack", "bw_eff",   "two_pass", "Lrows", "vec16", "Lcl_log", "sm_bw",
                                      "add",    "Lcta",   "Ldc"};
  return i >= 0 && i < kCount ? names[i] : "?";
}

double predicted_ns(Op op, const NormDesc& d, const LaunchConfig& c, const DeviceFacts& dev, const ModelParams& mp) {
  return predicted_ns(op, d, make_variant(op, d), c, dev, mp);
}

namespace {
// Does a forward launch of `d` under `c` hold every CTA resident at once
// (one wave: decode rows), with the registers of c's kernel? `v` is d's
// variant.
bool one_wave(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c, const DeviceFacts& dev) {
  const int cl = c.row_split();
  const double regs = forward_register_budget(v, c, static_cast<int>(d.N), peeled(op, d, c.vec));
  const std::int64_t slots =
      static_cast<std::int64_t>(std::max(1, dev.sm_count) / cl) * cl * resident_ctas(dev, c.threads(), regs, 0);
  return ceil_div(d.M, c.rows_per_pid) * cl <= slots;
}

// The staged variant of `c` where a launch of `d` runs it (it exists and
// its launch is one wave), else nothing.
std::optional<LaunchConfig> staged_launch(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c,
                                          const DeviceFacts& dev) {
  const auto s = d.M > 0 ? staged_variant(op, d, v, c, std::max(dev.max_cluster, c.cluster)) : std::nullopt;
  return s && one_wave(op, d, v, *s, dev) ? s : std::nullopt;
}
}  // namespace

namespace {
// The terms both ops' prices share: the constants, the device's bandwidths,
// and the config's row slice, vectors per thread and reduction.
struct Terms {
  const std::array<double, ModelParams::kCount>& p;
  int sms;
  double bw;     // bytes per ns, all SMs
  double sm_bw;  // bytes per ns, one SM
  int cl;        // CTAs sharing a row
  std::int64_t slice;
  int threads;
  double k;  // vectors per thread
  double red, needed, lk, rows_cost;

  Terms(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c, const DeviceFacts& dev,
        const std::array<double, ModelParams::kCount>& params)
      : p(params),
        sms(std::max(1, dev.sm_count)),
        bw(dev.memory_gbps * p[kBwEff]),
        sm_bw(p[kSmBw] * dev.sm_clock_ghz),
        cl(c.row_split()),
        slice(slice_columns(row_span(op, d, c), c)),
        threads(c.threads()),
        k(static_cast<double>(ceil_div(slice / c.vec, c.threads_per_row))) {
    red = p[kLred] * std::log2(std::max(2, c.threads_per_row)) + (c.threads_per_row > 32 ? p[kLsync] : 0) +
          (cl > 1 ? p[kLcl] + p[kClLog] * std::log2(cl) : 0);
    needed = static_cast<double>(ceil_div(d.M, c.rows_per_pid));
    const int vec_bytes = c.vec * dtype_size(op == Op::Forward ? v.x : v.y);
    lk = p[kLk] * (1 + (vec_bytes >= 16 ? p[kVec16] : 0));
    rows_cost = p[kRows] * std::log2(c.rows_per_pid);
  }

  // A round of `conc` programs of `bytes` each on `used` SMs: latency t, and
  // the transfer at the lesser of DRAM's and the SMs' own bandwidth; the SM
  // moves sm_bytes (a two-pass row's second read, from L2, too). `own`
  // (forward): a program's own bytes move at its SM's share of the bandwidth
  // after its latency chain, so one program per SM cannot hide them.
  double round_ns(double t, double conc, double bytes, double sm_bytes, double used, bool own) const {
    const double xfer = std::max(conc * bytes / bw, conc / used * sm_bytes / sm_bw);
    const double chain = own ? t + sm_bytes / std::min(bw / used, sm_bw) : t;
    return std::max(chain, xfer) + p[kAdd] * std::min(t, xfer);
  }
};

// A peeled row (a vector width that does not divide N: its rows start
// anywhere inside a vector) moves its edges element by element and tests
// each chunk against the row's span, work the other terms do not see: the
// model priced such a config as its unpeeled twin of half the vector and
// twice the threads, and took it on the grid's order. On the recorded grids
// (autotune_cache/model/, 1102 forward shapes; normjit_fit_model --dump)
// 10% moves 20 picks, 18 of them to a config faster by more than 2%, by up to
// 1.4x at decode (H200 rms bf16 4x180: v8.t32.r1 1.40 of the fastest,
// v4.t64.r1 1.00; ln bf16 6x484 1.34 -> 1.00; H100 ln bf16 21x500 1.30 ->
// 1.00), one 3% more (H200 rms bf16 2113x308 with a residual). Any share
// from 1% to 20% picks alike: odd N, where every vector peels, is unmoved.
constexpr double kPeelCost = 0.1;

// Forward: one program per ROWS_PER_PID rows (see the header).
double forward_ns(const NormDesc& d, const Variant& v, const LaunchConfig& c, const DeviceFacts& dev,
                  const Terms& T) {
  const auto& p = T.p;
  const int nin = v.residual ? 2 : 1;
  const double read = dtype_size(v.x) + (v.residual ? dtype_size(v.r) : 0);
  const double write = dtype_size(v.y) + (v.store_res ? dtype_size(v.ro) : 0);
  const bool peel = peeled(Op::Forward, d, c.vec);
  // The kernel is compiled to hold forward_min_blocks CTAs an SM (its
  // registers capped to fit them): the same count here, within the
  // device's thread and block limits.
  const double regs = forward_register_budget(v, c, static_cast<int>(d.N), peel);
  const int r = resident_ctas(dev, T.threads, regs, 0);
  const double ctas = T.needed * T.cl;
  // A cluster starts only when a GPC has room for all of its CTAs at once:
  // the larger its threads, the more room stays idle waiting.
  const double slots =
      static_cast<double>(T.sms) * r / (T.cl > 1 ? 1 + p[kClPack] * T.cl * T.threads / 1024.0 : 1.0);
  const double bytes = static_cast<double>(c.rows_per_pid) * T.slice * (read + write);
  double t1 = p[kL0] + T.red + T.lk * T.k * nin + T.rows_cost;
  if (c.two_pass)  // the row streams through twice, 4 chunks in flight at a time; the second pass hits L2
    t1 = p[kL0] * std::ceil(T.k / 4) * (1 + p[kTwoPass]) + T.red + 2 * T.lk * T.k * nin + T.rows_cost;
  const double conc = std::min(ctas, slots);
  double sm_bytes = c.two_pass ? static_cast<double>(c.rows_per_pid) * T.slice * (2 * read + write) : bytes;
  // A cluster row reads its CTA's weight (and bias) slice again with every
  // row, unless it keeps it in shared memory (weight_smem_bytes). An SM's
  // CTAs take the slices in turn; where the whole weight does not stay in
  // L1 beside their shared memory, the reads come from L2 and count among
  // the bytes the SM moves, as a two-pass row's second read does. (Without
  // a weight rms bf16 256x262144 ran at 102% of the copy, with it 84%.)
  const int wb = (v.has_w ? 1 : 0) + (v.has_b ? 1 : 0);
  const double weight_bytes = static_cast<double>(d.N) * dtype_size(v.w) * wb;
  if (T.cl > 1 && !c.two_pass && wb > 0 && weight_smem_bytes(v, c, static_cast<int>(d.N), peel) == 0 &&
      weight_bytes > static_cast<double>(dev.l1_smem_per_sm - r * kForwardStaticSmemBytes))
    sm_bytes += static_cast<double>(c.rows_per_pid) * T.slice * dtype_size(v.w) * wb;
  const double round = T.round_ns(t1, conc, bytes, sm_bytes, std::min<double>(T.sms, conc), true);
  const double t = rounds_of(ctas, slots, p[kTail]) * round + p[kCta] * std::ceil(ctas / T.sms);
  // Tensor (current) scaling runs in one launch only where one cluster holds
  // a program for every row group (launch_rows; not rows split over
  // clusters); else amax is zeroed, then a pass measures it and a second
  // quantizes: a second launch's latency and the rows read again.
  if (v.quant == QuantScaling::Tensor && (T.needed > dev.max_cluster || T.cl > 1)) return 2 * t;
  return t * (peel ? 1 + kPeelCost : 1.0);
}

// Backward: persistent programs stream their rows (launch_geometry).
double backward_ns(const NormDesc& d, const Variant& v, const LaunchConfig& c, const DeviceFacts& dev,
                   const Terms& T) {
  const auto& p = T.p;
  const double read = dtype_size(v.x) + dtype_size(v.y) + (v.dres ? dtype_size(v.ro) : 0);
  const double write = dtype_size(v.dx);
  const double row_regs = T.k * c.vec * (dtype_size(v.x) + dtype_size(v.y)) / 4.0;
  const double regs = p[kReg0] + (c.two_pass ? 8 : row_regs * (c.stages ? 1 : 2));
  const std::int64_t smem =
      static_cast<std::int64_t>(c.stages) * c.rows_per_pid * T.slice * (dtype_size(v.x) + dtype_size(v.y));
  const int r = resident_ctas(dev, T.threads, regs, smem);
  const int per_sm = c.programs_per_sm ? std::min(c.programs_per_sm, r) : r;
  const double resident = std::max(1.0, std::floor(static_cast<double>(T.sms) * per_sm / T.cl) *
                                            (T.cl >= 8 ? p[kClPack] : 1.0));
  if (c.dw_cluster) {
    // One cluster (norm_bwd_dc), its batches one after another: a batch's
    // copies all in flight (its latency is in Lcta), its bytes at the rate
    // one SM moves them through the phases (Ldc a KiB), and its row steps at
    // a reduction step's cost: a warp sums rows of the slice (32 chunks a
    // step), a thread writes dx of its group's rows, and at the end adds
    // the other groups' dweight sums.
    const DcBatch b = dc_batch(v, d.N, c);
    const double M = static_cast<double>(std::max<std::int64_t>(1, d.M));
    const double rows = std::min<double>(M, b.rows);
    const double warps = std::max(1, T.threads / 32);
    const double steps = std::ceil(rows / warps) * std::ceil(T.slice / c.vec / 32.0) +
                         std::ceil(rows / c.rows_per_pid) * T.k + (c.rows_per_pid - 1) * T.k;
    const double t_batch = rows * T.slice * (read + write) / 1024 * p[kDcStep] + steps * p[kLred];
    return std::ceil(M / b.rows) * (t_batch + p[kCta] + p[kLcl] + p[kClLog] * std::log2(c.cluster));
  }
  // Peeled rows round the programs (backward_programs): past the resident
  // ones, the rest run in waves.
  const auto programs = static_cast<double>(backward_programs(d, c, static_cast<std::int64_t>(resident)));
  const double waves = std::ceil(programs / resident);
  const double iterations = std::ceil(T.needed / programs);
  const double ctas = std::min(programs, resident) * T.cl;
  double bytes = static_cast<double>(c.rows_per_pid) * T.slice * (read + write);
  double t_row = p[kL0] * (c.stages >= 2 ? p[kTail] : 1.0) + 2 * T.red + T.lk * T.k * 2 + T.rows_cost;
  if (c.two_pass) {  // with a stage or without: measured within 10% of each other either way
    bytes = static_cast<double>(c.rows_per_pid) * T.slice * (read * 2 + write);
    t_row = 2 * (p[kL0] * std::ceil(T.k / 4) + T.red + T.lk * T.k * 2);
  }
  const double round = T.round_ns(t_row, ctas, bytes, bytes, std::min<double>(T.sms, ctas), false);
  double t = waves * iterations * round;
  if (programs > 1)  // partial dweight rows written, then summed by the finalize launch
    t += programs * d.N * 4.0 * v.partials() * 2 / T.bw + p[kTwoPass];
  return t;
}
}  // namespace

double predicted_ns(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& cfg, const DeviceFacts& dev,
                    const ModelParams& mp) {
  // A forward config is priced as the kernel its launch runs (staged or
  // not), and a launch of one wave with the one-wave constants.
  const auto staged = op == Op::Forward ? staged_launch(op, d, v, cfg, dev) : std::nullopt;
  const LaunchConfig& c = staged ? *staged : cfg;
  const bool wave = mp.one_wave && op == Op::Forward && d.M > 0 && one_wave(op, d, v, c, dev);
  const Terms terms(op, d, v, c, dev, wave ? *mp.one_wave : mp.v);
  return op == Op::Forward ? forward_ns(d, v, c, dev, terms) : backward_ns(d, v, c, dev, terms);
}

namespace {
// Two rules for quantized forward rows, where a one-pass config obeys them
// (the model's constants, fitted on unquantized rows, price neither):
// - CTAs of at most 512 threads, where such a config holds a row at 32
//   elements a thread or fewer (N up to 16384, the widest timed). 1024-thread
//   rows lost to rows of 256-512 threads at every decode shape timed (whole
//   grids in alternating rounds, H200: 32x7168 token 3.39 vs 2.37 us,
//   64x8192 group128 3.26 vs 2.69, 16x5120 tensor-static 2.40 vs 2.08), and
//   two rows of 512 to one (2048x16384 token 39.2 vs 35.3): their reductions
//   wait on 32 warps.
// - Rows scaled by their own amax (token) at most 48 elements a thread: at
//   64 they lost to 32 on both GPUs at M x N = 2^25 (H200: N = 4096 30.0 vs
//   26.9 us, 8192 30.7 vs 27.8, 16384 36.8 vs 31.5; H100 16384 43.7 vs 37.6),
//   and 48 was the fastest at N = 12288. Group and static scales keep 64
//   (N = 16384: 32.5 vs 37.0 us for group128 on the H200), and so do token
//   rows after a fused residual add (4096x16384 on the H200: 115.3 us at 64,
//   136.1 at 32).
constexpr int kQuantCtaThreads = 512, kQuantCapElems = 32, kTokenRowElems = 48;

struct QuantCaps {
  bool threads = false, token = false;  // the rules that apply to a grid
};

std::int64_t elems_per_thread(const NormDesc& d, const LaunchConfig& c) {
  return ceil_div(ceil_div(d.N, c.row_split()), c.threads_per_row);  // a cluster's CTA: its slice
}

bool one_pass(const LaunchConfig& c) { return !c.two_pass && c.row_split() == 1; }

QuantCaps quant_caps(Op op, const NormDesc& d, const Variant& v, const std::vector<LaunchConfig>& grid) {
  QuantCaps q;
  if (op != Op::Forward || v.quant == QuantScaling::None) return q;
  for (const LaunchConfig& c : grid) {
    if (!one_pass(c) || c.threads() > kQuantCtaThreads) continue;
    q.threads |= elems_per_thread(d, c) <= kQuantCapElems;
    q.token |= v.quant == QuantScaling::Token && !v.residual && elems_per_thread(d, c) <= kTokenRowElems;
  }
  return q;
}

bool excluded(const QuantCaps& q, const NormDesc& d, const LaunchConfig& c) {
  return (q.threads && c.threads() > kQuantCtaThreads) || (q.token && elems_per_thread(d, c) > kTokenRowElems);
}

// Forward rows read twice (two-pass) only where no config holds the row in
// registers: the constants price a two-pass row too cheaply at mid M. Over
// the whole grids timed with the kernels of 2026-11-27 the model picked
// two-pass rows 7 times, each 1.37-2.42x the fastest (rms bf16 512x100003
// with a residual, ln bf16 700x98305 with one, rms bf16 1024x77777, rms
// fp32 1024x200001); a two-pass row was fastest in 2 of 9 timed on an H200
// where both kinds exist, by 5% and 26% (rms fp16 238x43688, ln bf16
// 197x38952), where the model picked a one-pass row anyway.
bool registers_hold_row(Op op, const std::vector<LaunchConfig>& grid) {
  return op == Op::Forward && std::any_of(grid.begin(), grid.end(), [](const LaunchConfig& c) { return !c.two_pass; });
}

// Forward rows of one CTA each in CTAs of fewer than 1024 threads where the
// grid has such a config: launches of one wave (decode), and rows without a
// fused residual at any M. A 1024-thread row's reduction waits on 32 warps,
// and at one CTA an SM it leaves the SM idle around its barriers, neither of
// which the constants (fitted mostly on streaming launches of every width)
// price. On whole grids timed with the kernels of 2026-11-28 the model's
// 1024-thread decode picks lost to 256-512-thread rows by up to 28% (H200:
// rms bf16 64x7168 2.69 vs 2.43 us, ln fp32 2x3176 2.69 vs 2.21); without
// them its geometric mean over the fastest went 1.079 -> 1.064 on 40 drawn
// decode shapes (H200), 1.058 -> 1.048 on 40 others (H100), 1.097 -> 1.055
// on 16 common decode shapes (H200). Past decode, over the recorded grids
// of autotune_cache/model/ (no GPU: `normjit_fit_model --each`), 1024-thread
// picks of rows without a residual lost by up to 32% (H200 rms bf16
// 2048x20000 57.2 vs 43.5 us for 512 threads; rms bf16 152x16800 1.21 on
// both GPUs, ln fp16 2000x27775 1.10); excluding them fixed 7 such rows and
// cost one (H100 ln bf16 829x20912, 1.00 -> 1.095). Rows after a fused
// residual add keep them past one wave: there 512-thread picks went both
// ways (rms fp16 1688x25856:res 1.00 -> 1.12, rms fp32 169x10000:res 1.28
// -> 1.05). Clusters keep their 1024-thread slices (a wide row's c16 slices
// of 1024 threads were fastest at rms fp32 4x121240 and 2x99512).
bool caps_cta_threads(Op op, const NormDesc& d, const std::vector<LaunchConfig>& grid) {
  return op == Op::Forward && d.M > 0 && std::any_of(grid.begin(), grid.end(), [](const LaunchConfig& c) {
           return c.row_split() == 1 && c.threads() < 1024;
         });
}
bool cta_threads_excluded(Op op, const NormDesc& d, const Variant& v, const LaunchConfig& c, const DeviceFacts& dev) {
  return c.row_split() == 1 && c.threads() >= 1024 && (!v.residual || one_wave(op, d, v, c, dev));
}

// Forward rows split over enough threads that each holds at most 4 of the
// row's chunks, 16 threads at most (wider rows are the other constants'),
// where the grid has such a config. Short rows over 2-8 threads held up to
// 16 chunks a thread, whose chains the constants (fitted mostly on wide
// rows) price too cheaply. On the recorded grids (autotune_cache/model/,
// N <= 4096; normjit_fit_model --dump) the model's geometric mean over the
// fastest went 1.058 -> 1.052 (H100, 165 shapes) and 1.074 -> 1.062 (H200,
// 259), its worst 1.53 -> 1.38 and 2.09 -> 1.48, one row 4% worse (ln bf16
// 110788x320, H200); on 8 narrow rows timed whole with the kernels of
// 2026-11-28 (H200) 1.124 -> 1.043, worst 1.465 -> 1.129, none worse (ln
// fp16 11078x485: v8.t8.r4 15.7 us against v8.t32.r1's 10.9; rms bf16
// 437070x72 with a residual: v8.t2.r16 92.3, v4.t8.r16 67.7). A floor of
// 16 threads whatever the chunks lost at N = 72 (ln bf16 23132x72: 4.00 ->
// 4.86 us).
// The backward's floor (session 29): a row takes at least min(32, N / 4)
// threads, at most 4 elements a thread below a warp, whatever the vector
// (a floor in chunks let a wider vector pass it with the same few threads,
// and lose: ln bf16 5539x72 v8.t16 1.31-1.39x the fastest). Narrow rows
// over 8-16 threads lost by up to 1.4x (H200 rms fp32 8747x104 v2.t8.r4
// 1.40 of the fastest, ln bf16 2x184 v4.t16.r2 1.34, rms bf16 3x72 1.25);
// with the floor, 12 of 15 shapes timed on an H200 (no cache) ran
// 1.11-1.39x faster (rms bf16 32768x128 1.19x, 4106x184 1.16x). Not where
// an SM streams more than about 60K of the rows' elements (M x N over the
// SMs): there the other three, 16-bit rows of 121K-159K tokens (67K-202K
// elements an SM), ran 0.84-0.88x, fewer threads and more rows a CTA
// winning; the bound gives up two fp32 rows of 93K and 98K that gained
// (rms fp32 138735x88 1.18x, 70277x184 1.13x): a bound in elements, the
// simplest that parts the timed rows, is fitted on these few. On the
// recorded grids the floor within the bound moved 16 picks: 15 faster by
// more than 2%, one within 1%; geometric mean 1.079 -> 1.073 (H200, 305
// shapes), 1.066 -> 1.064 (H100, 327).

constexpr int kMinRowThreads = 16, kMaxShortRowChunks = 4, kMinBwdRowThreads = 32, kMaxBwdShortRowElems = 4;
constexpr double kBwdFloorElemsPerSm = 60000;
std::int64_t row_threads_floor(Op op, const NormDesc& d, const LaunchConfig& c) {
  if (op == Op::Backward) return std::min<std::int64_t>(kMinBwdRowThreads, ceil_div(d.N, kMaxBwdShortRowElems));
  return std::min<std::int64_t>(kMinRowThreads, ceil_div(ceil_div(d.N, c.vec), kMaxShortRowChunks));
}
bool short_row_threads(Op op, const NormDesc& d, const LaunchConfig& c) {
  return c.row_split() == 1 && c.threads_per_row < row_threads_floor(op, d, c);
}
bool floors_row_threads(Op op, const NormDesc& d, const std::vector<LaunchConfig>& grid, const DeviceFacts& dev) {
  if (op == Op::Backward && static_cast<double>(d.M) * static_cast<double>(d.N) > kBwdFloorElemsPerSm * dev.sm_count)
    return false;
  return std::any_of(grid.begin(), grid.end(), [&](const LaunchConfig& c) { return !short_row_threads(op, d, c); });
}
// Peeled backward rows (odd N: norm_bwd.cuh's PEEL) are the tuner's, not
// the model's. Whole grids of 16 odd-N shapes timed on an H200
// (autotune_cache/model/h200-bwd-odd-peel{1,2}-s31.json, peel3-s32 with
// programs in waves) had the fastest peeled config slower than the fastest
// 1-element one on most: split over clusters on 6 of 8 wide rows (rms bf16
// 512x100003 168.0 vs 127.7 us, 8192x16385 375.6 vs 300.3; the model
// counts floor(SMs / cluster) co-resident clusters where the driver counts
// 7 of 16 CTAs, 15 of 8, 30 of 4). Priced for one-CTA rows (the program
// count of backward_programs and 1.5 us a row for the edges, a median of
// 1.049 of the fastest on those grids against 1.069 without), the model's
// peeled picks ran 0.877x the 1-element ones by geometric mean over the 32
// recorded shapes whose pick moved (H200, 2026-11-29, docs/results/
// peel-bwd-s32.md): 1.05-1.61x at M >= 884 and N >= 999 on 5 (ln bf16
// 4096x7777 106.0 -> 66.0 us), but 0.51-0.87x at every M <= 151 (ln bf16
// 2x6425 4.54 -> 8.96 us: a peeled program's weight shift and element-wise
// dweight stores are fixed costs the constants do not hold) and down to
// 0.73x on narrow rows (rms fp16 9451x333). Where peeling pays, tuning
// finds it.
bool peel_excluded(Op op, const NormDesc& d, const LaunchConfig& c) {
  return op == Op::Backward && peeled(op, d, c.vec);
}
}  // namespace

std::size_t fastest_of(Op op, const NormDesc& d, const std::vector<LaunchConfig>& grid, const DeviceFacts& dev,
                       const ModelParams& p) {
  const Variant v = make_variant(op, d);
  const QuantCaps caps = quant_caps(op, d, v, grid);
  const bool one_pass_only = registers_hold_row(op, grid);
  const bool cta_cap = caps_cta_threads(op, d, grid);
  const bool row_floor = floors_row_threads(op, d, grid, dev);
  // The grid is sorted simplest first: a later config must be faster to win.
  std::size_t best = 0;
  double best_t = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < grid.size(); ++i) {
    if (excluded(caps, d, grid[i]) || (one_pass_only && grid[i].two_pass) || peel_excluded(op, d, grid[i]) ||
        (cta_cap && cta_threads_excluded(op, d, v, grid[i], dev)) || (row_floor && short_row_threads(op, d, grid[i])))
      continue;
    const double t = predicted_ns(op, d, v, grid[i], dev, p);
    if (t < best_t * (1 - 1e-9)) {
      best_t = t;
      best = i;
    }
  }
  return best;
}

LaunchConfig staged_for_launch(Op op, const NormDesc& d, const LaunchConfig& cfg, const DeviceFacts& dev) {
  return staged_launch(op, d, make_variant(op, d), cfg, dev).value_or(cfg);
}

LaunchConfig model_config(Op op, const NormDesc& d, const DeviceFacts& dev, const ModelParams& p) {
  const auto grid = candidate_grid(op, d, dev.max_cluster);
  if (grid.empty()) throw Error(ErrorKind::InvalidArgument, "no launch config exists", op_label(op, d.norm), d.str());
  return grid[fastest_of(op, d, grid, dev, p)];
}

}  // namespace normjit::detail

namespace normjit::detail {

const ModelParams& fitted_params(Op op) {
  // Written by tools/fit_config_model (--write): the fit over
  // autotune_cache/model/*.json (v; with --launched files, the forward's
  // one-wave constants too). Order: ModelParams::name. The backward's Lcta
  // and Ldc (the one-cluster decode kernel, norm_bwd_dc) were set by a grid
  // search of those two alone over model/h200-bwd-decode-dc1.json (--iters
  // 0 --start-bwd=...), the others held; a full fit may move them. The
  // backward's others were refitted (--iters 6000) on the rows timed with
  // the kernels that store partial rows as vectors (model/h100-bwd-*s18*,
  // h100-bwd-seed20{0,1}): rows of older kernels priced partial rows dearer.
  // fitted-params:begin
  static const ModelParams fwd{{2423, 5.966, 3.852, 410.6, 221.7, 32, 0.02, 0.02, 1, 3.98, 0.4385, 0.01, 1.151, 56.01, 0.2669, 65.75, 0}, std::nullopt};
  static const ModelParams bwd{{3855, 95.75, 10.91, 73.68, 82.4, 16, 0.4057, 1, 0.717, 2640, 676.6, 1.168, 3.099, 153.3, 0.3443, 3000, 40}, std::nullopt};
  // fitted-params:end
  return op == Op::Forward ? fwd : bwd;
}

LaunchConfig heuristic_config(Op op, const NormDesc& d, const DeviceFacts& dev) {
  return model_config(op, d, dev, fitted_params(op));
}

}  // namespace normjit::detail
