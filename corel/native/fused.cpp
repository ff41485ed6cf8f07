// corel's fused autograd nodes in C++: the FFNN's layers (LeakyMLP) and Gaussian-COREL's
// similarity and loss (GaussianAR). Each makes the same ATen calls, in the same order, as
// its Python twin in corel/fused.py (and so as autograd on the plain modules): the values
// and gradients are bit for bit the same. What it saves is the per-operation Python of a
// step (the Function's apply, each call's argument parsing), which at the paper's sizes
// costs more than the arithmetic of these nodes. Built by `python -m corel.native build`.
#include <torch/extension.h>

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// x times lam (negated for the attractive term): a float as Python's scalar product, a
// tensor (a stack's (M, 1) lambdas, maybe float64) as the tensor product.
Tensor scaled(const Tensor& x, const Tensor& weight, double value, bool negate) {
  if (weight.defined()) return x.mul(negate ? weight.neg() : weight);
  return x.mul(negate ? -value : value);
}

Tensor or_undefined(const std::optional<Tensor>& t) { return t.has_value() ? *t : Tensor(); }

struct GaussianARFn : public torch::autograd::Function<GaussianARFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& h, const Tensor& W, const Tensor& gamma,
                               const Tensor& labels, double lam, double one_minus_lam,
                               const std::optional<Tensor>& lam_t, const std::optional<Tensor>& one_minus_lam_t) {
    Tensor lam_w = or_undefined(lam_t), repulse_w = or_undefined(one_minus_lam_t);
    Tensor dist = at::cdist(h, W, 2.0, /*compute_mode=donot_use_mm_for_euclid_dist*/ 2);
    Tensor squared = dist.square();
    Tensor neg_gamma = gamma.neg();
    Tensor sim = neg_gamma.mul(squared);
    Tensor index = labels.expand(sim.sizes().slice(0, sim.dim() - 1)).unsqueeze(-1);
    Tensor lse = at::logsumexp(sim, {-1});
    Tensor attract = scaled(sim.gather(-1, index).squeeze(-1), lam_w, lam, true);
    Tensor loss = attract.add(scaled(lse, repulse_w, one_minus_lam, false)).mean({-1});
    ctx->save_for_backward({h, W, dist, squared, neg_gamma, sim, lse, index});
    ctx->saved_data["lam"] = lam;
    ctx->saved_data["one_minus_lam"] = one_minus_lam;
    ctx->saved_data["lam_t"] = lam_w;
    ctx->saved_data["one_minus_lam_t"] = repulse_w;
    ctx->set_materialize_grads(false);
    return {loss, sim};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const Tensor &h = saved[0], &W = saved[1], &dist = saved[2], &squared = saved[3];
    const Tensor &neg_gamma = saved[4], &sim = saved[5], &lse = saved[6], &index = saved[7];
    const Tensor& grad_loss = grads[0];
    Tensor grad = grads[1];
    if (grad_loss.defined()) {
      // The mean's, the weighted sum's, then logsumexp's and the gather's backward; a
      // stack's float64 lambdas rounded to sim's dtype as autograd rounds them.
      Tensor rows = grad_loss.unsqueeze(-1).expand(sim.sizes().slice(0, sim.dim() - 1)).div(c10::Scalar(sim.size(-2)));
      Tensor attract = scaled(rows, ctx->saved_data["lam_t"].toTensor(), ctx->saved_data["lam"].toDouble(), true)
                           .to(sim.scalar_type());
      Tensor repulse = scaled(rows, ctx->saved_data["one_minus_lam_t"].toTensor(),
                              ctx->saved_data["one_minus_lam"].toDouble(), false)
                           .to(sim.scalar_type());
      Tensor from_lse = repulse.unsqueeze(-1).mul(sim.sub(lse.unsqueeze(-1)).exp());
      Tensor from_loss = from_lse.scatter_add_(-1, index, attract.unsqueeze(-1));
      grad = grad.defined() ? grad.add(from_loss) : from_loss;
    }
    variable_list out(8);  // h, W, gamma, labels, lam, 1 - lam, and their tensor forms
    if (!grad.defined()) return out;
    if (ctx->needs_input_grad(2)) out[2] = grad.mul(squared).sum_to_size(neg_gamma.sizes()).neg();
    // The gamma product's, then square's (2 dist), then cdist's backward.
    Tensor grad_dist = grad.mul(neg_gamma).mul(dist.mul(2.0));
    if (ctx->needs_input_grad(0)) out[0] = at::_cdist_backward(grad_dist.contiguous(), h, W, 2.0, dist);
    if (ctx->needs_input_grad(1))
      out[1] = at::_cdist_backward(grad_dist.mT().contiguous(), W, h, 2.0, dist.mT().contiguous());
    return out;
  }
};

struct LeakyMLPFn : public torch::autograd::Function<LeakyMLPFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, double slope, at::TensorList params) {
    std::vector<Tensor> saved{x};
    Tensor a = x;
    for (size_t i = 0; i + 1 < params.size(); i += 2) {
      // In place on addmm's fresh result, as LeakyReLU(inplace=True) would.
      Tensor z = at::addmm(params[i + 1], a, params[i].t());
      a = at::leaky_relu_(z, slope);
      saved.push_back(a);
    }
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["slope"] = slope;
    return {a};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const size_t layers = (saved.size() - 1) / 3;
    const double slope = ctx->saved_data["slope"].toDouble();
    // x, slope, then the parameters; needs_input_grad counts tensors only: x is 0,
    // parameter k is 1 + k.
    variable_list out(2 + 2 * layers);
    Tensor grad = grads[0];
    for (size_t i = layers; i-- > 0;) {
      grad = at::leaky_relu_backward(grad, saved[i + 1], slope, true);
      if (ctx->needs_input_grad(1 + 2 * i)) out[2 + 2 * i] = grad.t().mm(saved[i]);
      if (ctx->needs_input_grad(2 + 2 * i)) out[3 + 2 * i] = grad.sum({0});
      if (i > 0 || ctx->needs_input_grad(0)) grad = grad.mm(saved[layers + 1 + 2 * i]);
    }
    if (ctx->needs_input_grad(0)) out[0] = grad;
    return out;
  }
};

std::vector<Tensor> gaussian_ar(const Tensor& h, const Tensor& W, const Tensor& gamma, const Tensor& labels,
                                double lam, double one_minus_lam, const std::optional<Tensor>& lam_t,
                                const std::optional<Tensor>& one_minus_lam_t) {
  return GaussianARFn::apply(h, W, gamma, labels, lam, one_minus_lam, lam_t, one_minus_lam_t);
}

Tensor leaky_mlp(const Tensor& x, double slope, std::vector<Tensor> params) {
  return LeakyMLPFn::apply(x, slope, at::TensorList(params))[0];
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gaussian_ar", &gaussian_ar, "(loss, sim) of Gaussian-COREL as one node (corel.fused.GaussianAR)");
  m.def("leaky_mlp", &leaky_mlp, "the FFNN's layers as one node (corel.fused.LeakyMLP)");
}
