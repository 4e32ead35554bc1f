// PyTorch custom operators over normjit's C ABI (libnormjit_torch.so).
//
// Why C++ operators: a norm call from Python then costs what a native ATen op
// costs -- the dispatcher, two or three caching-allocator allocations and the
// engine's plan lookup (plan.hpp) -- instead of ctypes marshalling and a
// descriptor built in Python (~50-90 us a call on a slow host). The ops have
// schemas, so torch.compile traces them (their fake implementations are in
// normjit/_ops.py) and CUDA graphs capture them (they allocate through
// PyTorch, never synchronise, never read device memory on the host).
//
//   normjit::norm_fwd(x, residual?, weight?, bias?, ...) -> (y, h, mean, rstd)
//   normjit::norm_bwd(dy, xin, weight?, bias?, mean, rstd, dh?, ...) -> (dx, dweight, dbias)
//
// norm_fwd has an autograd kernel here (NormFunction) whose backward calls
// norm_bwd; with torch.compile, AOTAutograd traces through both.
// RMSNorm: Zhang & Sennrich 2019. LayerNorm: Ba et al. 2016.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "normjit/normjit.h"

namespace {

// The process-wide engine of the Python package (normjit._engine_handle),
// handed over by normjit_torch_set_engine whenever the package creates one.
std::atomic<normjit_engine> g_engine{nullptr};

normjit_engine engine() {
  normjit_engine e = g_engine.load(std::memory_order_acquire);
  TORCH_CHECK(e, "normjit: the engine is not set (import normjit.torch, which sets it)");
  return e;
}

// The status leads the message so that normjit.torch can raise NormjitError
// with its kind.
void check(int status) {
  if (status != NORMJIT_SUCCESS) TORCH_CHECK(false, "normjit status ", status, ": ", normjit_last_error_message());
}

int32_t dtype_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return NORMJIT_FP32;
    case at::kHalf: return NORMJIT_FP16;
    case at::kBFloat16: return NORMJIT_BF16;
    default: TORCH_CHECK(false, name, ".dtype = ", t.scalar_type(), " is not supported: use float32, float16 or bfloat16");
  }
}

const void* ptr(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// How the kernels read a tensor's rows: the tensor itself (through its
// strides) or a contiguous copy. heads: -1 = tokens x heads found here, 1 =
// 2-D rows only, H = must read as tokens x H rows. Strides in elements; 0 =
// contiguous.
struct Rows {
  at::Tensor t;
  int64_t heads = 1, token_stride = 0, head_stride = 0;
};

Rows rows(const at::Tensor& t, int64_t k, int64_t N, int64_t heads) {
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t dim = t.dim();
  bool ok = true;
  int64_t expect = 1;
  for (int64_t i = dim - 1; i >= dim - k; --i) {
    if (sizes[i] != 1 && strides[i] != expect) ok = false;
    expect *= sizes[i];
  }
  if (ok) {
    // Leading dims as (size, stride), size-1 dims dropped, mergeable
    // neighbours merged: at most two are readable (tokens x heads).
    int64_t n = 0, sz[2] = {0, 0}, st[2] = {0, 0};
    for (int64_t i = 0; i < dim - k && ok; ++i) {
      if (sizes[i] == 1) continue;
      if (n && st[n - 1] == strides[i] * sizes[i]) {
        sz[n - 1] *= sizes[i];
        st[n - 1] = strides[i];
      } else if (n < 2) {
        sz[n] = sizes[i];
        st[n++] = strides[i];
      } else {
        ok = false;
      }
    }
    if (ok && n == 0) return {t, heads > 0 ? heads : 1, 0, 0};
    if (ok && n == 1 && st[0] >= N) {
      if (heads <= 1) return {t, 1, st[0], 0};
      return {t, heads, heads * st[0], st[0]};
    }
    if (ok && n == 2 && heads != 1 && (heads < 0 || heads == sz[1]) && st[1] >= N && st[0] >= sz[1] * st[1])
      return {t, sz[1], st[0], st[1]};
  }
  return {t.contiguous(), heads > 0 ? heads : 1, 0, 0};
}

// N = the product of normalized_shape, which must be x's trailing sizes.
int64_t normalized_size(const at::Tensor& x, c10::IntArrayRef shape) {
  const int64_t k = static_cast<int64_t>(shape.size());
  TORCH_CHECK(k >= 1 && k <= x.dim() && x.sizes().slice(x.dim() - k) == shape, "normalized_shape = ", shape,
              " does not match the trailing dimensions of x.shape = ", x.sizes());
  int64_t N = 1;
  for (int64_t s : shape) N *= s;
  return N;
}

// N = the product of the last n_dims sizes of x.
int64_t normalized_size(const at::Tensor& x, int64_t n_dims) {
  TORCH_CHECK(n_dims >= 1 && n_dims <= x.dim(), "normalized_shape has ", n_dims,
              " dimensions, but x.shape = ", x.sizes(), " has ", x.dim());
  int64_t N = 1;
  for (int64_t i = x.dim() - n_dims; i < x.dim(); ++i) N *= x.size(i);
  return N;
}

void check_param(const at::Tensor& p, const char* name, const at::Tensor& x, int64_t n_dims) {
  if (!p.defined()) return;
  TORCH_CHECK(p.device() == x.device(), name, " is on device '", p.device(), "' but x is on '", x.device(), "'");
  TORCH_CHECK(p.dim() == n_dims && p.sizes() == x.sizes().slice(x.dim() - n_dims), name, ".shape = ", p.sizes(),
              " must equal normalized_shape = ", x.sizes().slice(x.dim() - n_dims));
  dtype_of(p, name);
}

normjit_norm_desc base_desc(int64_t norm, int64_t M, int64_t N, double eps, double weight_offset, int64_t cast_mode) {
  normjit_norm_desc d;
  normjit_norm_desc_init(&d);
  d.norm = static_cast<int32_t>(norm);
  d.M = M;
  d.N = N;
  d.eps = static_cast<float>(eps);
  d.weight_offset = static_cast<float>(weight_offset);
  d.cast_mode = static_cast<int32_t>(cast_mode);
  return d;
}

// weight and bias share one dtype in the engine: bias follows weight's.
at::Tensor bias_as_weight(const c10::optional<at::Tensor>& bias, const at::Tensor& w) {
  if (!bias || !bias->defined()) return {};
  return (w.defined() ? bias->to(w.scalar_type()) : *bias).contiguous();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> norm_fwd_cuda(
    const at::Tensor& x, const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, int64_t norm, c10::IntArrayRef normalized_shape, double eps,
    double weight_offset, int64_t cast_mode, int64_t residual_rounding) {
  TORCH_CHECK(x.is_cuda(), "x is on device '", x.device(), "': normjit runs on CUDA tensors only");
  const int32_t xt = dtype_of(x, "x");
  const int64_t N = normalized_size(x, normalized_shape);
  const int64_t n_dims = static_cast<int64_t>(normalized_shape.size());
  const int64_t M = N ? x.numel() / N : 0;
  const at::Tensor w = weight && weight->defined() ? weight->contiguous() : at::Tensor();
  check_param(w, "weight", x, n_dims);
  if (bias) check_param(*bias, "bias", x, n_dims);
  const at::Tensor b = bias_as_weight(bias, w);
  const bool ln = norm == NORMJIT_NORM_LAYER, res = residual && residual->defined();
  TORCH_CHECK(weight_offset == 0.0 || w.defined(), "weight_offset = ", weight_offset,
              " needs a weight (w' = weight + weight_offset)");
  c10::cuda::CUDAGuard guard(x.device());

  normjit_norm_desc d = base_desc(norm, M, N, eps, weight_offset, cast_mode);
  d.x_dtype = d.y_dtype = xt;
  d.weight_dtype = w.defined() ? dtype_of(w, "weight") : (b.defined() ? dtype_of(b, "bias") : xt);
  d.has_weight = w.defined();
  d.has_bias = b.defined();
  d.store_rstd = 1;
  d.store_mean = ln;
  Rows xr, rr;
  at::Tensor h;
  if (res) {
    TORCH_CHECK(residual->device() == x.device(), "residual is on device '", residual->device(), "' but x is on '",
                x.device(), "'");
    TORCH_CHECK(residual->sizes() == x.sizes(), "residual.shape = ", residual->sizes(), " must equal x.shape = ",
                x.sizes());
    xr = rows(x, n_dims, N, 1);
    rr = rows(*residual, n_dims, N, 1);
    d.x_stride = xr.token_stride;
    d.residual = d.store_residual_out = 1;
    d.residual_stride = rr.token_stride;
    d.residual_dtype = d.residual_out_dtype = dtype_of(*residual, "residual");
    d.residual_rounding = static_cast<int32_t>(residual_rounding);
    h = at::empty(x.sizes(), residual->options());
  } else {
    xr = rows(x, n_dims, N, -1);
    d.heads = xr.heads;
    d.x_stride = xr.token_stride;
    d.x_head_stride = xr.head_stride;
    h = at::empty({0}, x.options());
  }
  at::Tensor y = at::empty(x.sizes(), x.options());
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor rstd = at::empty({M}, f32);
  at::Tensor mean = at::empty({ln ? M : 0}, f32);
  if (M > 0) {
    normjit_forward_tensors t;
    normjit_forward_tensors_init(&t);
    t.x = ptr(xr.t);
    t.residual = res ? ptr(rr.t) : nullptr;
    t.weight = ptr(w);
    t.bias = ptr(b);
    t.y = y.data_ptr();
    t.residual_out = res ? h.data_ptr() : nullptr;
    t.mean = ln ? mean.data_ptr() : nullptr;
    t.rstd = rstd.data_ptr();
    check(normjit_forward(engine(), &d, &t, c10::cuda::getCurrentCUDAStream(x.device().index()).stream()));
  }
  return {y, h, mean, rstd};
}

// xin: what the forward normalised: x (heads -1: its rows are read as the
// forward read them, through its strides) or h of a fused residual add
// (heads 0). dx has xin's dtype; dy is converted to y_dtype (a ScalarType).
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_bwd_cuda(
    const at::Tensor& dy_, const at::Tensor& xin, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& rstd,
    const c10::optional<at::Tensor>& dh, int64_t norm, int64_t n_dims, double weight_offset, int64_t cast_mode,
    int64_t heads, int64_t y_dtype) {
  const int64_t N = normalized_size(xin, n_dims);
  const int64_t M = N ? xin.numel() / N : 0;
  const bool ln = norm == NORMJIT_NORM_LAYER, res = heads == 0;
  const at::Tensor w = weight && weight->defined() ? weight->contiguous() : at::Tensor();
  const at::Tensor b = bias_as_weight(bias, w);
  c10::cuda::CUDAGuard guard(xin.device());
  const auto ydt = static_cast<at::ScalarType>(y_dtype);
  const at::Tensor dy = dy_.scalar_type() == ydt ? dy_ : dy_.to(ydt);
  at::Tensor dx = at::empty(xin.sizes(), xin.options());
  at::Tensor dweight = w.defined() ? at::empty_like(w) : at::empty({0}, xin.options());
  at::Tensor dbias = b.defined() ? at::empty_like(b) : at::empty({0}, xin.options());
  if (M == 0) {
    dweight.zero_();
    dbias.zero_();
    return {dx, dweight, dbias};
  }
  normjit_norm_desc d = base_desc(norm, M, N, 1e-6, weight_offset, cast_mode);
  d.y_dtype = dtype_of(dy, "dy");
  d.weight_dtype = w.defined() ? dtype_of(w, "weight") : (b.defined() ? dtype_of(b, "bias") : d.y_dtype);
  d.has_weight = w.defined();
  d.has_bias = b.defined();
  const Rows xr = rows(xin, n_dims, N, res ? 1 : heads);
  const Rows dyr = rows(dy, n_dims, N, xr.heads);
  Rows dhr;
  if (res) {
    // The backward reads h (its x) and writes dx = dL/dh in h's dtype.
    d.residual = d.store_residual_out = 1;
    d.x_dtype = d.residual_dtype = d.residual_out_dtype = dtype_of(xin, "h");
    d.residual_out_stride = xr.token_stride;
    if (dh && dh->defined()) {
      dhr = rows(dh->scalar_type() == xin.scalar_type() ? *dh : dh->to(xin.scalar_type()), n_dims, N, 1);
      d.has_dresidual = 1;
      d.dresidual_stride = dhr.token_stride;
    }
  } else {
    d.x_dtype = dtype_of(xin, "x");
    d.heads = xr.heads;
    d.x_stride = xr.token_stride;
    d.x_head_stride = xr.head_stride;
  }
  d.dy_stride = dyr.token_stride;
  d.dy_head_stride = dyr.head_stride;
  size_t bytes = 0;
  check(normjit_backward_workspace_size(engine(), &d, &bytes));
  at::Tensor ws = at::empty({static_cast<int64_t>(bytes)}, xin.options().dtype(at::kByte));
  normjit_backward_tensors t;
  normjit_backward_tensors_init(&t);
  t.dy = ptr(dyr.t);
  t.x = ptr(xr.t);
  t.weight = ptr(w);
  t.mean = ln ? ptr(mean) : nullptr;
  t.rstd = ptr(rstd);
  t.dresidual = ptr(dhr.t);
  t.dx = dx.data_ptr();
  t.dweight = w.defined() ? dweight.data_ptr() : nullptr;
  t.dbias = b.defined() ? dbias.data_ptr() : nullptr;
  t.workspace = bytes ? ws.data_ptr() : nullptr;
  t.workspace_bytes = bytes;
  check(normjit_backward(engine(), &d, &t, c10::cuda::getCurrentCUDAStream(xin.device().index()).stream()));
  return {dx, dweight, dbias};
}

// ---- autograd ---------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_fwd(
    const at::Tensor& x, const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, int64_t norm, c10::IntArrayRef normalized_shape, double eps,
    double weight_offset, int64_t cast_mode, int64_t residual_rounding) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("normjit::norm_fwd", "").typed<decltype(norm_fwd_cuda)>();
  return op.call(x, residual, weight, bias, norm, normalized_shape, eps, weight_offset, cast_mode, residual_rounding);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> call_bwd(
    const at::Tensor& dy, const at::Tensor& xin, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& rstd,
    const c10::optional<at::Tensor>& dh, int64_t norm, int64_t n_dims, double weight_offset, int64_t cast_mode,
    int64_t heads, int64_t y_dtype) {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("normjit::norm_bwd", "").typed<decltype(norm_bwd_cuda)>();
  return op.call(dy, xin, weight, bias, mean, rstd, dh, norm, n_dims, weight_offset, cast_mode, heads, y_dtype);
}

c10::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

// Forward inputs: x, residual, weight, bias (tensors, undefined when absent).
struct NormFunction : public torch::autograd::Function<NormFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const c10::optional<at::Tensor>& residual_,
                                                const c10::optional<at::Tensor>& weight_,
                                                const c10::optional<at::Tensor>& bias_, int64_t norm,
                                                c10::IntArrayRef normalized_shape, double eps, double weight_offset,
                                                int64_t cast_mode, int64_t residual_rounding) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, h, mean, rstd] =
        call_fwd(x, residual_, weight_, bias_, norm, normalized_shape, eps, weight_offset, cast_mode, residual_rounding);
    // Absent optionals are no autograd inputs (their gradient slots stay empty).
    const at::Tensor residual = residual_.value_or(at::Tensor()), weight = weight_.value_or(at::Tensor()),
                     bias = bias_.value_or(at::Tensor());
    const int64_t n_dims = static_cast<int64_t>(normalized_shape.size());
    const bool res = residual.defined();
    // The backward reads the normalised input: x (through its strides) or h.
    ctx->save_for_backward({res ? h : x, weight, bias, mean, rstd});
    // Two saved entries (each is a string-keyed map insert): the small ints
    // packed into one, and the offset.
    const int64_t heads = res ? 0 : 1;  // 0: xin is h; 1: x, its rows read as the forward read them
    const int64_t r_dtype = static_cast<int64_t>(res ? residual.scalar_type() : x.scalar_type());
    ctx->saved_data["p"] = norm | (n_dims << 4) | (cast_mode << 12) | (heads << 16) |
                           (static_cast<int64_t>(x.scalar_type()) << 20) | (r_dtype << 28);
    ctx->saved_data["w"] = weight_offset;
    ctx->mark_non_differentiable({mean, rstd});
    ctx->set_materialize_grads(false);
    return {y, h, mean, rstd};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &xin = saved[0], &weight = saved[1], &bias = saved[2], &mean = saved[3], &rstd = saved[4];
    at::Tensor dy = grads[0], dh = grads[1];
    const int64_t p = ctx->saved_data["p"].toInt();
    const int64_t norm = p & 15, n_dims = (p >> 4) & 255, cast_mode = (p >> 12) & 15, heads = (p >> 16) & 15 ? -1 : 0;
    const auto x_dtype = static_cast<at::ScalarType>((p >> 20) & 255);
    const auto r_dtype = static_cast<at::ScalarType>((p >> 28) & 255);
    const auto y_dtype = x_dtype;  // y has x's dtype
    if (!dy.defined()) dy = at::zeros(xin.sizes(), xin.options().dtype(y_dtype));
    auto [dx, dweight, dbias] = call_bwd(dy, xin, opt(weight), opt(bias), mean, rstd, heads == 0 ? opt(dh) : c10::nullopt,
                                         norm, n_dims, ctx->saved_data["w"].toDouble(), cast_mode, heads,
                                         static_cast<int64_t>(y_dtype));
    const bool res = heads == 0;
    // needs_input_grad counts only the inputs that are tensors: x, then
    // residual, weight and bias where present.
    int64_t edge = 1;
    const int64_t e_res = res ? edge++ : -1;
    const int64_t e_w = weight.defined() ? edge++ : -1;
    const int64_t e_b = bias.defined() ? edge++ : -1;
    at::Tensor gx = ctx->needs_input_grad(0) ? dx.to(x_dtype) : at::Tensor();
    at::Tensor gr = e_res >= 0 && ctx->needs_input_grad(e_res) ? dx.to(r_dtype) : at::Tensor();
    at::Tensor gw = e_w >= 0 && ctx->needs_input_grad(e_w) ? dweight.to(weight.scalar_type()) : at::Tensor();
    at::Tensor gb = e_b >= 0 && ctx->needs_input_grad(e_b) ? dbias.to(bias.scalar_type()) : at::Tensor();
    return {gx, gr, gw, gb, {}, {}, {}, {}, {}, {}};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> norm_fwd_autograd(
    const at::Tensor& x, const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, int64_t norm, c10::IntArrayRef normalized_shape, double eps,
    double weight_offset, int64_t cast_mode, int64_t residual_rounding) {
  auto needs = [](const c10::optional<at::Tensor>& t) { return t && t->defined() && t->requires_grad(); };
  if (!at::GradMode::is_enabled() || !(x.requires_grad() || needs(residual) || needs(weight) || needs(bias))) {
    // Nothing to differentiate: no graph node, no saved tensors (inference).
    at::AutoDispatchBelowADInplaceOrView below;
    return call_fwd(x, residual, weight, bias, norm, normalized_shape, eps, weight_offset, cast_mode,
                    residual_rounding);
  }
  auto out = NormFunction::apply(x, residual, weight, bias, norm, normalized_shape, eps, weight_offset, cast_mode,
                                 residual_rounding);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void normjit_torch_set_engine(void* handle) {
  g_engine.store(static_cast<normjit_engine>(handle), std::memory_order_release);
}

TORCH_LIBRARY(normjit, m) {
  m.def(
      "norm_fwd(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, int norm, int[] normalized_shape, float eps, "
      "float weight_offset, int cast_mode, int residual_rounding) -> (Tensor y, Tensor h, Tensor mean, Tensor rstd)");
  m.def(
      "norm_bwd(Tensor dy, Tensor xin, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd, Tensor? dh, int norm, "
      "int n_dims, float weight_offset, int cast_mode, int heads, int y_dtype) -> (Tensor dx, Tensor dweight, "
      "Tensor dbias)");
}

TORCH_LIBRARY_IMPL(normjit, CUDA, m) {
  m.impl("norm_fwd", &norm_fwd_cuda);
  m.impl("norm_bwd", &norm_bwd_cuda);
}

TORCH_LIBRARY_IMPL(normjit, Autograd, m) { m.impl("norm_fwd", &norm_fwd_autograd); }

// CPU tensors reach the CUDA kernel's first check, which names the device.
TORCH_LIBRARY_IMPL(normjit, CPU, m) { m.impl("norm_fwd", &norm_fwd_cuda); }
