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
//   normjit::norm_fwd_fp8(x, residual?, weight?, bias?, scale?, ...) -> (q, scale, amax, y, q_t, h, mean, rstd)
//   normjit::norm_fwd_fp8_input(x_grad_proxy, x_q, x_scale, weight?, bias?, ...) -> (y, scale, q_t, mean, rstd)
//   normjit::norm_bwd_fp8_input(dy, x_q, x_scale, weight?, bias?, mean, rstd, ...) -> (dx, dweight, dbias)
//
// norm_fwd has an autograd kernel here (NormFunction) whose backward calls
// norm_bwd; with torch.compile, AOTAutograd traces through both. The FP8-input
// norm's autograd formula is registered from Python (_ops.py); the quantized
// outputs are not differentiable.
// RMSNorm: Zhang & Sennrich 2019. LayerNorm: Ba et al. 2016.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <string>
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

int32_t dtype_code(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat: return NORMJIT_FP32;
    case at::kHalf: return NORMJIT_FP16;
    case at::kBFloat16: return NORMJIT_BF16;
    default: TORCH_CHECK(false, name, " = ", t, " is not supported: use float32, float16 or bfloat16");
  }
}

int32_t dtype_of(const at::Tensor& t, const char* name) {
  return dtype_code(t.scalar_type(), (std::string(name) + ".dtype").c_str());
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

// A forward's row shape and parameters, checked: N and M of x's rows, weight
// and bias (bias in weight's dtype) contiguous.
struct Params {
  int64_t N, n_dims, M;
  at::Tensor w, b;
};

Params params_of(const at::Tensor& x, c10::IntArrayRef normalized_shape, const c10::optional<at::Tensor>& weight,
                 const c10::optional<at::Tensor>& bias, double weight_offset) {
  Params p;
  p.N = normalized_size(x, normalized_shape);
  p.n_dims = static_cast<int64_t>(normalized_shape.size());
  p.M = p.N ? x.numel() / p.N : 0;
  p.w = weight && weight->defined() ? weight->contiguous() : at::Tensor();
  check_param(p.w, "weight", x, p.n_dims);
  if (bias) check_param(*bias, "bias", x, p.n_dims);
  p.b = bias_as_weight(bias, p.w);
  TORCH_CHECK(weight_offset == 0.0 || p.w.defined(), "weight_offset = ", weight_offset,
              " needs a weight (w' = weight + weight_offset)");
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> norm_fwd_cuda(
    const at::Tensor& x, const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, int64_t norm, c10::IntArrayRef normalized_shape, double eps,
    double weight_offset, int64_t cast_mode, int64_t residual_rounding) {
  TORCH_CHECK(x.is_cuda(), "x is on device '", x.device(), "': normjit runs on CUDA tensors only");
  const int32_t xt = dtype_of(x, "x");
  const Params p = params_of(x, normalized_shape, weight, bias, weight_offset);
  const int64_t N = p.N, n_dims = p.n_dims, M = p.M;
  const at::Tensor &w = p.w, &b = p.b;
  const bool ln = norm == NORMJIT_NORM_LAYER, res = residual && residual->defined();
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

// ---- FP8 ----------------------------------------------------------------------
//
// Quantized outputs (normjit.hpp, QuantScaling: scales dequantize, y ~= q *
// scale) and norms of an FP8 x with 1 x QB group scales. Outputs a call does
// not produce are empty ([0]) tensors: schemas have no optional outputs.

int32_t fp8_code(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat8_e4m3fn: return NORMJIT_E4M3;
    case at::kFloat8_e5m2: return NORMJIT_E5M2;
    default: TORCH_CHECK(false, name, " = ", t, " is not an FP8 dtype (torch.float8_e4m3fn or torch.float8_e5m2)");
  }
}

at::Tensor none_like(const at::Tensor& x) { return at::empty({0}, x.options()); }

// The leading sizes of x (its rows' shape) followed by `last`.
std::vector<int64_t> rows_shape(const at::Tensor& x, int64_t n_dims, int64_t last) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end() - n_dims);
  s.push_back(last);
  return s;
}

struct QuantOut {
  at::Tensor q, scale, amax, y, q_t;
};

// Sets the quantized-output fields of d and allocates what the kernel writes.
// scale_in: the caller's scale of TENSOR_STATIC (else undefined).
QuantOut quant_outputs(normjit_norm_desc& d, const at::Tensor& x, int64_t n_dims, int64_t quant,
                       at::ScalarType fp8_dtype, int64_t group_size, bool ue8m0, bool col_major, double scale_ub,
                       double scale_min, bool return_y, bool transpose, at::ScalarType out_dtype) {
  TORCH_CHECK(quant >= NORMJIT_QUANT_TENSOR_STATIC && quant <= NORMJIT_QUANT_MX, "quant = ", quant,
              " is not a quantized output (1 tensor-static, 2 tensor, 3 token, 4 group, 5 mx32)");
  d.quant = static_cast<int32_t>(quant);
  d.y_dtype = fp8_code(fp8_dtype, "fp8_dtype");
  d.quant_group = static_cast<int32_t>(group_size);
  d.scale_ue8m0 = ue8m0;
  d.scale_col_major = col_major;
  d.scale_ub = static_cast<float>(scale_ub);
  d.scale_min = static_cast<float>(scale_min);
  d.store_y_hp = return_y;
  d.store_y_t = transpose;
  d.y_hp_dtype = d.grad_dtype = dtype_code(out_dtype, "out_dtype");
  const int64_t M = d.M, N = d.N;
  const auto f32 = x.options().dtype(at::kFloat);
  QuantOut o;
  o.q = at::empty(x.sizes(), x.options().dtype(fp8_dtype));
  o.amax = quant == NORMJIT_QUANT_TENSOR ? at::empty({1}, f32) : at::empty({0}, f32);
  switch (quant) {
    case NORMJIT_QUANT_TENSOR_STATIC: o.scale = at::empty({0}, f32); break;
    case NORMJIT_QUANT_TENSOR: o.scale = at::empty({1}, f32); break;
    case NORMJIT_QUANT_TOKEN: o.scale = at::empty(rows_shape(x, n_dims, 1), f32); break;
    case NORMJIT_QUANT_MX:
      TORCH_CHECK(N % 32 == 0, "quant = mx32 needs N a multiple of 32, but N = ", N);
      o.scale = at::empty(rows_shape(x, n_dims, N / 32), x.options().dtype(at::kByte));
      break;
    default:
      TORCH_CHECK(group_size > 0 && N % group_size == 0, "group_size = ", group_size, " does not divide N = ", N);
      // Column-major: a [N / G, M] buffer seen as [M, N / G] (DeepGEMM's layout).
      o.scale = col_major ? at::empty({N / group_size, M}, f32).t() : at::empty(rows_shape(x, n_dims, N / group_size), f32);
  }
  o.y = return_y ? at::empty(x.sizes(), x.options().dtype(out_dtype)) : none_like(x);
  o.q_t = transpose ? at::empty({N, M}, x.options().dtype(fp8_dtype)) : none_like(x);
  return o;
}

void forward_call(const normjit_norm_desc& d, normjit_forward_tensors& t, const at::Tensor& x) {
  if (d.M > 0) check(normjit_forward(engine(), &d, &t, c10::cuda::getCurrentCUDAStream(x.device().index()).stream()));
}

using Fp8Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                              at::Tensor>;

// store_amax: a static scale's call also writes amax (delayed scaling);
// return_stats: mean (LayerNorm) and rstd too, for a backward.
Fp8Outputs norm_fwd_fp8_cuda(
    const at::Tensor& x_, const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& scale, int64_t norm,
    c10::IntArrayRef normalized_shape, double eps, double weight_offset, int64_t cast_mode, int64_t residual_rounding,
    int64_t quant, at::ScalarType fp8_dtype, int64_t group_size, bool scale_ue8m0, bool scale_col_major,
    double scale_ub, double scale_min, bool return_y, bool transpose, bool store_amax, bool return_stats) {
  TORCH_CHECK(x_.is_cuda(), "x is on device '", x_.device(), "': normjit runs on CUDA tensors only");
  const int32_t xt = dtype_of(x_, "x");
  const Params p = params_of(x_, normalized_shape, weight, bias, weight_offset);
  const int64_t N = p.N, n_dims = p.n_dims, M = p.M;
  const at::Tensor &w = p.w, &b = p.b;
  c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous();
  normjit_norm_desc d = base_desc(norm, M, N, eps, weight_offset, cast_mode);
  d.x_dtype = xt;
  d.weight_dtype = w.defined() ? dtype_of(w, "weight") : (b.defined() ? dtype_of(b, "bias") : NORMJIT_BF16);
  d.has_weight = w.defined();
  d.has_bias = b.defined();
  d.store_rstd = return_stats;
  d.store_mean = return_stats && norm == NORMJIT_NORM_LAYER;
  const bool res = residual && residual->defined();
  at::Tensor r, h = none_like(x);
  if (res) {
    TORCH_CHECK(residual->device() == x.device(), "residual is on device '", residual->device(), "' but x is on '",
                x.device(), "'");
    TORCH_CHECK(residual->sizes() == x.sizes(), "residual.shape = ", residual->sizes(), " must equal x.shape = ",
                x.sizes());
    r = residual->contiguous();
    d.residual = d.store_residual_out = 1;
    d.residual_dtype = d.residual_out_dtype = dtype_of(r, "residual");
    d.residual_rounding = static_cast<int32_t>(residual_rounding);
    h = at::empty(x.sizes(), r.options());
  }
  QuantOut o = quant_outputs(d, x, n_dims, quant, fp8_dtype, group_size, scale_ue8m0, scale_col_major, scale_ub,
                             scale_min, return_y, transpose, x.scalar_type());
  at::Tensor sc = o.scale;
  const auto f32 = x.options().dtype(at::kFloat);
  if (store_amax) {
    TORCH_CHECK(quant == NORMJIT_QUANT_TENSOR_STATIC, "store_amax = True is for quant = tensor-static, but quant = ",
                quant);
    d.store_amax = 1;
    o.amax = at::empty({1}, f32);
  }
  at::Tensor rstd = at::empty({return_stats ? M : 0}, f32), mean = at::empty({d.store_mean ? M : 0}, f32);
  if (quant == NORMJIT_QUANT_TENSOR_STATIC) {
    TORCH_CHECK(scale && scale->defined() && scale->numel() == 1,
                "quant = tensor-static needs scale: a one-element float32 tensor on x's device");
    TORCH_CHECK(scale->device() == x.device(), "scale is on device '", scale->device(), "' but x is on '",
                x.device(), "'");
    sc = scale->to(at::kFloat).reshape({1}).contiguous();
  }
  normjit_forward_tensors t;
  normjit_forward_tensors_init(&t);
  t.x = ptr(x);
  t.residual = res ? ptr(r) : nullptr;
  t.weight = ptr(w);
  t.bias = ptr(b);
  t.y = o.q.data_ptr();
  t.residual_out = res ? h.data_ptr() : nullptr;
  t.y_scale = sc.data_ptr();
  t.amax = o.amax.numel() ? o.amax.data_ptr() : nullptr;
  t.y_hp = return_y ? o.y.data_ptr() : nullptr;
  t.y_t = transpose ? o.q_t.data_ptr() : nullptr;
  t.rstd = return_stats ? rstd.data_ptr() : nullptr;
  t.mean = d.store_mean ? mean.data_ptr() : nullptr;
  forward_call(d, t, x);
  return {o.q, o.scale, o.amax, o.y, o.q_t, h, mean, rstd};
}

// A norm of an FP8 x with group scales: x = x_q * x_scale[i, j / QB]. y in
// out_dtype (quant 0) or quantized (quant TENSOR: q, its [1] scale and q
// transposed). x_grad_proxy is not read: it only gives autograd an input of
// the gradient's dtype to deliver dL/dx to.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> norm_fwd_fp8_input_cuda(
    const at::Tensor& x_grad_proxy, const at::Tensor& x_q_, const at::Tensor& x_scale_,
    const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias, int64_t norm,
    c10::IntArrayRef normalized_shape, double eps, at::ScalarType out_dtype, int64_t quant,
    at::ScalarType fp8_dtype) {
  TORCH_CHECK(x_q_.is_cuda(), "x_q is on device '", x_q_.device(), "': normjit runs on CUDA tensors only");
  const int32_t xt = fp8_code(x_q_.scalar_type(), "x_q.dtype");
  const Params p = params_of(x_q_, normalized_shape, weight, bias, 0.0);
  const int64_t N = p.N, n_dims = p.n_dims, M = p.M;
  const at::Tensor &w = p.w, &b = p.b;
  TORCH_CHECK(x_scale_.device() == x_q_.device(), "x_scale is on device '", x_scale_.device(), "' but x_q is on '",
              x_q_.device(), "'");
  TORCH_CHECK(x_scale_.numel() > 0 && (M * N) % x_scale_.numel() == 0, "x_scale has ", x_scale_.numel(),
              " elements, not M x N / QB for x_q of ", M, " x ", N);
  c10::cuda::CUDAGuard guard(x_q_.device());
  const at::Tensor x_q = x_q_.contiguous(), x_scale = x_scale_.to(at::kFloat).contiguous();
  normjit_norm_desc d = base_desc(norm, M, N, eps, 0.0, NORMJIT_CAST_DEFAULT);
  d.x_dtype = xt;
  d.x_group = static_cast<int32_t>((M * N) / x_scale.numel());
  d.weight_dtype = w.defined() ? dtype_of(w, "weight") : (b.defined() ? dtype_of(b, "bias") : NORMJIT_BF16);
  d.has_weight = w.defined();
  d.has_bias = b.defined();
  d.store_rstd = 1;
  d.store_mean = norm == NORMJIT_NORM_LAYER;
  const auto f32 = x_q.options().dtype(at::kFloat);
  at::Tensor rstd = at::empty({M}, f32), mean = at::empty({d.store_mean ? M : 0}, f32);
  normjit_forward_tensors t;
  normjit_forward_tensors_init(&t);
  at::Tensor y, scale, q_t;
  if (quant == NORMJIT_QUANT_NONE) {
    d.y_dtype = d.y_hp_dtype = d.grad_dtype = dtype_code(out_dtype, "out_dtype");
    y = at::empty(x_q.sizes(), x_q.options().dtype(out_dtype));
    scale = at::empty({0}, f32);
    q_t = none_like(x_q);
  } else {
    TORCH_CHECK(quant == NORMJIT_QUANT_TENSOR, "quant = ", quant, " is not offered with an FP8 x: 0 (none) or 2 (tensor)");
    QuantOut o = quant_outputs(d, x_q, n_dims, quant, fp8_dtype, 128, false, false, 0.0, 0.0, false, true, out_dtype);
    y = o.q;
    scale = o.scale;
    q_t = o.q_t;
    t.amax = o.amax.data_ptr();
    t.y_scale = scale.data_ptr();
    t.y_t = q_t.data_ptr();
  }
  t.x = ptr(x_q);
  t.x_scale = ptr(x_scale);
  t.weight = ptr(w);
  t.bias = ptr(b);
  t.y = y.data_ptr();
  t.rstd = rstd.data_ptr();
  t.mean = d.store_mean ? mean.data_ptr() : nullptr;
  forward_call(d, t, x_q);
  return {y, scale, q_t, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_bwd_fp8_input_cuda(
    const at::Tensor& dy_, const at::Tensor& x_q, const at::Tensor& x_scale, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& rstd, int64_t norm,
    int64_t n_dims, at::ScalarType out_dtype) {
  const int64_t N = normalized_size(x_q, n_dims);
  const int64_t M = N ? x_q.numel() / N : 0;
  const at::Tensor w = weight && weight->defined() ? weight->contiguous() : at::Tensor();
  const at::Tensor b = bias_as_weight(bias, w);
  c10::cuda::CUDAGuard guard(x_q.device());
  const at::Tensor dy = dy_.to(out_dtype).contiguous();
  at::Tensor dx = at::empty(x_q.sizes(), x_q.options().dtype(out_dtype));
  at::Tensor dweight = w.defined() ? at::empty_like(w) : none_like(dx);
  at::Tensor dbias = b.defined() ? at::empty_like(b) : none_like(dx);
  if (M == 0) {
    dweight.zero_();
    dbias.zero_();
    return {dx, dweight, dbias};
  }
  normjit_norm_desc d = base_desc(norm, M, N, 1e-6, 0.0, NORMJIT_CAST_DEFAULT);
  d.x_dtype = fp8_code(x_q.scalar_type(), "x_q.dtype");
  d.x_group = static_cast<int32_t>((M * N) / x_scale.numel());
  d.y_dtype = d.grad_dtype = dtype_of(dy, "dy");
  d.weight_dtype = w.defined() ? dtype_of(w, "weight") : (b.defined() ? dtype_of(b, "bias") : d.y_dtype);
  d.has_weight = w.defined();
  d.has_bias = b.defined();
  size_t bytes = 0;
  check(normjit_backward_workspace_size(engine(), &d, &bytes));
  at::Tensor ws = at::empty({static_cast<int64_t>(bytes)}, x_q.options().dtype(at::kByte));
  normjit_backward_tensors t;
  normjit_backward_tensors_init(&t);
  t.dy = ptr(dy);
  t.x = ptr(x_q);
  t.x_scale = x_scale.data_ptr();
  t.weight = ptr(w);
  t.mean = norm == NORMJIT_NORM_LAYER ? ptr(mean) : nullptr;
  t.rstd = ptr(rstd);
  t.dx = dx.data_ptr();
  t.dweight = w.defined() ? dweight.data_ptr() : nullptr;
  t.dbias = b.defined() ? dbias.data_ptr() : nullptr;
  t.workspace = bytes ? ws.data_ptr() : nullptr;
  t.workspace_bytes = bytes;
  check(normjit_backward(engine(), &d, &t, c10::cuda::getCurrentCUDAStream(x_q.device().index()).stream()));
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
  m.def(
      "norm_fwd_fp8(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, Tensor? scale, int norm, "
      "int[] normalized_shape, float eps, float weight_offset, int cast_mode, int residual_rounding, int quant, "
      "ScalarType fp8_dtype, int group_size, bool scale_ue8m0, bool scale_col_major, float scale_ub, "
      "float scale_min, bool return_y, bool transpose, bool store_amax, bool return_stats) -> (Tensor q, "
      "Tensor scale, Tensor amax, Tensor y, Tensor q_t, Tensor h, Tensor mean, Tensor rstd)");
  m.def(
      "norm_fwd_fp8_input(Tensor x_grad_proxy, Tensor x_q, Tensor x_scale, Tensor? weight, Tensor? bias, int norm, "
      "int[] normalized_shape, float eps, ScalarType out_dtype, int quant, ScalarType fp8_dtype) -> (Tensor y, "
      "Tensor scale, Tensor q_t, Tensor mean, Tensor rstd)");
  m.def(
      "norm_bwd_fp8_input(Tensor dy, Tensor x_q, Tensor x_scale, Tensor? weight, Tensor? bias, Tensor mean, "
      "Tensor rstd, int norm, int n_dims, ScalarType out_dtype) -> (Tensor dx, Tensor dweight, Tensor dbias)");
}

TORCH_LIBRARY_IMPL(normjit, CUDA, m) {
  m.impl("norm_fwd", &norm_fwd_cuda);
  m.impl("norm_bwd", &norm_bwd_cuda);
  m.impl("norm_fwd_fp8", &norm_fwd_fp8_cuda);
  m.impl("norm_fwd_fp8_input", &norm_fwd_fp8_input_cuda);
  m.impl("norm_bwd_fp8_input", &norm_bwd_fp8_input_cuda);
}

TORCH_LIBRARY_IMPL(normjit, Autograd, m) { m.impl("norm_fwd", &norm_fwd_autograd); }

// CPU tensors reach the CUDA kernel's first check, which names the device.
TORCH_LIBRARY_IMPL(normjit, CPU, m) {
  m.impl("norm_fwd", &norm_fwd_cuda);
  m.impl("norm_fwd_fp8", &norm_fwd_fp8_cuda);
  m.impl("norm_fwd_fp8_input", &norm_fwd_fp8_input_cuda);
}
