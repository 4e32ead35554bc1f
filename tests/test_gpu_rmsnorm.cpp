// RMSNorm forward and backward through the Engine against the float64 CPU
// reference: every N of the issue, several M, dtype combinations, strided
// and unaligned tensors; outputs poisoned before each run.
#include <doctest/doctest.h>

#include <algorithm>

#include "gpu_harness.hpp"

using namespace normjit;
using namespace normjit::test;

namespace {

struct Layout {
  std::int64_t pad = 0;     // extra elements per row (stride = N + pad)
  std::int64_t offset = 0;  // elements between the allocation and the tensor
};

struct DtypeCombo {
  DType x, y, w;
};

Engine& engine() {
  static Engine e(suite_engine_options("rmsnorm"));
  return e;
}

NormDesc make_desc(std::int64_t M, std::int64_t N, DtypeCombo c, Layout l) {
  NormDesc d;
  d.M = M;
  d.N = N;
  d.x_dtype = c.x;
  d.y_dtype = c.y;
  d.weight_dtype = c.w;
  d.eps = 1e-5f;
  if (l.pad) d.x_stride = d.y_stride = d.dy_stride = d.dx_stride = N + l.pad;
  return d;
}

// Elements between each tensor's allocation and its start (Layout::offset
// gives all three the same).
struct Offsets {
  std::int64_t x = 0, y = 0, w = 0;
};

void check_forward(std::int64_t M, std::int64_t N, DtypeCombo c, Layout l, Offsets o) {
  const NormDesc d = make_desc(M, N, c, l);
  const std::uint64_t seed = fresh_seed();
  CAPTURE(d.str());
  CAPTURE(l.pad);
  CAPTURE(o.x);
  CAPTURE(o.y);
  CAPTURE(o.w);
  CAPTURE(seed);
  Random rng(seed);
  Tensor x(c.x, M, d.x_ld(), N, o.x), w(c.w, 1, N, N, o.w), y(c.y, M, d.y_ld(), N, o.y), rstd(DType::F32, 1, M, M);
  x.fill_random(rng, -3.f, 3.f);
  w.fill_random(rng, -2.f, 2.f);
  y.poison();
  rstd.poison();
  engine().rms_norm_forward(d, x.ptr(), w.ptr(), y.ptr(), static_cast<float*>(rstd.ptr()), nullptr);
  y.download();
  rstd.download();
  if (M == 0) return;  // see "M = 0 writes nothing"
  std::vector<double> y_ref, rstd_ref;
  rms_forward_reference(d, x.host.data(), w.host.data(), &y_ref, &rstd_ref);
  CHECK(relative_error(y.values(), y_ref) <= tolerance(c.y));
  CHECK(relative_error(rstd.values(), rstd_ref) <= 1e-5);
  CHECK(y.padding_untouched());
}

void check_forward(std::int64_t M, std::int64_t N, DtypeCombo c, Layout l) {
  check_forward(M, N, c, l, {l.offset, l.offset, l.offset});
}

// Offsets: o.x for x, o.y for dy and dx, o.w for the weight and dweight.
void check_backward(std::int64_t M, std::int64_t N, DtypeCombo c, Layout l, Offsets o) {
  const NormDesc d = make_desc(M, N, c, l);
  const std::uint64_t seed = fresh_seed();
  CAPTURE(d.str());
  CAPTURE(l.pad);
  CAPTURE(o.x);
  CAPTURE(o.y);
  CAPTURE(o.w);
  CAPTURE(seed);
  Random rng(seed);
  Tensor x(c.x, M, d.x_ld(), N, o.x), w(c.w, 1, N, N, o.w), dy(c.y, M, d.dy_ld(), N, o.y),
      rstd(DType::F32, 1, M, M), dx(c.x, M, d.dx_ld(), N, o.y), dw(c.w, 1, N, N, o.w);
  x.fill_random(rng, -3.f, 3.f);
  w.fill_random(rng, -2.f, 2.f);
  dy.fill_random(rng, -1.f, 1.f);
  // rstd as the forward computes it, so dx is the true gradient.
  {
    std::vector<double> y_ref, r;
    if (M > 0) rms_forward_reference(d, x.host.data(), w.host.data(), &y_ref, &r);
    for (std::int64_t i = 0; i < M; ++i) store_as(DType::F32, rstd.host.data(), i, static_cast<float>(r[i]));
    rstd.upload();
  }
  dx.poison();
  dw.poison();
  const std::size_t ws_bytes = engine().rms_norm_backward_workspace_size(d);
  CHECK(ws_bytes <= static_cast<std::size_t>(std::max<std::int64_t>(M, 1)) * N * 4 + 1024 * N * 4);
  DeviceBuffer ws(std::max<std::size_t>(ws_bytes, 16));
  engine().rms_norm_backward(d, dy.ptr(), x.ptr(), w.ptr(), static_cast<const float*>(rstd.ptr()), dx.ptr(), dw.ptr(),
                             ws.ptr(), ws.bytes(), nullptr);
  dx.download();
  dw.download();
  if (M == 0) return;
  std::vector<double> dx_ref, dw_ref, dx_scale;
  rms_backward_reference(d, dy.host.data(), x.host.data(), w.host.data(),
                         reinterpret_cast<const float*>(rstd.host.data()), &dx_ref, &dw_ref, &dx_scale);
  CHECK(scaled_error(dx.values(), dx_ref, dx_scale) <= tolerance(c.x));
  CHECK(relative_error(dw.values(), dw_ref) <= tolerance(c.w));
  CHECK(dx.padding_untouched());

  // Deterministic: a second run gives bitwise the same dx and dweight.
  const auto dx1 = dx.host, dw1 = dw.host;
  dx.poison();
  dw.poison();
  engine().rms_norm_backward(d, dy.ptr(), x.ptr(), w.ptr(), static_cast<const float*>(rstd.ptr()), dx.ptr(), dw.ptr(),
                             ws.ptr(), ws.bytes(), nullptr);
  dx.download();
  dw.download();
  CHECK(dx.host == dx1);
  CHECK(dw.host == dw1);
}

void check_backward(std::int64_t M, std::int64_t N, DtypeCombo c, Layout l) {
  check_backward(M, N, c, l, {l.offset, l.offset, l.offset});
}

const std::int64_t kNs[] = {1, 7, 64, 127, 128, 1000, 4096, 5120, 7168, 12288, 16384, 65536, 262144};
const DtypeCombo kMain[] = {
    {DType::BF16, DType::BF16, DType::BF16}, {DType::F16, DType::F16, DType::F32}, {DType::F32, DType::F32, DType::F32}};
const DtypeCombo kAll[] = {
    {DType::BF16, DType::BF16, DType::BF16}, {DType::BF16, DType::BF16, DType::F32}, {DType::F16, DType::F16, DType::F16},
    {DType::F16, DType::F16, DType::F32},    {DType::F32, DType::F32, DType::F32},   {DType::BF16, DType::F32, DType::F32},
    {DType::F32, DType::BF16, DType::BF16},  {DType::F16, DType::BF16, DType::F32}};

// M = 0, decode rows, and enough rows for several rows per program and (up
// to N = 4096) a persistent backward grid that loops; fewer of the wider
// rows: their volume, not a code path, grows with M (the host fills and
// converts every element).
std::vector<std::int64_t> rows_for(std::int64_t N) {
  if (N >= 65536) return {0, 1, 3, 19};
  if (N > 4096) return {0, 1, 3, 150};
  return {0, 1, 3, 1000};
}

// Every call of the two cases below, compiled up front in parallel.
void precompile_main(Op op) {
  std::vector<Call> calls;
  for (auto N : kNs)
    for (auto M : rows_for(N))
      for (auto c : kMain) calls.push_back({op, make_desc(M, N, c, {})});
  precompile_calls(engine(), calls);
}

}  // namespace

GPU_TEST_CASE("rms_norm forward matches float64 for every N, M and main dtype combination") {
  precompile_main(Op::Forward);
  for (auto N : kNs)
    for (auto M : rows_for(N))
      for (auto c : kMain) check_forward(M, N, c, {});
}

GPU_TEST_CASE("rms_norm backward matches float64 for every N, M and main dtype combination, deterministically") {
  precompile_main(Op::Backward);
  for (auto N : kNs)
    for (auto M : rows_for(N))
      for (auto c : kMain) check_backward(M, N, c, {});
}

GPU_TEST_CASE("M = 0 writes nothing") {
  const NormDesc d = make_desc(0, 4096, kMain[0], {});
  DeviceBuffer out(4096 * 4), ws(16);
  NJ_CU(cuMemsetD8Async(out.get(), 0xff, out.bytes(), nullptr));
  engine().rms_norm_forward(d, out.ptr(), out.ptr(), out.ptr(), static_cast<float*>(out.ptr()), nullptr);
  CHECK(engine().rms_norm_backward_workspace_size(d) == 0);
  engine().rms_norm_backward(d, out.ptr(), out.ptr(), out.ptr(), static_cast<const float*>(out.ptr()), out.ptr(),
                             out.ptr(), ws.ptr(), 0, nullptr);
  std::vector<unsigned char> host(out.bytes());
  NJ_CU(cuCtxSynchronize());
  NJ_CU(cuMemcpyDtoH(host.data(), out.get(), host.size()));
  CHECK(std::count(host.begin(), host.end(), 0xff) == static_cast<std::ptrdiff_t>(host.size()));
}

GPU_TEST_CASE("rms_norm forward and backward for every dtype combination") {
  std::vector<Call> calls;
  for (auto N : {std::int64_t{127}, std::int64_t{4096}})
    for (auto c : kAll)
      for (Op op : {Op::Forward, Op::Backward}) calls.push_back({op, make_desc(1000, N, c, {})});
  precompile_calls(engine(), calls);
  for (auto N : {std::int64_t{127}, std::int64_t{4096}})
    for (auto c : kAll) {
      check_forward(1000, N, c, {});
      check_backward(1000, N, c, {});
    }
}

GPU_TEST_CASE("strided and unaligned tensors" * doctest::test_suite("quick")) {
  // Odd strides and offsets lower the vector width (fit_alignment).
  const Layout layouts[] = {{8, 0}, {1, 0}, {0, 1}, {3, 1}};
  std::vector<Call> calls;
  for (auto N : {std::int64_t{64}, std::int64_t{1000}, std::int64_t{4096}, std::int64_t{65536}})
    for (auto l : layouts)
      for (auto c : {kMain[0], kMain[2]})
        for (Op op : {Op::Forward, Op::Backward})
          calls.push_back({op, make_desc(N >= 65536 ? 5 : 300, N, c, l), l.offset});
  precompile_calls(engine(), calls);
  for (auto N : {std::int64_t{64}, std::int64_t{1000}, std::int64_t{4096}, std::int64_t{65536}})
    for (auto l : layouts)
      for (auto c : {kMain[0], kMain[2]}) {
        check_forward(N >= 65536 ? 5 : 300, N, c, l);
        check_backward(N >= 65536 ? 5 : 300, N, c, l);
      }
}

GPU_TEST_CASE("peeled rows: x and y (dy and dx) starting at any element of a vector, odd N" *
              doctest::test_suite("quick")) {
  // Odd N: row r starts r * N elements in, anywhere inside a vector. Rows of
  // x and y that start at the same element of a vector keep whole vectors
  // (peeled); where they differ, or the weight is misaligned, the engine
  // narrows the vectors. Every element is checked either way.
  struct Case {
    std::int64_t M, N, x_off, y_off, w_off;
    DtypeCombo c;
  };
  const DtypeCombo bf16{DType::BF16, DType::BF16, DType::BF16}, f32{DType::F32, DType::F32, DType::F32},
      mixed{DType::BF16, DType::F32, DType::BF16};
  const Case cases[] = {{64, 12345, 0, 0, 0, bf16},  {64, 12345, 3, 3, 0, bf16}, {64, 12345, 1, 2, 0, bf16},
                        {64, 12345, 3, 3, 1, bf16},  {300, 77, 5, 5, 0, f32},    {300, 77, 2, 2, 0, mixed},
                        {2, 100003, 7, 7, 0, bf16},  {4096, 4099, 0, 0, 0, bf16}};
  for (const Case& k : cases) check_forward(k.M, k.N, k.c, {}, {k.x_off, k.y_off, k.w_off});
  // The backward peels too where x, dy and dx (dy and dx at y_off here)
  // start at the same element of a vector, else narrows its vectors.
  for (const Case& k : cases) check_backward(k.M, k.N, k.c, {}, {k.x_off, k.y_off, k.w_off});
}

GPU_TEST_CASE("64-bit offsets: row strides that leave the 32-bit range") {
  // 3 rows 2^30 + 64 elements apart: row 2 starts past element 2^31, so the
  // kernels need 64-bit offsets. Only the rows themselves travel to the host.
  const std::int64_t M = 3, N = 4096, ld = (std::int64_t{1} << 30) + 64;
  for (Op op : {Op::Forward, Op::Backward}) {
    NormDesc d = make_desc(M, N, kMain[0], {});
    d.x_stride = d.y_stride = d.dy_stride = d.dx_stride = ld;
    CAPTURE(op_name(op));
    const std::size_t bytes = static_cast<std::size_t>((M - 1) * ld + N) * 2;
    DeviceBuffer big_in(bytes), big_out(bytes);
    NJ_CU(cuMemsetD8Async(big_out.get(), 0xff, bytes, nullptr));
    NormDesc dense = d;  // the same rows, packed, for the host reference
    dense.x_stride = dense.y_stride = dense.dy_stride = dense.dx_stride = 0;
    Random rng(fresh_seed());
    Tensor x(DType::BF16, M, N, N), w(DType::BF16, 1, N, N), g(DType::BF16, M, N, N), rstd(DType::F32, 1, M, M),
        dw(DType::BF16, 1, N, N);
    x.fill_random(rng, -3.f, 3.f);
    w.fill_random(rng, -2.f, 2.f);
    g.fill_random(rng, -1.f, 1.f);
    std::vector<double> y_ref, rstd_ref, dx_ref, dw_ref;
    rms_forward_reference(dense, x.host.data(), w.host.data(), &y_ref, &rstd_ref);
    for (std::int64_t r = 0; r < M; ++r) {
      NJ_CU(cuMemcpyHtoD(big_in.get() + r * ld * 2, x.host.data() + r * N * 2, N * 2));
      store_as(DType::F32, rstd.host.data(), r, static_cast<float>(rstd_ref[r]));
    }
    rstd.upload();
    const std::vector<double>* ref = &y_ref;
    if (op == Op::Forward) {
      engine().rms_norm_forward(d, big_in.ptr(), w.ptr(), big_out.ptr(), static_cast<float*>(rstd.ptr()), nullptr);
    } else {
      // dy is g's rows placed in the output buffer's layout; dx overwrites it.
      for (std::int64_t r = 0; r < M; ++r) NJ_CU(cuMemcpyHtoD(big_out.get() + r * ld * 2, g.host.data() + r * N * 2, N * 2));
      DeviceBuffer ws(std::max<std::size_t>(16, engine().rms_norm_backward_workspace_size(d)));
      DeviceBuffer dx(bytes);
      NJ_CU(cuMemsetD8Async(dx.get(), 0xff, bytes, nullptr));
      engine().rms_norm_backward(d, big_out.ptr(), big_in.ptr(), w.ptr(), static_cast<const float*>(rstd.ptr()), dx.ptr(),
                                 dw.ptr(), ws.ptr(), ws.bytes(), nullptr);
      rms_backward_reference(dense, g.host.data(), x.host.data(), w.host.data(),
                             reinterpret_cast<const float*>(rstd.host.data()), &dx_ref, &dw_ref);
      big_out = std::move(dx);
      ref = &dx_ref;
    }
    NJ_CU(cuCtxSynchronize());
    std::vector<unsigned char> row(N * 2);
    std::vector<float> got;
    for (std::int64_t r = 0; r < M; ++r) {
      NJ_CU(cuMemcpyDtoH(row.data(), big_out.get() + r * ld * 2, N * 2));
      for (std::int64_t j = 0; j < N; ++j) got.push_back(load_as(DType::BF16, row.data(), j));
    }
    CHECK(relative_error(got, *ref) <= tolerance(DType::BF16));
    if (op == Op::Backward) {
      dw.download();
      CHECK(relative_error(dw.values(), dw_ref) <= tolerance(DType::BF16));
    }
  }
}
