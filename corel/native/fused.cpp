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

// base - a @ b: addmm for a pair, one baddbmm for a stack; as corel.fused's _minus_product.
Tensor minus_product(const Tensor& base, const Tensor& a, const Tensor& b) {
  if (base.dim() == 2) return at::addmm(base, a, b, /*beta=*/1, /*alpha=*/-1);
  return at::baddbmm(base, a, b, /*beta=*/1, /*alpha=*/-1);
}

// The gradients of sum(grad * |h_i - w_k|^2) for h and W (each where asked for), as matrix
// products about the class vectors' mean: corel.fused.squared_distance_backward's calls.
std::vector<Tensor> squared_distance_backward(const Tensor& grad, const Tensor& h, const Tensor& W, bool need_h,
                                              bool need_w) {
  std::vector<Tensor> out(2);
  Tensor twice = grad.mul(2.0);
  Tensor centre = W.mean({-2}, /*keepdim=*/true);
  Tensor h_c = h.sub(centre), w_c = W.sub(centre);
  if (need_h) out[0] = minus_product(h_c.mul(twice.sum({-1}, /*keepdim=*/true)), twice, w_c);
  // W's as its transpose, (H x N) @ (N x K), the form MKL (AVX2) rounds in a batch as alone.
  if (need_w) out[1] = minus_product(w_c.mul(twice.sum({-2}).unsqueeze(-1)).mT(), h_c.mT(), twice).mT().contiguous();
  return out;
}

// Gaussian-COREL's forward: (loss, sim), keeping in `saved` what the backward needs
// (h, W, squared, -gamma, sim, lse, index).
std::vector<Tensor> gaussian_forward(const Tensor& h, const Tensor& W, const Tensor& gamma, const Tensor& labels,
                                     double lam, double one_minus_lam, const Tensor& lam_w, const Tensor& repulse_w,
                                     std::vector<Tensor>& saved) {
  Tensor squared = at::cdist(h, W, 2.0, /*compute_mode=donot_use_mm_for_euclid_dist*/ 2).square();
  Tensor neg_gamma = gamma.neg();
  Tensor sim = neg_gamma.mul(squared);
  Tensor index = labels.expand(sim.sizes().slice(0, sim.dim() - 1)).unsqueeze(-1);
  Tensor lse = at::logsumexp(sim, {-1});
  Tensor attract = scaled(sim.gather(-1, index).squeeze(-1), lam_w, lam, true);
  Tensor loss = attract.add(scaled(lse, repulse_w, one_minus_lam, false)).mean({-1});
  saved = {h, W, squared, neg_gamma, sim, lse, index};
  return {loss, sim};
}

// Its backward: the gradients of h, W and gamma (each where asked for), from the loss's
// gradient and the similarities' (either may be undefined).
std::vector<Tensor> gaussian_backward(const std::vector<Tensor>& saved, const Tensor& grad_loss, Tensor grad,
                                      double lam, double one_minus_lam, const Tensor& lam_w, const Tensor& repulse_w,
                                      bool need_h, bool need_w, bool need_gamma) {
  const Tensor &h = saved[0], &W = saved[1], &squared = saved[2];
  const Tensor &neg_gamma = saved[3], &sim = saved[4], &lse = saved[5], &index = saved[6];
  if (grad_loss.defined()) {
    // The mean's, the weighted sum's, then logsumexp's and the gather's backward; a
    // stack's float64 lambdas rounded to sim's dtype as autograd rounds them.
    Tensor rows = grad_loss.unsqueeze(-1).expand(sim.sizes().slice(0, sim.dim() - 1)).div(c10::Scalar(sim.size(-2)));
    Tensor attract = scaled(rows, lam_w, lam, true).to(sim.scalar_type());
    Tensor repulse = scaled(rows, repulse_w, one_minus_lam, false).to(sim.scalar_type());
    Tensor from_lse = repulse.unsqueeze(-1).mul(sim.sub(lse.unsqueeze(-1)).exp());
    Tensor from_loss = from_lse.scatter_add_(-1, index, attract.unsqueeze(-1));
    grad = grad.defined() ? grad.add(from_loss) : from_loss;
  }
  std::vector<Tensor> out(3);  // h, W, gamma
  if (!grad.defined()) return out;
  if (need_gamma) out[2] = grad.mul(squared).sum_to_size(neg_gamma.sizes()).neg();
  // The gamma product's, then the squared distances'.
  auto distances = squared_distance_backward(grad.mul(neg_gamma), h, W, need_h, need_w);
  out[0] = distances[0], out[1] = distances[1];
  return out;
}

// The FFNN's forward: its output; `saved` gets x and each layer's activation.
Tensor mlp_forward(const Tensor& x, double slope, at::TensorList params, std::vector<Tensor>& saved) {
  saved = {x};
  Tensor a = x;
  for (size_t i = 0; i + 1 < params.size(); i += 2) {
    // In place on addmm's fresh result, as LeakyReLU(inplace=True) would.
    Tensor z = at::addmm(params[i + 1], a, params[i].t());
    a = at::leaky_relu_(z, slope);
    saved.push_back(a);
  }
  return a;
}

// Its backward from the output's gradient: {input, W1, b1, ..., W_L, b_L} (each where
// needs(k) says, k as the parameters' index, -1 for the input).
template <typename Needs>
std::vector<Tensor> mlp_backward(const std::vector<Tensor>& activations, at::TensorList params, double slope,
                                 Tensor grad, Needs needs) {
  const size_t layers = params.size() / 2;
  std::vector<Tensor> out(1 + params.size());
  for (size_t i = layers; i-- > 0;) {
    grad = at::leaky_relu_backward(grad, activations[i + 1], slope, true);
    if (needs(2 * i)) out[1 + 2 * i] = grad.t().mm(activations[i]);
    if (needs(2 * i + 1)) out[2 + 2 * i] = grad.sum({0});
    if (i > 0 || needs(-1)) grad = grad.mm(params[2 * i]);
  }
  if (needs(-1)) out[0] = grad;
  return out;
}

struct GaussianARFn : public torch::autograd::Function<GaussianARFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& h, const Tensor& W, const Tensor& gamma,
                               const Tensor& labels, double lam, double one_minus_lam,
                               const std::optional<Tensor>& lam_t, const std::optional<Tensor>& one_minus_lam_t) {
    Tensor lam_w = or_undefined(lam_t), repulse_w = or_undefined(one_minus_lam_t);
    std::vector<Tensor> saved;
    auto out = gaussian_forward(h, W, gamma, labels, lam, one_minus_lam, lam_w, repulse_w, saved);
    ctx->save_for_backward(saved);
    ctx->saved_data["lam"] = lam;
    ctx->saved_data["one_minus_lam"] = one_minus_lam;
    ctx->saved_data["lam_t"] = lam_w;
    ctx->saved_data["one_minus_lam_t"] = repulse_w;
    ctx->set_materialize_grads(false);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto grad = gaussian_backward(
        ctx->get_saved_variables(), grads[0], grads[1], ctx->saved_data["lam"].toDouble(),
        ctx->saved_data["one_minus_lam"].toDouble(), ctx->saved_data["lam_t"].toTensor(),
        ctx->saved_data["one_minus_lam_t"].toTensor(), ctx->needs_input_grad(0), ctx->needs_input_grad(1),
        ctx->needs_input_grad(2));
    variable_list out(8);  // h, W, gamma, labels, lam, 1 - lam, and their tensor forms
    out[0] = grad[0], out[1] = grad[1], out[2] = grad[2];
    return out;
  }
};

struct LeakyMLPFn : public torch::autograd::Function<LeakyMLPFn> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, double slope, at::TensorList params) {
    std::vector<Tensor> saved;
    Tensor a = mlp_forward(x, slope, params, saved);
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["slope"] = slope;
    return {a};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const size_t layers = (saved.size() - 1) / 3;
    std::vector<Tensor> activations(saved.begin(), saved.begin() + layers + 1);
    std::vector<Tensor> params(saved.begin() + layers + 1, saved.end());
    // needs_input_grad counts tensors only: x is 0, parameter k is 1 + k.
    auto got = mlp_backward(activations, params, ctx->saved_data["slope"].toDouble(), grads[0],
                            [&](int k) { return ctx->needs_input_grad(1 + k); });
    variable_list out(2 + 2 * layers);  // x, slope, then the parameters
    out[0] = got[0];
    for (size_t k = 0; k < 2 * layers; ++k) out[2 + k] = got[1 + k];
    return out;
  }
};

// FusedAdam's step (corel/optim.py) on parameters whose gradients are `grads`: they are
// left in .grad as backward() leaves them, then the steps counted and the fused kernel run.
void adam_step(std::vector<Tensor>& params, const std::vector<Tensor>& grads, std::vector<Tensor>& exp_avgs,
               std::vector<Tensor>& exp_avg_sqs, std::vector<Tensor>& steps, double lr, double beta1, double beta2,
               double eps) {
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i];
  at::_foreach_add_(steps, 1);
  at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, lr, beta1, beta2, /*weight_decay=*/0.0, eps,
                   /*amsgrad=*/false, /*maximize=*/false);
}

// One training step of an FFNN with a Gaussian-COREL head (a fixed gamma) and Adam, with
// no autograd graph: the calls that autograd would make for `loss.backward()` on the two
// nodes above (the loss's gradient seeded with ones_like, as backward() seeds it), then
// FusedAdam's. `layers` are the FFNN's (W1, b1, ..., W_L, b_L) and `W` the class vectors,
// in the optimiser's order with their moments and steps. Returns (loss, sim), as the
// autograd step does.
std::vector<Tensor> gaussian_mlp_step(const Tensor& x, const Tensor& labels, double slope, std::vector<Tensor> layers,
                                      const Tensor& W, const Tensor& gamma, double lam, double one_minus_lam,
                                      std::vector<Tensor> exp_avgs, std::vector<Tensor> exp_avg_sqs,
                                      std::vector<Tensor> steps, double lr, double beta1, double beta2, double eps) {
  torch::NoGradGuard no_grad;  // as inside an autograd Function's forward and backward
  std::vector<Tensor> activations, saved;
  Tensor h = mlp_forward(x, slope, layers, activations);
  auto out = gaussian_forward(h, W, gamma.to(h.scalar_type()), labels, lam, one_minus_lam, Tensor(), Tensor(), saved);
  Tensor seed = at::ones_like(out[0], at::MemoryFormat::Preserve);
  auto head = gaussian_backward(saved, seed, Tensor(), lam, one_minus_lam, Tensor(), Tensor(), true, true, false);
  auto encoder = mlp_backward(activations, layers, slope, head[0], [](int k) { return k >= 0; });
  std::vector<Tensor> params(layers), grads(encoder.begin() + 1, encoder.end());
  params.push_back(W);
  grads.push_back(head[1]);
  adam_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps);
  return out;
}

// The same for a stack of M such members (corel.stacked.StackedRun's step): the calls
// that autograd makes for `loss.sum().backward()` on the stacked FFNN as
// corel.stacked._mlp_forward computes it (shared inputs x (N, ...): the first layer as
// corel.fused.SharedLinear, a baddbmm over x broadcast with the backward of the members'
// weights side by side; each member's own inputs x (M, N, ...): baddbmm), with
// out-of-place LeakyReLUs, then the
// stacked Gaussian-COREL node with per-member lambdas (M, 1) and gamma (M, 1, 1), then
// FusedAdam over the stacked (W1, b1, ..., W_L, b_L, W). Each formula is autograd's
// (derivatives.yaml's, broadcasts summed back with sum_to, gradients made contiguous as
// AccumulateGrad makes them). Returns (losses (M,), sim (M, N, K)).
std::vector<Tensor> stacked_gaussian_mlp_step(
    const Tensor& x, const Tensor& labels, double slope, std::vector<Tensor> layers, const Tensor& W,
    const Tensor& gamma, const Tensor& lam, const Tensor& one_minus_lam, std::vector<Tensor> exp_avgs,
    std::vector<Tensor> exp_avg_sqs, std::vector<Tensor> steps, double lr, double beta1, double beta2, double eps) {
  torch::NoGradGuard no_grad;
  const bool shared = labels.dim() == 1;
  const size_t count = layers.size() / 2;
  std::vector<Tensor> inputs, before;  // each layer's input and its pre-activation
  Tensor a = x.flatten(shared ? 1 : 2);
  for (size_t i = 0; i < count; ++i) {
    const Tensor &Wi = layers[2 * i], &bi = layers[2 * i + 1];
    const int64_t members = Wi.size(0), out = Wi.size(1), dim = Wi.size(2);
    Tensor z;
    if (i == 0 && shared) {
      z = at::baddbmm(bi.unsqueeze(1), a.expand({members, a.size(0), dim}), Wi.transpose(1, 2));  // SharedLinear
    } else {
      z = at::baddbmm(bi.unsqueeze(1), a, Wi.transpose(1, 2));
    }
    inputs.push_back(a);
    before.push_back(z);
    a = at::leaky_relu(z, slope);
  }
  std::vector<Tensor> saved;
  auto out = gaussian_forward(a, W, gamma, labels, 0.0, 0.0, lam, one_minus_lam, saved);
  // sum()'s backward of backward()'s seed: a 0-d one expanded to the members.
  Tensor seed = at::ones({}, out[0].options()).expand(out[0].sizes());
  auto head = gaussian_backward(saved, seed, Tensor(), 0.0, 0.0, lam, one_minus_lam, true, true, false);
  std::vector<Tensor> grads(layers.size());
  Tensor grad = head[0];
  for (size_t i = count; i-- > 0;) {
    const Tensor& Wi = layers[2 * i];
    const int64_t members = Wi.size(0), out = Wi.size(1), dim = Wi.size(2);
    grad = at::leaky_relu_backward(grad, before[i], slope, false);
    if (i == 0 && shared) {
      // SharedLinear's backward: the gradient as (N, M out), the weights' one product.
      Tensor flat = grad.transpose(0, 1).reshape({inputs[0].size(0), members * out});
      grads[0] = flat.t().mm(inputs[0]).view({members, out, dim});
      grads[1] = flat.sum({0}).view({members, out});
    } else {
      // baddbmm's: the bias broadcast over the rows summed back, the weight's through its
      // transpose, the input's where a layer below takes it.
      const std::vector<int64_t> bias{members, 1, out};
      grads[2 * i + 1] = at::sum_to(grad, at::IntArrayRef(bias)).squeeze(1).contiguous();
      grads[2 * i] = inputs[i].transpose(1, 2).bmm(grad).transpose(1, 2).contiguous();
      if (i > 0) grad = grad.bmm(Wi);  // batch2.transpose(1, 2) of batch2 = Wi.transpose(1, 2)
    }
  }
  std::vector<Tensor> params(layers);
  params.push_back(W);
  grads.push_back(head[1].contiguous());
  adam_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps);
  return out;
}

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
  m.def("squared_distance_backward", &squared_distance_backward,
        "the squared distances' gradients for h and W (corel.fused.squared_distance_backward)");
  m.def("gaussian_ar", &gaussian_ar, "(loss, sim) of Gaussian-COREL as one node (corel.fused.GaussianAR)");
  m.def("leaky_mlp", &leaky_mlp, "the FFNN's layers as one node (corel.fused.LeakyMLP)");
  m.def("gaussian_mlp_step", &gaussian_mlp_step,
        "one Adam step of an FFNN with a Gaussian-COREL head, without autograd (corel.step.gaussian_mlp_step)");
  m.def("stacked_gaussian_mlp_step", &stacked_gaussian_mlp_step,
        "the same for a stack of members (corel.step.stacked_gaussian_mlp_step)");
}
