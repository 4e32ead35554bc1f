// The launch-config grid, its validity rules, the heuristic, alignment
// fitting, the simplicity order and the launch geometry (no GPU needed).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config/config_grid.hpp"
#include "config/row_budget.hpp"
#include "core/shape_spec.hpp"
#include "quant_args.cuh"
#include "compile/specialization.hpp"
#include "tuning/tuned_cache.hpp"
#include "test_util.hpp"
#include "core/variant.hpp"
#include "device/device_facts.hpp"
#include "runtime/ops.hpp"

using namespace normjit;
using namespace normjit::detail;

// Defined in test_descriptors.cpp: x and y of dtype `xy`, weight of `w`.
using namespace normjit_test;  // shared helpers (test_util.hpp)

namespace {

struct DtypeCombo {
  DType xy, w;
};

const std::int64_t kNs[] = {1, 7, 64, 127, 128, 1000, 4096, 5120, 7168, 65536, 262144};
const std::int64_t kMs[] = {1, 3, 1000, 32768};
const DtypeCombo kCombos[] = {{DType::F32, DType::F32}, {DType::F16, DType::F16}, {DType::F16, DType::F32},
                              {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}};
const Op kOps[] = {Op::Forward, Op::Backward};

LaunchConfig cfg(int vec, int tpr, int rows, bool two_pass = false, int programs_per_sm = 0) {
  LaunchConfig c;
  c.vec = vec;
  c.threads_per_row = tpr;
  c.rows_per_pid = rows;
  c.two_pass = two_pass;
  c.programs_per_sm = programs_per_sm;
  return c;
}

int widest_bytes(const NormDesc& d) {
  return std::max({dtype_size(d.x_dtype), dtype_size(d.y_dtype), dtype_size(d.weight_dtype)});
}

bool in_grid(const std::vector<LaunchConfig>& grid, const LaunchConfig& c) {
  return std::find(grid.begin(), grid.end(), c) != grid.end();
}

// The fewest rows a program of `tpr` threads per row can hold: a block has at
// least one warp.
int min_rows(int tpr) { return std::max(1, 32 / tpr); }

// Runs `check(op, desc)` for every N x dtype combo x op x M of the issue.
template <class F>
void for_every_shape(F&& check) {
  for (std::int64_t N : kNs)
    for (const auto& combo : kCombos)
      for (Op op : kOps)
        for (std::int64_t M : kMs) {
          const NormDesc d = make_desc(M, N, combo.xy, combo.w);
          CAPTURE(std::string(op_name(op)));
          CAPTURE(d.str());
          check(op, d);
        }
}

// Validity of each member: the rules of config_valid plus the plain bounds.
void check_members_valid(Op op, const NormDesc& d, const std::vector<LaunchConfig>& grid) {
  for (const auto& c : grid) {
    CAPTURE(c.str());
    std::string why;
    CHECK_MESSAGE(config_valid(op, d, c, &why), why);
    CHECK(c.threads() >= 32);
    CHECK(c.threads() <= 1024);
    CHECK(c.vec * widest_bytes(d) <= 16);
    CHECK(c.vec <= max_vec(Op::Forward, d));
    CHECK(c.programs_per_sm >= 0);
    if (op == Op::Forward) CHECK(c.programs_per_sm == 0);
    // The M-bucket rule: no more rows per program than M needs, except the
    // smallest block of a narrow row.
    CHECK(c.rows_per_pid <= std::max<std::int64_t>(m_bucket(d.M), min_rows(c.threads_per_row)));
  }
}

void check_order_and_uniqueness(const std::vector<LaunchConfig>& grid) {
  for (std::size_t i = 1; i < grid.size(); ++i) {
    CAPTURE(grid[i - 1].str());
    CAPTURE(grid[i].str());
    CHECK(simplicity_key(grid[i - 1]) <= simplicity_key(grid[i]));
  }
  for (std::size_t i = 0; i < grid.size(); ++i)
    CHECK_MESSAGE(std::count(grid.begin(), grid.end(), grid[i]) == 1, "duplicate " << grid[i].str());
}

// A two-pass config is in the grid exactly for the (vec, threads_per_row) whose
// one-pass twin does not fit the register budget.
void check_two_pass_exactly_when_needed(Op op, const NormDesc& d, const std::vector<LaunchConfig>& grid) {
  for (const auto& c : grid) {
    CAPTURE(c.str());
    LaunchConfig twin = c;
    twin.two_pass = !c.two_pass;
    std::string why;
    CHECK_FALSE(config_valid(op, d, twin, &why));
    CHECK(why.find(c.two_pass ? "register budget" : "do not fit") != std::string::npos);
  }
  const int vmax = max_vec(Op::Forward, d);
  for (int tpr = 32; tpr <= 1024; tpr *= 2) {
    const LaunchConfig two = cfg(vmax, tpr, 1, true);
    CAPTURE(two.str());
    if (config_valid(op, d, two)) CHECK(in_grid(grid, two));
  }
}

std::vector<LaunchConfig> grid_of(Op op, std::int64_t M, std::int64_t N, DType xy = DType::BF16) {
  return candidate_grid(op, make_desc(M, N, xy, xy));
}

bool all_two_pass(const std::vector<LaunchConfig>& g) {
  return std::all_of(g.begin(), g.end(), [](const LaunchConfig& c) { return c.two_pass; });
}
bool any_two_pass(const std::vector<LaunchConfig>& g) {
  return std::any_of(g.begin(), g.end(), [](const LaunchConfig& c) { return c.two_pass; });
}
bool any_multi_row(const std::vector<LaunchConfig>& g) {
  return std::any_of(g.begin(), g.end(), [](const LaunchConfig& c) { return c.rows_per_pid > 1; });
}

void check_rejected(Op op, const NormDesc& d, const LaunchConfig& c, const std::string& reason) {
  CAPTURE(std::string(op_name(op)));
  CAPTURE(d.str());
  CAPTURE(c.str());
  std::string why;
  CHECK_FALSE(config_valid(op, d, c, &why));
  CHECK_MESSAGE(why.find(reason) != std::string::npos, "reason: '" << why << "', expected '" << reason << "'");
  CHECK_FALSE(in_grid(candidate_grid(op, d), c));
}

}  // namespace

TEST_CASE("config_grid: every grid is non-empty, valid, sorted and holds the heuristic") {
  for_every_shape([](Op op, const NormDesc& d) {
    const auto grid = candidate_grid(op, d);
    REQUIRE_FALSE(grid.empty());
    check_members_valid(op, d, grid);
    check_order_and_uniqueness(grid);
    check_two_pass_exactly_when_needed(op, d, grid);
    const LaunchConfig h = heuristic_config(op, d, normjit_test::test_facts(1));
    CAPTURE(h.str());
    CHECK(in_grid(grid, h));
  });
}

TEST_CASE("config_grid: q transposed leaves the row kernel's configs as they are without it") {
  // The transpose is a launch of its own (or, at decode, bytes the row
  // kernel stores beside q): it constrains no config of the row kernel.
  for (const char* spec : {"rms:bf16:8192x4096:quant=e4m3/tensor", "rms:bf16:33x7168:quant=e5m2/tensor-static",
                           "rms:bf16:4096x4096:x=e4m3/group16:quant=e4m3/tensor", "rms:bf16:1x2048:quant=e4m3/tensor",
                           "rms:bf16:64x100000:quant=e4m3/tensor"}) {
    CAPTURE(spec);
    const NormDesc plain = parse_shape_spec(spec).desc;
    const NormDesc t = parse_shape_spec(std::string(spec) + ":transpose").desc;
    REQUIRE(t.store_y_t);
    const auto grid = candidate_grid(Op::Forward, t, 8);
    CHECK(!grid.empty());
    CHECK(grid == candidate_grid(Op::Forward, plain, 8));
  }
}

TEST_CASE("transpose_columns: a q of few row tiles gets narrower column tiles, down to 16 columns") {
  const auto cols = [](const char* spec, int sms) { return transpose_columns(parse_shape_spec(spec).desc, sms); };
  const char* large = "rms:bf16:8192x4096:quant=e4m3/tensor:transpose";
  CHECK(cols(large, 132) == nj::qt_tile_cols());  // 128 row tiles x 16 column tiles
  // 61 x 2880: one row tile; 256 columns a CTA would leave 12 CTAs on 132 SMs.
  const int tc = cols("rms:bf16:61x2880:quant=e4m3/tensor:transpose", 132);
  CHECK(tc < nj::qt_tile_cols());
  CHECK(tc % 16 == 0);
  CHECK((2880 + tc - 1) / tc >= 132);
  CHECK((2880 + 2 * tc - 1) / (2 * tc) < 132);  // the widest that fills the SMs
  CHECK(cols("rms:bf16:61x64:quant=e4m3/tensor:transpose", 132) == 16);  // never below one 16-byte piece
  CHECK(cols("rms:bf16:61x2880:quant=e4m3/tensor:transpose", 1) == nj::qt_tile_cols());
}

TEST_CASE("config_grid: two-pass only for rows that do not fit in registers") {
  for (Op op : kOps) {
    CAPTURE(std::string(op_name(op)));
    for (std::int64_t M : kMs) {
      CAPTURE(M);
      CHECK(all_two_pass(grid_of(op, M, 262144)));
      CHECK(all_two_pass(grid_of(op, M, 262144, DType::F32)));
      CHECK_FALSE(any_two_pass(grid_of(op, M, 128)));
      CHECK_FALSE(any_two_pass(grid_of(op, M, 1)));
      // 4096 bf16 fits a block of >= 64 threads in one pass; a lone warp
      // cannot hold it: the backward may read it twice, the forward never
      // reads twice a row some block holds.
      const auto mid = grid_of(op, M, 4096);
      CHECK(any_two_pass(mid) == (op == Op::Backward));
      CHECK_FALSE(all_two_pass(mid));
      if (op == Op::Forward) {
        // 65536 bf16 fits no block: two-pass with 256 threads or more, or clusters.
        const auto wide = grid_of(op, M, 65536);
        CHECK(any_two_pass(wide));
        for (const auto& c : wide) CHECK((!c.two_pass || c.threads_per_row >= 256));
      }
    }
  }
}

TEST_CASE("config_grid: narrow rows with many rows use several rows per program; M = 1 uses the minimum") {
  for (Op op : kOps)
    for (std::int64_t N : {1, 7, 64, 127, 128}) {
      CAPTURE(std::string(op_name(op)));
      CAPTURE(N);
      CHECK(any_multi_row(grid_of(op, 1000, N)));
      CHECK(any_multi_row(grid_of(op, 32768, N)));
      for (const auto& c : grid_of(op, 1, N)) {
        CAPTURE(c.str());
        CHECK(c.rows_per_pid == min_rows(c.threads_per_row));
      }
    }
  // M = 3 allows up to 4 rows per program for blocks larger than a warp.
  for (const auto& c : grid_of(Op::Forward, 3, 64))
    CHECK(c.rows_per_pid <= std::max(4, min_rows(c.threads_per_row)));
  CHECK(in_grid(grid_of(Op::Forward, 3, 64), cfg(8, 8, 4)));
  CHECK_FALSE(in_grid(grid_of(Op::Forward, 3, 64), cfg(8, 8, 16)));
  CHECK(in_grid(grid_of(Op::Forward, 1000, 64), cfg(8, 8, 16)));
}

TEST_CASE("config_grid: max_vec is 16 bytes of the widest dtype, capped by N and the row strides") {
  CHECK(max_vec(Op::Forward, make_desc(8, 4096)) == 8);
  CHECK(max_vec(Op::Forward, make_desc(8, 4096, DType::F16)) == 8);
  CHECK(max_vec(Op::Forward, make_desc(8, 4096, DType::F32)) == 4);
  CHECK(max_vec(Op::Forward, make_desc(8, 4096, DType::BF16, DType::F32)) == 4);
  NormDesc qk = make_desc(8, 3);  // 3-D rows 3 elements apart: the backward does not peel them
  qk.heads = 2;
  CHECK(max_vec(Op::Backward, qk) == 1);
  NormDesc padded = make_desc(8, 3);
  padded.x_stride = padded.y_stride = 4;
  CHECK(max_vec(Op::Forward, padded) == 4);
  CHECK(max_vec(Op::Forward, make_desc(8, 1)) == 1);
  qk.N = 20004;
  CHECK(max_vec(Op::Backward, qk) == 4);
  // Rows of plain dtypes peel instead: odd strides keep whole vectors.
  CHECK(max_vec(Op::Backward, make_desc(8, 100003)) == 8);
  CHECK(max_vec(Op::Forward, make_desc(8, 3)) == 4);
  CHECK(max_vec(Op::Forward, make_desc(8, 100003)) == 8);
  // Quantized rows whose scale is the row's or the tensor's peel too (FP8 y:
  // 16-byte vectors of 16-bit x); group scales start with the row, and do not.
  NormDesc quant = make_desc(8, 100003);
  quant.quant = QuantScaling::Token;
  quant.y_dtype = DType::E4M3;
  CHECK(max_vec(Op::Forward, quant) == 8);
  CHECK(peeled(Op::Forward, quant, 8));
  quant.quant = QuantScaling::TensorStatic;
  CHECK(max_vec(Op::Forward, quant) == 8);
  NormDesc grouped = make_desc(8, 100000);
  grouped.x_stride = grouped.y_stride = 100003;
  grouped.quant = QuantScaling::Group;
  grouped.quant_group = 16;
  grouped.y_dtype = DType::E4M3;
  CHECK(max_vec(Op::Forward, grouped) == 1);
  CHECK_FALSE(peeled(Op::Forward, grouped, 8));
}

TEST_CASE("config_grid: forward rows whose strides are no multiple of vec are peeled") {
  const NormDesc odd = make_desc(64, 12345);
  CHECK(peeled(Op::Forward, odd, 8));
  CHECK(peeled(Op::Forward, odd, 2));
  CHECK_FALSE(peeled(Op::Forward, odd, 1));
  CHECK(peeled(Op::Backward, odd, 8));
  CHECK_FALSE(peeled(Op::Forward, make_desc(64, 4096), 8));
  NormDesc padded = odd;
  padded.x_stride = padded.y_stride = 12352;  // rows aligned: only the tail is short
  CHECK_FALSE(peeled(Op::Forward, padded, 8));
  padded.y_stride = 12346;
  CHECK(peeled(Op::Forward, padded, 8));
  CHECK_FALSE(peeled(Op::Forward, padded, 2));
  // A peeled row's slots cover its view (edges included), in clusters only
  // its inner chunks (12345 = 8 * 1543 + 1).
  CHECK(row_span(Op::Forward, odd, LaunchConfig::parse("v8.t256.r1")) == 12345 + 7);
  CHECK(row_span(Op::Forward, odd, LaunchConfig::parse("v8.t256.r1.c4")) == 8 * 1543);
  CHECK(row_span(Op::Forward, make_desc(64, 5), LaunchConfig::parse("v8.t32.r1.c2")) == 8);
  CHECK(row_span(Op::Forward, odd, LaunchConfig::parse("v1.t256.r1")) == 12345);
  // A peeled backward row's slots cover its view in clusters too.
  CHECK(row_span(Op::Backward, odd, LaunchConfig::parse("v8.t256.r1.c4")) == 12345 + 7);
  // The grid of an odd N has whole vectors, and the spec says PEEL.
  const auto grid = candidate_grid(Op::Forward, odd, kMaxCluster);
  const auto decode_grid = candidate_grid(Op::Forward, make_desc(32, 12345), kMaxCluster);  // clusters at M <= 32
  CHECK(std::any_of(decode_grid.begin(), decode_grid.end(),
                    [](const LaunchConfig& c) { return c.vec == 8 && c.cluster > 1; }));
  CHECK(std::all_of(grid.begin(), grid.end(), [](const LaunchConfig& c) { return c.vec >= 4; }));
  const KernelSpec s = make_spec(Op::Forward, odd, cfg(8, 256, 1));
  CHECK(s.peel);
  CHECK(s.source().find("PEEL = true") != std::string::npos);
  CHECK(s.name().find(".peel") != std::string::npos);
  // An aligned row's prelude is what it was before peeling existed.
  const KernelSpec a = make_spec(Op::Forward, make_desc(64, 4096), cfg(8, 256, 1));
  CHECK_FALSE(a.peel);
  CHECK(a.source().find("PEEL") == std::string::npos);
  // A row's share counts the columns before it: 12352 / 8 / 256 = 7 vectors a thread.
  CHECK_FALSE(config_valid(Op::Forward, odd, cfg(8, 128, 1)));  // 13 vectors of 16 bytes
  CHECK(config_valid(Op::Forward, odd, cfg(8, 256, 1)));
}

TEST_CASE("config_grid: peeled backward rows take one pass with dweight in registers, many rows a program a whole number of vectors apart") {
  const NormDesc odd = make_desc(4096, 12345);
  const auto grid = candidate_grid(Op::Backward, odd, kMaxCluster);
  auto count = [&](auto pred) { return std::count_if(grid.begin(), grid.end(), pred); };
  // Peeled configs of 8 and 4 elements, one pass through registers or stages;
  // two-pass rows and one-cluster grids keep 1-element vectors.
  CHECK(count([&](const LaunchConfig& c) { return c.vec == 8 && c.stages == 0; }) > 0);
  CHECK(count([&](const LaunchConfig& c) { return c.vec == 8 && c.stages >= 2; }) > 0);
  CHECK(count([&](const LaunchConfig& c) { return c.vec > 1 && (c.two_pass || c.dw_cluster); }) == 0);
  CHECK(count([&](const LaunchConfig& c) { return c.vec == 1; }) > 0);
  CHECK(count([&](const LaunchConfig& c) { return c.vec > 1 && dweight_in_smem(Op::Backward, odd, c); }) == 0);
  // The grid keeps what rows had before they peeled: at 2 mod 4 elements,
  // 2- and 1-element vectors and their one-cluster decode grids; rows too
  // wide for any cluster's registers, two-pass at 1-element vectors.
  const auto decode = candidate_grid(Op::Backward, make_desc(2, 8190, DType::F16, DType::F16), kMaxCluster);
  CHECK(std::any_of(decode.begin(), decode.end(), [](const LaunchConfig& c) { return c.vec == 2 && c.dw_cluster; }));
  CHECK(std::any_of(decode.begin(), decode.end(), [](const LaunchConfig& c) { return c.vec == 1; }));
  const auto huge = candidate_grid(Op::Backward, make_desc(26, 250301), kMaxCluster);
  CHECK(std::any_of(huge.begin(), huge.end(), [](const LaunchConfig& c) { return c.vec == 1 && c.two_pass; }));
  std::string why;
  CHECK_FALSE(config_valid(Op::Backward, odd, LaunchConfig::parse("v8.t1024.r1.2p"), &why, kMaxCluster));
  CHECK(why.find("not aligned to vectors of 8") != std::string::npos);
  CHECK(config_valid(Op::Backward, odd, LaunchConfig::parse("v1.t1024.r1.2p"), nullptr, kMaxCluster) ==
        config_valid(Op::Backward, make_desc(4096, 12344), LaunchConfig::parse("v1.t1024.r1.2p"), nullptr, kMaxCluster));
  // Its stages hold the view: 12352 columns of x and dy a stage.
  const KernelSpec s = make_spec(Op::Backward, odd, LaunchConfig::parse("v8.t512.r1.c2.s2"));
  CHECK(s.peel);
  CHECK(s.source().find("PEEL = true") != std::string::npos);
  CHECK(s.dynamic_smem() == 2 * 12352 / 2 * 4);
  // A program's rows start at one column of a vector: the row step
  // (programs x rows_per_pid rows) is a multiple of vec rows of 12345.
  for (int per_sm : {1, 2, 3, 5}) {
    CAPTURE(per_sm);
    for (const char* c : {"v8.t512.r1.s2", "v8.t64.r2", "v4.t128.r1.c4.s2"}) {
      CAPTURE(c);
      const LaunchConfig lc = LaunchConfig::parse(c);
      const Geometry g = launch_geometry(Op::Backward, odd, lc, 132, per_sm);
      CAPTURE(g.programs);
      CHECK(g.programs * lc.rows_per_pid % lc.vec == 0);
      CHECK(g.programs * lc.cluster <= 132 * per_sm);
      CHECK(g.programs * lc.cluster > 132 * per_sm - lc.vec * lc.cluster);
    }
  }
  // Rows whose stride leaves a factor of 2 in common with 8 step by 4 rows;
  // a grid that holds every row (one each) and unpeeled rows keep theirs.
  CHECK(launch_geometry(Op::Backward, make_desc(4096, 12346), LaunchConfig::parse("v8.t512.r1.s2"), 131, 1).programs == 128);
  CHECK(launch_geometry(Op::Backward, make_desc(100, 12345), LaunchConfig::parse("v8.t512.r1.s2"), 132, 1).programs == 100);
  CHECK(launch_geometry(Op::Backward, make_desc(4096, 12344), LaunchConfig::parse("v8.t512.r1.s2"), 131, 1).programs == 131);
  // Fewer resident programs than the multiple (7 clusters of 16 on an
  // H200): rounding down would leave none, and 8 programs ran the eighth as
  // a second wave over a row share each (64 row steps, twice 7 programs'
  // 37); waves of more programs fill the slots instead, each program a
  // partial dweight row more.
  {
    const NormDesc wide = make_desc(512, 100003);
    const LaunchConfig lc = LaunchConfig::parse("v8.t512.r1.c16.s2");
    const Geometry g = launch_geometry(Op::Backward, wide, lc, 132, 1, 7);
    CAPTURE(g.programs);
    CHECK(g.programs % 8 == 0);
    CHECK(g.programs > 7);
    const auto steps = (g.programs + 6) / 7 * ((512 + g.programs - 1) / g.programs);  // waves x rows a program
    CHECK(steps <= 80);
    CHECK(g.grid == g.programs * 16);
    // With 16 resident clusters, 16 programs: no waves.
    CHECK(launch_geometry(Op::Backward, wide, lc, 132, 2, 16).programs == 16);
    // Unpeeled rows: the resident programs, whatever their count.
    CHECK(launch_geometry(Op::Backward, make_desc(512, 100000), lc, 132, 1, 7).programs == 7);
  }
  // The config model leaves them to tuning: its pick is a 1-element
  // vector, as before backward rows peeled (without the rule, a peeled v4).
  const LaunchConfig m = heuristic_config(Op::Backward, odd, normjit_test::test_facts());
  CHECK_FALSE(peeled(Op::Backward, odd, m.vec));
  CHECK(m.vec == 1);
  // 3-D rows and FP8 x do not peel.
  NormDesc heads = odd;
  heads.heads = 3;
  CHECK_FALSE(peeled(Op::Backward, heads, 8));
}

TEST_CASE("config_grid: fit_forward_alignment keeps a peeled row's vectors where its tensors agree") {
  const NormDesc odd = make_desc(64, 12345);
  const LaunchConfig c = cfg(8, 256, 1);
  auto* base = reinterpret_cast<char*>(std::uintptr_t{1} << 20);
  auto fit = [&](const NormDesc& d, std::ptrdiff_t x_off, std::ptrdiff_t y_off, std::ptrdiff_t w_off,
                 std::ptrdiff_t r_off = -1) {
    ForwardTensors t;
    t.x = base + x_off;
    t.y = base + (1 << 22) + y_off;
    t.weight = base + (2 << 22) + w_off;
    if (r_off >= 0) t.residual = t.residual_out = base + (3 << 22) + r_off;
    return fit_forward_alignment(c, d, t).vec;
  };
  CHECK(fit(odd, 0, 0, 0) == 8);
  CHECK(fit(odd, 2, 2, 0) == 8);    // both rows start one element into a vector
  CHECK(fit(odd, 2, 4, 0) == 1);    // the rows start at different elements
  CHECK(fit(odd, 0, 0, 2) == 1);    // the weight's vectors must be aligned to its columns
  CHECK(fit(odd, 8, 0, 0) == 4);    // residues 4 and 0 agree modulo 4
  NormDesc res = odd;
  res.residual = res.store_residual_out = true;
  CHECK(fit(res, 6, 6, 0, 6) == 8);
  CHECK(fit(res, 6, 6, 0, 0) == 1);  // residues 3 and 0 differ at every vec > 1
  // An aligned row stays strict: a misaligned base lowers vec as before.
  const NormDesc even = make_desc(64, 4096);
  CHECK(fit(even, 0, 0, 0) == 8);
  CHECK(fit(even, 2, 2, 0) == 1);
  // Strides that differ modulo vec between x and y: different starts from row 1 on.
  NormDesc strided = odd;
  strided.x_stride = 12346;
  strided.y_stride = 12347;
  CHECK(fit(strided, 0, 0, 0) == 1);
}

TEST_CASE("config_grid: config_valid rejects bad configs and says why") {
  const NormDesc bf16_4096 = make_desc(64, 4096);
  const NormDesc fp32_4096 = make_desc(64, 4096, DType::F32, DType::F32);
  const NormDesc mixed_4096 = make_desc(64, 4096, DType::BF16, DType::F32);
  const NormDesc wide = make_desc(64, 262144);
  const NormDesc narrow = make_desc(64, 128);
  check_rejected(Op::Forward, fp32_4096, cfg(8, 256, 1), "vec 8");
  check_rejected(Op::Forward, mixed_4096, cfg(8, 256, 1), "vec 8");
  check_rejected(Op::Forward, bf16_4096, cfg(3, 256, 1), "vec 3");
  check_rejected(Op::Forward, bf16_4096, cfg(16, 256, 1), "vec 16");
  check_rejected(Op::Forward, bf16_4096, cfg(8, 48, 1), "powers of two");
  check_rejected(Op::Forward, bf16_4096, cfg(8, 256, 3), "powers of two");
  check_rejected(Op::Forward, fp32_4096, cfg(1, 1024, 2), "2048 threads");
  check_rejected(Op::Forward, bf16_4096, cfg(8, 8, 2), "16 threads");
  check_rejected(Op::Forward, narrow, cfg(8, 64, 1), "64 threads per row for 16 chunks");
  check_rejected(Op::Forward, wide, cfg(8, 512, 2, true), "one row per program");
  check_rejected(Op::Forward, narrow, cfg(8, 16, 2, true), "do not fit");
  check_rejected(Op::Forward, wide, cfg(8, 1024, 1), "register budget");
  check_rejected(Op::Backward, bf16_4096, cfg(8, 64, 1), "register budget");
  check_rejected(Op::Forward, bf16_4096, cfg(8, 512, 1, false, 2), "programs_per_sm");
  check_rejected(Op::Backward, bf16_4096, cfg(8, 512, 1, false, -1), "programs_per_sm");
  // The same config is fine where the budget allows it.
  CHECK(config_valid(Op::Forward, bf16_4096, cfg(8, 64, 1)));
  CHECK(config_valid(Op::Forward, wide, cfg(8, 1024, 1, true)));
  CHECK(config_valid(Op::Backward, bf16_4096, cfg(8, 512, 2)));
  CHECK(config_valid(Op::Backward, bf16_4096, cfg(8, 512, 2, false, 4)));
}

TEST_CASE("config_grid: fit_alignment lowers vec for misaligned pointers and strides only") {
  const NormDesc d = make_desc(16, 4096);
  const LaunchConfig c = cfg(8, 256, 1);
  auto* base = reinterpret_cast<const char*>(std::uintptr_t{1} << 20);
  auto fit = [&](std::ptrdiff_t offset, std::vector<std::int64_t> strides, DType t = DType::BF16) {
    return fit_alignment(c, Op::Backward, d, {{base, DType::BF16}, {base + offset, t}, {nullptr, DType::BF16}}, strides).vec;
  };
  CHECK(fit(0, {4096, 4096}) == 8);
  CHECK(fit(256, {4160}) == 8);
  CHECK(fit(2, {4096}) == 1);
  CHECK(fit(4, {4096}) == 2);
  CHECK(fit(8, {4096}) == 4);
  CHECK(fit(0, {4097}) == 1);
  CHECK(fit(0, {4098}) == 2);
  CHECK(fit(0, {4100}) == 4);
  CHECK(fit(0, {4096, 4098}) == 2);
  // fp32 needs twice the byte alignment for the same vec.
  CHECK(fit(16, {4096}, DType::F32) == 4);
  CHECK(fit(8, {4096}, DType::F32) == 2);
  // Everything but vec is kept where the row's share still fits registers.
  const LaunchConfig lowered = fit_alignment(cfg(8, 32, 2, false), Op::Forward, d, {{base + 2, DType::BF16}}, {});
  CHECK(lowered == cfg(1, 32, 2, false));
  // A backward share that no longer fits would need its dweight sums in
  // shared memory, which needs stages: the row is read twice instead.
  CHECK(fit_alignment(cfg(8, 128, 2, false), Op::Backward, d, {{base + 2, DType::BF16}}, {}) == cfg(1, 1024, 1, true));
  CHECK(fit_alignment(cfg(8, 1024, 1, true), Op::Backward, d, {}, {4097}) == cfg(1, 1024, 1, true));
}

TEST_CASE("config_grid: launch_geometry of forward and backward") {
  const NormDesc d = make_desc(1000, 4096);
  const Geometry f1 = launch_geometry(Op::Forward, d, cfg(8, 256, 1), 132, 8);
  CHECK(f1.grid == 1000);
  CHECK(f1.block == 256);
  const Geometry f4 = launch_geometry(Op::Forward, d, cfg(8, 32, 4), 132, 8);
  CHECK(f4.grid == 250);
  CHECK(f4.block == 128);
  CHECK(launch_geometry(Op::Forward, make_desc(1001, 64), cfg(8, 8, 16), 132, 8).grid == 63);
  CHECK(launch_geometry(Op::Forward, make_desc(1, 64), cfg(8, 8, 4), 132, 8).grid == 1);

  // Backward: persistent, capped by what is resident and by the rows there are.
  CHECK(launch_geometry(Op::Backward, d, cfg(8, 256, 1), 132, 2).grid == 264);
  CHECK(launch_geometry(Op::Backward, d, cfg(8, 256, 1), 132, 8).grid == 1000);
  CHECK(launch_geometry(Op::Backward, d, cfg(8, 64, 4), 132, 8).grid == 250);
  CHECK(launch_geometry(Op::Backward, d, cfg(8, 256, 1), 4, 0).grid == 4);
  CHECK(launch_geometry(Op::Backward, make_desc(0, 4096), cfg(8, 256, 1), 132, 8).grid == 1);
  CHECK(launch_geometry(Op::Backward, make_desc(3, 4096), cfg(8, 256, 1), 132, 8).grid == 3);
  CHECK(launch_geometry(Op::Backward, d, cfg(8, 256, 1), 132, 8).block == 256);
  // programs_per_sm caps the programs per SM, but never above what is resident.
  CHECK(launch_geometry(Op::Backward, d, cfg(8, 256, 1, false, 2), 132, 8).grid == 264);
  CHECK(launch_geometry(Op::Backward, d, cfg(8, 256, 1, false, 4), 132, 2).grid == 264);
  CHECK(launch_geometry(Op::Backward, d, cfg(8, 256, 1, false, 1), 132, 8).grid == 132);
  CHECK(launch_geometry(Op::Backward, make_desc(100, 4096), cfg(8, 256, 1, false, 4), 132, 8).grid == 100);
}

TEST_CASE("config_grid: the finalize launch covers every column with vectors that divide N") {
  // The widest vector that still gives every SM a block, and divides N.
  CHECK(finalize_geometry(147, 6560, 2, 132).vec == 2);      // 52 tiles of 4 x 2 partials < 132
  CHECK(finalize_geometry(8, 234232, 1, 132).vec == 4);
  CHECK(finalize_geometry(8, 234234, 1, 132).vec == 2);      // N % 4 == 2
  CHECK(finalize_geometry(8, 234233, 1, 132).vec == 1);      // odd N
  CHECK(finalize_geometry(16, 8192, 1, 132).vec == 1);       // 128 tiles of 2 < 132
  for (std::int64_t programs : {2, 3, 16, 147, 528, 4096})
    for (std::int64_t N : {64, 183, 184, 4098, 6560, 65536, 262143})
      for (int partials : {1, 2}) {
        CAPTURE(programs);
        CAPTURE(N);
        const FinalizeGeometry f = finalize_geometry(programs, N, partials, 132);
        CHECK(N % f.vec == 0);
        CHECK(static_cast<std::int64_t>(f.tiles) * 32 * f.vec >= N);
        CHECK(static_cast<std::int64_t>(f.tiles - 1) * 32 * f.vec < N);
        CHECK(f.threads % 32 == 0);
        CHECK(f.threads >= 32);
        CHECK(f.threads * (f.vec > 1 ? f.vec : 1) <= 1024);  // the kernel's shared tile
        // No more slices than partial rows.
        CHECK(f.threads / 32 <= std::max<std::int64_t>(1, programs));
        CHECK(f.programs == programs);
        CHECK(f.N == N);
        CHECK(f.partials == partials);
      }
  // Backward geometry carries it where there are partial rows.
  const Geometry g = launch_geometry(Op::Backward, make_desc(1000, 4096), cfg(8, 256, 1), 132, 2);
  CHECK(g.finalize.tiles > 0);
  CHECK(launch_geometry(Op::Backward, make_desc(1, 4096), cfg(8, 256, 1), 132, 2).finalize.tiles == 0);
}

TEST_CASE("config_grid: simplicity_key puts fewer threads, fewer rows, one pass and wider vectors first") {
  auto simpler = [](const LaunchConfig& a, const LaunchConfig& b) { return simplicity_key(a) < simplicity_key(b); };
  CHECK(simpler(cfg(8, 32, 1), cfg(8, 64, 1)));
  CHECK(simpler(cfg(8, 64, 1), cfg(8, 32, 4)));
  CHECK(simpler(cfg(8, 128, 1), cfg(8, 32, 4)));
  CHECK(simpler(cfg(8, 128, 1), cfg(4, 128, 1)));
  CHECK(simpler(cfg(8, 1024, 1), cfg(8, 32, 1, true)));
  CHECK_FALSE(simpler(cfg(8, 64, 1), cfg(8, 64, 1)));
  CHECK_FALSE(simpler(cfg(8, 256, 1, true), cfg(8, 512, 1)));
  CHECK(simpler(cfg(8, 256, 1, false, 0), cfg(8, 256, 1, false, 2)));
  CHECK(simpler(cfg(8, 256, 1, false, 4), cfg(8, 512, 1, false, 0)));
}

TEST_CASE("config_grid: clusters split wide rows and decode rows, only where the device has them") {
  LaunchConfig c8 = cfg(8, 512, 1);
  c8.cluster = 8;
  CHECK(LaunchConfig::parse("v8.t512.r1.c8") == c8);
  CHECK(c8.str() == "v8.t512.r1.c8");
  CHECK_THROWS_AS(LaunchConfig::parse("v8.t512.r1.c32"), Error);
  CHECK_THROWS_AS(LaunchConfig::parse("v8.t512.r1.c3"), Error);

  const NormDesc wide = make_desc(4096, 65536);
  std::string why;
  // No clusters on a device without them (max_cluster 1), nor in the default grid.
  CHECK_FALSE(config_valid(Op::Forward, wide, c8, &why));
  CHECK(contains(why, "cluster 8"));
  for (const auto& c : candidate_grid(Op::Forward, wide)) CHECK(c.cluster == 1);
  // With clusters: valid, in the grid, and the heuristic keeps the row in
  // registers instead of reading it twice.
  CHECK(config_valid(Op::Forward, wide, c8, &why, 16));
  for (Op op : kOps) {
    CAPTURE(std::string(op_name(op)));
    const auto grid = candidate_grid(op, wide, 16);
    int clustered = 0;
    for (const auto& c : grid) {
      CAPTURE(c.str());
      CHECK(config_valid(op, wide, c, &why, 16));
      if (c.cluster > 1) {
        ++clustered;
        CHECK(c.rows_per_pid == 1);
        CHECK_FALSE(c.two_pass);
        // Staged rows split into whole chunks.
        if (c.stages) CHECK(wide.N % c.vec == 0);
      }
    }
    CHECK(clustered > 0);
    const LaunchConfig h = heuristic_config(op, wide, normjit_test::test_facts(16));
    CAPTURE(h.str());
    CHECK(h.cluster > 1);
    CHECK_FALSE(h.two_pass);
    CHECK(in_grid(grid, h));
    // Wide decode rows spread over a cluster (measured: 1x24576 fp16 4.5 us
    // over 16 CTAs, 6.3 us in one); large-M narrow rows stay in one CTA.
    CHECK(heuristic_config(op, make_desc(1, 32768), normjit_test::test_facts(16)).cluster > 1);
    CHECK(heuristic_config(op, make_desc(8192, 4096), normjit_test::test_facts(16)).cluster == 1);
    if (op == Op::Backward) CHECK(h.stages == 2);
  }
  // A cluster's rules: one row per program, no forward two-pass, whole
  // warps, whole chunks when staged.
  LaunchConfig bad = c8;
  bad.rows_per_pid = 2;
  CHECK_FALSE(config_valid(Op::Forward, wide, bad, &why, 16));
  bad = c8;
  bad.two_pass = true;
  CHECK_FALSE(config_valid(Op::Forward, wide, bad, &why, 16));
  // The backward streams a cluster's slices twice where they exceed its
  // registers (fp32 rows of 234K: one CTA a row ran 12x slower than 16).
  const NormDesc wide32 = make_desc(4, 234232, DType::F32, DType::F32);
  CHECK_FALSE(config_valid(Op::Backward, wide, bad, &why, 16));  // its slices fit registers
  bad.vec = 4;
  CHECK_MESSAGE(config_valid(Op::Backward, wide32, bad, &why, 16), why);
  const LaunchConfig h32 = heuristic_config(Op::Backward, wide32, normjit_test::test_facts(16));
  CAPTURE(h32.str());
  CHECK(h32.cluster >= 8);
  bad = c8;
  bad.threads_per_row = 16;
  CHECK_FALSE(config_valid(Op::Backward, wide, bad, &why, 16));
  bad = c8;
  bad.stages = 2;
  CHECK(config_valid(Op::Backward, wide, bad, &why, 16));
  CHECK(config_valid(Op::Backward, make_desc(4096, 65536 - 64), bad, &why, 16));  // ragged slices
  // More threads than the row has chunks.
  CHECK_FALSE(config_valid(Op::Forward, make_desc(4096, 4096), c8, &why, 16));
  // Decode rows (M <= 32) may spread over a cluster; large M at a narrow row may not.
  auto has_cluster = [](const std::vector<LaunchConfig>& g) {
    return std::any_of(g.begin(), g.end(), [](const LaunchConfig& c) { return c.cluster > 1; });
  };
  CHECK(has_cluster(candidate_grid(Op::Forward, make_desc(1, 4096), 16)));
  CHECK_FALSE(has_cluster(candidate_grid(Op::Forward, make_desc(32768, 4096), 16)));
  // Past decode, a forward row that one block holds stays in one CTA, wide
  // as it is; rows no block holds, and decode rows, may still split.
  CHECK_FALSE(has_cluster(candidate_grid(Op::Forward, make_desc(734, 21888, DType::F16, DType::F16), 16)));
  CHECK_FALSE(has_cluster(candidate_grid(Op::Forward, make_desc(117, 9464, DType::F16, DType::F16), 16)));
  CHECK(has_cluster(candidate_grid(Op::Forward, make_desc(32, 21888, DType::F16, DType::F16), 16)));
  CHECK(has_cluster(candidate_grid(Op::Forward, make_desc(4096, 65536), 16)));
  CHECK(has_cluster(candidate_grid(Op::Backward, make_desc(734, 21888, DType::F16, DType::F16), 16)));

  // Misaligned pointers give a kernel that compiles for every candidate:
  // the vec drops, then stages, then (dweight in shared memory needs its
  // stages) a two-pass row.
  for (const NormDesc& sd : {wide, make_desc(5, 65536), make_desc(1024, 262144), make_desc(3, 20000)})
    for (Op op : kOps)
      for (const auto& c : candidate_grid(op, sd, 16)) {
        CAPTURE(sd.str());
        CAPTURE(c.str());
        const char* base = reinterpret_cast<const char*>(std::uintptr_t{1} << 20);
        for (int off : {2, 4, 8}) {
          const LaunchConfig f = fit_alignment(c, op, sd, {{base + off, DType::BF16}}, row_strides(op, sd));
          CHECK_FALSE((dweight_in_smem(op, sd, f) && f.stages == 0));
          if (f.two_pass) CHECK(config_valid(op, sd, f, &why, 16));
        }
      }
  // Aligned pointers keep a staged cluster config whole.
  LaunchConfig staged = c8;
  staged.stages = 2;
  CHECK(fit_alignment(staged, Op::Backward, wide, {}, row_strides(Op::Backward, wide)) == staged);

  // Geometry: forward clusters x cluster CTAs; backward programs are clusters,
  // capped by the co-resident clusters the driver reports.
  const Geometry f = launch_geometry(Op::Forward, wide, c8, 132, 1);
  CHECK(f.grid == 4096 * 8);
  CHECK(f.programs == 4096);
  const Geometry b = launch_geometry(Op::Backward, wide, c8, 132, 2, 30);
  CHECK(b.programs == 30);
  CHECK(b.grid == 240);
  CHECK(launch_geometry(Op::Backward, wide, c8, 132, 2, 0).programs == 33);
  CHECK(launch_geometry(Op::Backward, make_desc(3, 65536), c8, 132, 2, 30).programs == 3);
  // Cluster rows that keep their weight in shared memory (16 CTAs, 32
  // elements a thread: 64 bytes of weight) are persistent too; those that
  // load it with the row (16 elements: 32 bytes), smaller clusters and
  // quantized ones are not.
  const LaunchConfig c8w = LaunchConfig::parse("v8.t128.r1.c16");
  CHECK(weight_smem_bytes(make_variant(Op::Forward, wide), c8w, 65536, false) == 128 * 64);
  CHECK(weight_smem_bytes(make_variant(Op::Forward, wide), LaunchConfig::parse("v8.t256.r1.c16"), 65536, false) == 0);
  CHECK(weight_smem_bytes(make_variant(Op::Forward, wide), LaunchConfig::parse("v8.t256.r1.c8"), 65536, false) == 0);
  const Geometry p = launch_geometry(Op::Forward, wide, c8w, 132, 8, 60);
  CHECK(p.programs == 60);
  CHECK(p.grid == 960);
  CHECK(launch_geometry(Op::Forward, wide, c8w, 132, 8, 0).programs == 66);
  CHECK(launch_geometry(Op::Forward, make_desc(7, 65536), c8w, 132, 4, 60).programs == 7);
  NormDesc q = wide;
  q.quant = QuantScaling::Group;
  q.quant_group = 128;
  q.y_dtype = DType::E4M3;
  CHECK(weight_smem_bytes(make_variant(Op::Forward, q), c8w, 65536, false) == 0);
}

TEST_CASE("config_grid: a grid of one cluster (dw_cluster) for decode backward rows with dweight or dbias") {
  const LaunchConfig dc = LaunchConfig::parse("v8.t256.r1.c4.dc");
  CHECK(dc.dw_cluster);
  CHECK(dc.cluster == 4);
  CHECK(dc.row_split() == 4);
  CHECK(dc.str() == "v8.t256.r1.c4.dc");
  CHECK_THROWS_AS(LaunchConfig::parse("v8.t1024.r1.dc"), Error);  // needs a cluster
  std::string why;
  const NormDesc d = make_desc(4, 8192);
  CHECK_MESSAGE(config_valid(Op::Backward, d, dc, &why, 16), why);
  // Its CTAs split every row: a slice of 2048 columns each.
  CHECK(slice_columns(d.N, dc) == 2048);
  CHECK_FALSE(config_valid(Op::Forward, make_desc(4, 8192), dc, &why, 16));
  for (const char* bad_cfg : {"v8.t256.r1.c4.dc.p2", "v8.t256.r1.c4.dc.s2", "v8.t16.r1.c4.dc"})
    CHECK_FALSE(config_valid(Op::Backward, d, LaunchConfig::parse(bad_cfg), &why, 16));
  NormDesc no_w = d;
  no_w.has_weight = false;  // RMSNorm without a weight: nothing to sum
  CHECK_FALSE(config_valid(Op::Backward, no_w, dc, &why, 16));
  // The batch: the largest power of two of rows (64 at most) whose slices
  // (x, dy), weight and exchange buffers fit the shared-memory budget.
  const detail::Variant v = make_variant(Op::Backward, d);
  const DcBatch b = dc_batch(v, d.N, dc);
  // 2048 bf16 columns of x and dy: 8 KiB a row; 32 rows (256 KiB) do not fit.
  CHECK(b.rows == 16);
  // 16 rows' slices, the weight's slice, then floats: sums received from 4
  // CTAs twice over, the rows' sums and (rstd, mean).
  CHECK(b.bytes == 16 * 8192 * 1 + 4096 + 4 * (2 * 4 * 16 + 16 + 2 * 16));
  const DcBatch wide = dc_batch(v, 131072, LaunchConfig::parse("v8.t1024.r1.c16.dc"));
  CHECK(wide.rows == 4);  // 8192 columns a CTA: 32 KiB a row of x and dy
  CHECK(wide.bytes == 4 * 32768 + 16384 + 4 * (2 * 16 * 4 + 4 + 2 * 4));
  CHECK(dc_batch(v, 512, LaunchConfig::parse("v8.t32.r1.c2.dc")).rows == kDcMaxRows);
  // Row groups (r4: four groups of 128 threads take every fourth row) sum
  // dweight apart, then through shared memory in the rows' place: 3 groups'
  // 2048-column sums (24 KiB) fit within 16 rows' slices.
  const LaunchConfig groups = LaunchConfig::parse("v8.t128.r4.c4.dc");
  CHECK_MESSAGE(config_valid(Op::Backward, d, groups, &why, 16), why);
  CHECK(dc_batch(v, d.N, groups).bytes == b.bytes);
  // 7 groups' sums of 8192 columns (224 KiB) and the weight exceed the budget.
  CHECK(dc_batch(v, 131072, LaunchConfig::parse("v8.t128.r8.c16.dc")).rows == 0);
  CHECK_FALSE(config_valid(Op::Backward, make_desc(2, 262144, DType::F32, DType::F32),
                           LaunchConfig::parse("v4.t1024.r1.c2.dc"), &why, 16));  // 1 MiB a row slice
  // One program: the grid is the cluster, and no finalize launch follows.
  const Geometry g = launch_geometry(Op::Backward, d, dc, 132, 1, 30);
  CHECK(g.grid == 4);
  CHECK(g.programs == 1);
  CHECK(launch_geometry(Op::Backward, make_desc(37, 8192), dc, 132, 1, 30).grid == 4);
  // In the grid for decode rows only, in blocks of 128 threads or more.
  auto dcs = [](const NormDesc& x) {
    std::set<int> sizes;
    for (const auto& c : candidate_grid(Op::Backward, x, 16))
      if (c.dw_cluster) sizes.insert(c.cluster);
    return sizes;
  };
  CHECK(dcs(make_desc(1, 8192)).count(16) == 1);  // a few rows spread over 16 SMs
  CHECK(dcs(make_desc(3, 8192)).count(16) == 1);
  for (const auto& c : candidate_grid(Op::Backward, make_desc(3, 8192), 16))
    if (c.dw_cluster) CHECK(c.threads() >= 128);
  CHECK_FALSE(dcs(make_desc(64, 8192)).empty());
  CHECK(dcs(make_desc(4096, 8192)).empty());
  // The spec: CLUSTER is the cluster, DW_CLUSTER and the batch's rows; its
  // dynamic shared memory is the batch's.
  const KernelSpec s = make_spec(Op::Backward, d, dc);
  CHECK(s.source().find("CLUSTER = 4;") != std::string::npos);
  CHECK(s.source().find("DW_CLUSTER = true") != std::string::npos);
  CHECK(s.source().find(fmt::format("DC_ROWS = {};", b.rows)) != std::string::npos);
  CHECK(s.dynamic_smem() == b.bytes);
  CHECK(make_spec(Op::Backward, d, LaunchConfig::parse("v8.t1024.r1.s2")).source().find("DW_CLUSTER") ==
        std::string::npos);
}

TEST_CASE("config_grid: forward stages 1 stages the weight where that changes the kernel; launches whose CTAs are all resident run it") {
  // LayerNorm 6560 in 512 threads: two chunks of weight and bias a thread
  // (64 bytes), which the unstaged kernel loads one at a time after the
  // reduction.
  NormDesc ln = make_desc(147, 6560);
  ln.norm = NormKind::LayerNorm;
  ln.has_bias = true;
  const detail::Variant lv = make_variant(Op::Forward, ln);
  const LaunchConfig c = LaunchConfig::parse("v8.t512.r1");
  LaunchConfig s = c;
  s.stages = 1;
  CHECK(s.str() == "v8.t512.r1.s1");
  CHECK(LaunchConfig::parse("v8.t512.r1.s1") == s);
  const WeightStaging u = weight_staging(lv, c, 6560, false), st = weight_staging(lv, s, 6560, false);
  CHECK_FALSE(u.with_row);
  CHECK(u.batch == 1);
  CHECK(st.with_row);
  CHECK(st.batch == 2);
  CHECK(st.bytes == 64);
  CHECK(forward_register_need(lv, s, 6560, false) > forward_register_need(lv, c, 6560, false));
  CHECK(contains(make_spec(Op::Forward, ln, s).source(), "WB_WITH_ROW = true;\n  static constexpr int WB_BATCH = 2;"));
  CHECK_FALSE(contains(make_spec(Op::Forward, ln, c).source(), "WB_"));  // unstaged sources are what they were
  std::string why;
  CHECK(config_valid(Op::Forward, ln, s, &why));
  CHECK(staged_variant(Op::Forward, ln, c) == s);
  CHECK_FALSE(staged_variant(Op::Forward, ln, LaunchConfig::parse("v8.t1024.r1")).has_value());
  // Where the unstaged kernel already loads them with the row, stages 1 is the same kernel.
  CHECK_FALSE(config_valid(Op::Forward, ln, LaunchConfig::parse("v8.t1024.r1.s1"), &why));
  CHECK(contains(why, "already loads its weight and bias with the row"));
  CHECK_FALSE(config_valid(Op::Forward, ln, LaunchConfig::parse("v8.t512.r1.s2"), &why));
  CHECK(contains(why, "forward stages is 1"));
  NormDesc q = make_desc(64, 4096);
  q.quant = QuantScaling::Token;
  q.y_dtype = DType::E4M3;
  CHECK_FALSE(config_valid(Op::Forward, q, LaunchConfig::parse("v8.t128.r1.s1"), &why));
  // The grid holds unstaged configs only.
  for (const auto& g : candidate_grid(Op::Forward, ln)) CHECK(g.stages == 0);

  // A staged batch never takes a thread past what its block allows.
  for (const char* t : {"v8.t128.r1.s1", "v8.t256.r4.s1", "v4.t1024.r1.s1", "v8.t128.r8.s1"}) {
    CAPTURE(t);
    const LaunchConfig x = LaunchConfig::parse(t);
    NormDesc r = make_desc(64, 7400);
    r.residual = r.store_residual_out = true;
    if (!config_valid(Op::Forward, r, x)) continue;
    CHECK(forward_register_need(make_variant(Op::Forward, r), x, 7400, false) <= std::min(255, 65536 / x.threads()));
  }

  // 147 rows of 512 threads on 132 SMs: resident at once only if an SM
  // holds two; 8192 rows never are.
  const DeviceFacts f = test_facts();
  const LaunchConfig run = staged_for_launch(Op::Forward, ln, c, f);
  const int per_sm = std::min(4, 65536 / (512 * ((forward_register_need(lv, s, 6560, false) + 7) / 8 * 8)));
  CHECK((run == s) == (147 <= 132 * per_sm));
  NormDesc few = ln;
  few.M = 100;
  CHECK(staged_for_launch(Op::Forward, few, c, f) == s);
  NormDesc many = ln;
  many.M = 8192;
  CHECK(staged_for_launch(Op::Forward, many, c, f) == c);
  CHECK(staged_for_launch(Op::Backward, few, LaunchConfig::parse("v8.t512.r1"), f) == LaunchConfig::parse("v8.t512.r1"));
  CHECK(staged_for_launch(Op::Forward, few, LaunchConfig::parse("v8.t1024.r1"), f) == LaunchConfig::parse("v8.t1024.r1"));
}

TEST_CASE("config_model: forward rows read twice only where no config holds the row in registers") {
  // The shapes where the model had picked two-pass rows (1.4-2.4x the
  // fastest), and rows no config holds on a GPU without clusters.
  for (const char* spec : {"rms:bf16:512x100003:res", "ln:bf16:700x98305:res", "rms:bf16:1024x77777",
                           "rms:fp32:1024x200001", "rms:bf16:256x262144"}) {
    const NormDesc d = detail::parse_shape_spec(spec).desc;
    const std::string shape = spec;
    CAPTURE(shape);
    for (int max_cluster : {16, 1}) {
      CAPTURE(max_cluster);
      const auto grid = detail::candidate_grid(Op::Forward, d, max_cluster);
      const LaunchConfig h = heuristic_config(Op::Forward, d, normjit_test::test_facts(max_cluster));
      CAPTURE(h.str());
      CHECK(h.two_pass == all_two_pass(grid));
    }
  }
}

TEST_CASE("config_model: tensor scaling at decode takes rows per program that one cluster's programs hold") {
  // Current (tensor) scaling in one launch needs a program for each row
  // group within one cluster (launch_rows); past that it pays a zeroed
  // amax and a second launch. Decode shapes of several rows therefore get
  // no more row groups than the device's cluster holds.
  for (auto [M, N] : {std::pair<std::int64_t, std::int64_t>{4, 4096}, {32, 7168}, {61, 2880}, {40, 6144}, {3, 5111}}) {
    NormDesc d = detail::parse_shape_spec(fmt::format("rms:bf16:{}x{}:quant=e4m3/tensor", M, N)).desc;
    CAPTURE(d.str());
    const LaunchConfig h = heuristic_config(Op::Forward, d, normjit_test::test_facts(16));
    CAPTURE(h.str());
    CHECK((M + h.rows_per_pid - 1) / h.rows_per_pid <= 16);
  }
}

TEST_CASE("config_model: quantized rows take CTAs of at most 512 threads, token rows at most 48 elements a thread") {
  // Where a one-pass config obeys them (config_model.cpp says what was timed).
  const auto pick = [](const std::string& spec) {
    const NormDesc d = detail::parse_shape_spec(spec).desc;
    return std::make_pair(d, heuristic_config(Op::Forward, d, normjit_test::test_facts()));
  };
  for (const char* spec : {"rms:bf16:32x7168:quant=e4m3/token", "rms:bf16:64x8192:quant=e4m3/group128",
                           "rms:bf16:16x5120:quant=e4m3/tensor-static", "rms:bf16:1x4096:quant=e4m3/token:yhp",
                           "ln:bf16:40x6144:quant=e4m3/mx32", "rms:bf16:2048x16384:quant=e4m3/token"}) {
    const auto [d, c] = pick(spec);
    CAPTURE(spec);
    CAPTURE(c.str());
    CHECK(c.threads() <= 512);
  }
  for (const char* spec : {"rms:bf16:8192x4096:quant=e4m3/token", "rms:bf16:2048x16384:quant=e4m3/token",
                           "rms:bf16:16384x2048:quant=e4m3/token", "rms:bf16:4096x8192:quant=e4m3/token:yhp"}) {
    const auto [d, c] = pick(spec);
    CAPTURE(spec);
    CAPTURE(c.str());
    CHECK(c.threads_per_row * 48 >= d.N);
  }
  // A row that no such config holds at 32 elements a thread keeps its 1024
  // threads, or splits over a cluster (decode), token rows after a fused
  // residual add their 64 elements a thread, and unquantized rows are priced
  // as before.
  CHECK(pick("rms:bf16:4096x16384:quant=e4m3/token:res").second.threads_per_row * 48 < 16384);
  const LaunchConfig wide = pick("rms:bf16:1024x65536:quant=e4m3/token").second;
  CHECK((wide.threads() > 512 || wide.cluster > 1));
  CHECK(pick("rms:bf16:16x65536:quant=e4m3/token").second.cluster > 1);
  CHECK(pick("rms:bf16:32x7168").second.str() ==
        heuristic_config(Op::Forward, make_desc(32, 7168), normjit_test::test_facts()).str());
}

TEST_CASE("config_model: one-wave forward rows and rows without a residual take no 1024-thread CTA outside a cluster") {
  // Decode shapes, and wider launches without a residual, whose model pick
  // was a 1024-thread row before the rule (config_model.cpp,
  // caps_cta_threads), on the test device with clusters and without;
  // clusters keep their 1024-thread slices.
  for (int max_cluster : {16, 1}) {
    for (const char* spec : {"rms:bf16:32x8192", "rms:bf16:3x5456", "rms:bf16:64x7168", "rms:bf16:16x5120",
                             "rms:fp16:25x6200", "ln:bf16:16x8192", "ln:fp32:2x3176", "rms:bf16:1x8192:res",
                             "rms:bf16:2048x20000", "rms:bf16:152x16800", "ln:fp16:2000x27775",
                             "rms:bf16:4096x24576"}) {
      const NormDesc d = detail::parse_shape_spec(spec).desc;
      const LaunchConfig c = heuristic_config(Op::Forward, d, normjit_test::test_facts(max_cluster));
      CAPTURE(spec);
      CAPTURE(max_cluster);
      CAPTURE(c.str());
      CHECK((c.row_split() > 1 || c.threads() < 1024));
    }
  }
  const LaunchConfig wide = heuristic_config(Op::Forward, detail::parse_shape_spec("rms:fp32:4x121240").desc,
                                             normjit_test::test_facts(16));
  CAPTURE(wide.str());
  CHECK((wide.row_split() > 1 && wide.threads() == 1024));
  // Past one wave, rows after a fused residual add keep their 1024-thread
  // CTAs (there they were fastest: rms fp16 1688x25856:res on the H200).
  const LaunchConfig res = heuristic_config(Op::Forward, detail::parse_shape_spec("rms:fp16:1688x25856:res").desc,
                                            normjit_test::test_facts(16));
  CAPTURE(res.str());
  CHECK((res.row_split() == 1 && res.threads() == 1024));
}

TEST_CASE("config_model: short forward rows hold at most 4 chunks a thread, or take 16 threads") {
  // Narrow rows whose model pick held 5-8 chunks on 2-8 threads before the
  // rule (config_model.cpp, short_row_threads; measured: ln fp16 11078x485
  // v8.t8.r4 1.45x the fastest, rms bf16 437070x72 with a residual v8.t2.r16
  // 1.36x), and rows whose chunks ask fewer than 16 threads.
  for (const char* spec : {"ln:fp16:11078x485", "rms:bf16:437070x72:res", "rms:bf16:32768x128", "ln:bf16:35215x160",
                           "rms:fp16:39864x424", "ln:bf16:23132x72", "rms:bf16:130492x152:res", "ln:bf16:100361x112:res",
                           "rms:fp32:31041x88", "ln:fp32:1700x688"}) {
    const NormDesc d = detail::parse_shape_spec(spec).desc;
    const LaunchConfig c = heuristic_config(Op::Forward, d, normjit_test::test_facts(16));
    const std::int64_t chunks = (d.N + c.vec - 1) / c.vec;
    const std::string shape = spec;
    CAPTURE(shape);
    CAPTURE(c.str());
    CHECK(c.threads_per_row >= std::min<std::int64_t>(16, (chunks + 3) / 4));
  }
  // The floor follows the chunks: N = 72 in vectors of 8 (9 chunks) keeps
  // rows of 4 threads open (ln bf16 23132x72: v8.t4.r64 4.00 us, v8.t16.r32
  // 4.86 on an H200).
  const LaunchConfig n72 = heuristic_config(Op::Forward, detail::parse_shape_spec("ln:bf16:23132x72").desc,
                                            normjit_test::test_facts(16));
  CAPTURE(n72.str());
  CHECK(n72.threads_per_row < 16);
}

TEST_CASE("config_model: short backward rows take a warp, or a thread per 4 elements") {
  // Narrow backward rows whose pick split them over 8-16 threads before the
  // rule (config_model.cpp, kMinBwdRowThreads; measured on an H200: rms fp32
  // 8747x104 v2.t8.r4 1.40x the fastest, ln bf16 2x184 v4.t16.r2 1.34x, rms
  // bf16 3x72 v4.t8.r4 1.25x, rms bf16 8x120 v4.t16.r8 1.32x).
  const DeviceFacts h200 = DeviceFacts::of(9, 0, 132, std::int64_t{60} << 20, 4814);
  for (const char* spec : {"rms:fp32:8747x104", "ln:bf16:2x184", "rms:bf16:3x72", "rms:bf16:8x120", "ln:fp16:2x176",
                           "rms:fp32:2x72", "ln:bf16:5539x72"}) {
    const NormDesc d = detail::parse_shape_spec(spec).desc;
    const LaunchConfig c = heuristic_config(Op::Backward, d, h200);
    const std::string shape = spec;
    CAPTURE(shape);
    CAPTURE(c.str());
    CHECK(c.threads_per_row >= std::min<std::int64_t>(32, (d.N + 3) / 4));
  }
}

TEST_CASE("config_model: a forward row peels only where that pays more than its edges cost") {
  // Decode and short rows whose pick peeled a vector that does not divide N,
  // where its unpeeled twin (half the vector, twice the threads) was the
  // fastest on the recorded grids (config_model.cpp, kPeelCost: H200 rms bf16
  // 4x180 v8.t32.r1 1.40x the fastest, ln bf16 6x484 1.34x, rms fp32 8x70
  // 1.32x; H100 ln bf16 21x500 1.30x).
  for (const char* spec : {"rms:bf16:4x180", "ln:bf16:6x484", "ln:bf16:21x500", "rms:fp32:8x70", "rms:fp32:5x398",
                           "ln:fp32:2x1626", "rms:fp32:59x350:res"}) {
    const NormDesc d = detail::parse_shape_spec(spec).desc;
    const DeviceFacts h200 = DeviceFacts::of(9, 0, 132, std::int64_t{60} << 20, 4814);
    const LaunchConfig c = heuristic_config(Op::Forward, d, h200);
    const std::string shape = spec;
    CAPTURE(shape);
    CAPTURE(c.str());
    CHECK_FALSE(peeled(Op::Forward, d, c.vec));
  }
  // An odd N peels every vector wider than 1, and keeps doing so: elements
  // one at a time cost far more than the edges.
  const NormDesc odd = detail::parse_shape_spec("rms:bf16:4096x4097").desc;
  const LaunchConfig c = heuristic_config(Op::Forward, odd, DeviceFacts::of(9, 0, 132, std::int64_t{60} << 20, 4814));
  CAPTURE(c.str());
  CHECK(c.vec > 1);
  CHECK(peeled(Op::Forward, odd, c.vec));
}

TEST_CASE("config_model: cluster rows whose weight L1 cannot keep pay its reads from L2; rows of clusters of 16 keep it in shared memory") {
  // rms bf16 of 200000-262144 (a weight of 400-512 KB): the persistent
  // clusters of 16 (weight_smem_bytes), measured 1.07-1.15x over the
  // v8.t512.r1.c8 the model took before (H200, docs/results/wide-fwd-s25.md).
  const DeviceFacts h200 = DeviceFacts::of(9, 0, 132, std::int64_t{60} << 20, 4814);
  for (const char* spec : {"rms:bf16:256x262144", "rms:bf16:64x262144", "rms:bf16:300x200000", "rms:fp16:700x180000"}) {
    const NormDesc d = detail::parse_shape_spec(spec).desc;
    const LaunchConfig c = heuristic_config(Op::Forward, d, h200);
    CAPTURE(spec);
    CAPTURE(c.str());
    CHECK(c.row_split() == 16);
    CHECK(weight_smem_bytes(make_variant(Op::Forward, d), c, static_cast<int>(d.N), false) > 0);
  }
  // A weight of 128 KB stays in L1: nothing to pay, the pick as before.
  CHECK(heuristic_config(Op::Forward, make_desc(4096, 65536), h200).str() == "v8.t256.r1.c4");
  // The L1 beside shared memory, by architecture.
  CHECK(DeviceFacts::of(9, 0, 132, 0, 0).l1_smem_per_sm == 262144);
  CHECK(DeviceFacts::of(8, 0, 108, 0, 0).l1_smem_per_sm == 196608);
  CHECK(DeviceFacts::of(8, 9, 128, 0, 0).l1_smem_per_sm == 131072);
}

TEST_CASE("device_facts: an arch name's SM number and largest cluster") {
  CHECK(sm_of_arch("sm_90") == 90);
  CHECK(sm_of_arch("sm_90a") == 90);
  CHECK(sm_of_arch("sm_80") == 80);
  CHECK(max_cluster_of_arch(sm_of_arch("sm_90a")) == kMaxCluster);
  CHECK(max_cluster_of_arch(sm_of_arch("sm_89")) == 1);
}

TEST_CASE("row_budget: peeled 512-thread rows of up to 56 elements a thread are bounded to two CTAs an SM") {
  // Odd N: rows start anywhere in a vector (peeled).
  auto desc = [](std::int64_t M, std::int64_t N, bool ln, bool residual) {
    NormDesc d = make_desc(M, N, DType::BF16, DType::BF16);
    if (ln) {
      d.norm = NormKind::LayerNorm;
      d.has_bias = true;
    }
    if (residual) d.residual = d.store_residual_out = true;
    return d;
  };
  auto blocks = [](const NormDesc& d, const char* cfg) {
    const LaunchConfig c = LaunchConfig::parse(cfg);
    REQUIRE(peeled(Op::Forward, d, c.vec));
    return forward_min_blocks(make_variant(Op::Forward, d), c, static_cast<int>(d.N), true);
  };
  // 7 chunks of 8 a thread (the view of 24577: 3073 chunks over 512 threads).
  const NormDesc rms = desc(2048, 24577, false, false);
  CHECK(blocks(rms, "v8.t512.r1") == 2);
  CHECK(forward_register_budget(make_variant(Op::Forward, rms), LaunchConfig::parse("v8.t512.r1"), 24577, true) == 64);
  CHECK(blocks(desc(3000, 16385, true, false), "v8.t512.r1") == 2);
  // 64 elements a thread lost to their spills; residual rows and programs of
  // several rows are left to the register estimate.
  CHECK(blocks(desc(4000, 30001, false, false), "v8.t512.r1") == 1);
  CHECK(blocks(desc(2048, 24577, true, true), "v8.t512.r1") == 1);
  CHECK(blocks(desc(6108, 5333, true, false), "v8.t128.r4") != 2);
  // Unpeeled twins keep their estimate.
  const NormDesc even = desc(2048, 24576, false, false);
  CHECK(forward_min_blocks(make_variant(Op::Forward, even), LaunchConfig::parse("v8.t512.r1"), 24576, false) == 1);
}
