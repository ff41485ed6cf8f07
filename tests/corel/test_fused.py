"""The FFNN as one autograd node (corel.fused), the lean Adam step (corel.optim) and the
stacked loss without vmap: the same numbers as autograd, torch.optim.Adam and vmap, and
really used in training. Each fused node is tested in both its implementations: the
compiled one (corel.native, which ``make install`` builds) and the Python one."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from corel import native, similarity
from corel.encoders.paper import FFNN
from corel.fused import GaussianAR, LeakyMLP, fusable, gaussian_ar
from corel.losses import GaussianCOREL
from corel.losses.ar import _attractive_repulsive_core
from corel.train.optim import FusedAdam, step_together

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels


@pytest.fixture(params=["native", "python"])
def nodes(request, monkeypatch):
    """Which implementation of the fused nodes runs: corel.native's or the Python one."""
    if request.param == "python":
        monkeypatch.setattr(native, "module", lambda: None)
    else:
        assert native.module() is not None, (
            "corel.native is not built for this environment: `python -m corel.native build` "
            "(make install runs it)")
    return request.param


def _ran(t, node):
    """Whether t came out of the fused node ``node`` (either implementation's)."""
    return t.grad_fn is not None and node in t.grad_fn.name()


def _compiled(t):
    """Whether t's node is a C++ one (corel.native's) rather than a Python Function."""
    return "CppNode" in t.grad_fn.name()


def _node(nodes, name):
    """The fused node ``name`` of one implementation, called as the Python Function is."""
    if nodes == "python":
        return {"LeakyMLP": LeakyMLP, "GaussianAR": GaussianAR}[name].apply
    compiled = native.module()
    if name == "LeakyMLP":
        return lambda x, slope, *params: compiled.leaky_mlp(x, slope, list(params))
    return lambda h, W, g, labels, lam, one_minus_lam: compiled.gaussian_ar(
        h, W, g, labels, float(lam), float(one_minus_lam), None, None)


def _pair(dtype, dropout=0.0):
    torch.manual_seed(0)
    model = FFNN((1, 28, 28), hidden=32, dropout=dropout).to(dtype)
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("input_grad", [False, True])
def test_the_fused_ffnn_gives_autograds_outputs_and_gradients_bit_for_bit(dtype, input_grad, nodes):
    fused, plain = _pair(dtype)
    x = torch.randn(37, 1, 28, 28, dtype=dtype, requires_grad=input_grad)
    x_plain = x.detach().clone().requires_grad_(input_grad)
    out = fused(x)
    assert _ran(out, "LeakyMLP")  # the fused node ran
    assert _compiled(out) == (nodes == "native")
    ref = plain.net(x_plain)
    assert not _ran(ref, "LeakyMLP")
    assert torch.equal(out, ref)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    for (name, a), b in zip(fused.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name
        assert a.grad.stride() == b.grad.stride(), name
    if input_grad:
        assert torch.equal(x.grad, x_plain.grad)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_the_fused_ffnn_stands_aside_where_the_plain_modules_must_run(nodes):
    model, _ = _pair(torch.float32)
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert model(x).grad_fn is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not _ran(model(x), "LeakyMLP")
    traced = torch.jit.trace(model, x, check_trace=False)  # a trace records the modules
    assert torch.equal(traced(x), model(x).detach())
    dropout, _ = _pair(torch.float32, dropout=0.5)
    assert fusable(dropout.net) is None
    assert not _ran(dropout(x), "LeakyMLP")
    assert fusable(nn.Sequential(nn.Linear(3, 3), nn.ReLU())) is None


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_under_torch_compile_the_plain_operations_are_traced(nodes):
    """torch.compile traces the plain modules and loss whole (the compiled node would be a
    break in its graph): the same outputs, and no fused node in them."""
    torch._dynamo.reset()
    model, _ = _pair(torch.float32)
    x = torch.randn(6, 1, 28, 28)
    out = torch.compile(model, backend="eager")(x)
    assert not _ran(out, "LeakyMLP") and torch.equal(out, model(x))
    head = GaussianCOREL(5, 32, lam=0.8)
    labels = torch.randint(0, 5, (6,))
    loss, sim = torch.compile(head.loss_and_similarities, backend="eager")(out, labels)
    assert not _ran(loss, "GaussianAR")
    fused_loss, fused_sim = head.loss_and_similarities(out, labels)
    assert _ran(fused_loss, "GaussianAR") and torch.equal(loss, fused_loss) and torch.equal(sim, fused_sim)


def test_the_fused_node_checks_its_gradient_numerically(nodes):
    torch.manual_seed(1)
    params = [torch.randn(5, 4, dtype=torch.float64, requires_grad=True),
              torch.randn(5, dtype=torch.float64, requires_grad=True),
              torch.randn(3, 5, dtype=torch.float64, requires_grad=True),
              torch.randn(3, dtype=torch.float64, requires_grad=True)]
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    node = _node(nodes, "LeakyMLP")
    assert torch.autograd.gradcheck(lambda x, *p: node(x, 0.1, *p), (x, *params))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_adam_steps_as_torchs_fused_adam_bit_for_bit(dtype):
    torch.manual_seed(0)
    ours_model = nn.Sequential(nn.Linear(20, 16), nn.LeakyReLU(0.1), nn.Linear(16, 3)).to(dtype)
    theirs_model = copy.deepcopy(ours_model)
    ours = FusedAdam(ours_model.parameters(), lr=1e-3)
    theirs = torch.optim.Adam(theirs_model.parameters(), lr=1e-3, fused=True)
    for step in range(6):
        x = torch.randn(8, 20, dtype=dtype)
        for model, opt in ((ours_model, ours), (theirs_model, theirs)):
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            if step > 0:  # after the first step the lean path is the one taken
                assert opt is theirs or ours._lean_lists() is not None
            opt.step()
    for a, b in zip(ours_model.parameters(), theirs_model.parameters(), strict=True):
        assert torch.equal(a, b)
    ours.zero_grad()
    assert all(p.grad is None for p in ours_model.parameters())
    mine, want = ours.state_dict(), theirs.state_dict()
    assert mine["param_groups"] == want["param_groups"]
    for index, entry in want["state"].items():
        for name, value in entry.items():
            assert torch.equal(mine["state"][index][name], value), name
    # Its state loads into torch's Adam and back.
    plain = torch.optim.Adam(theirs_model.parameters(), lr=1e-3, fused=True)
    plain.load_state_dict(mine)
    ours.load_state_dict(want)


def test_fused_adams_stepped_together_step_as_each_alone_bit_for_bit():
    """step_together: one kernel call for several optimisers (a sweep's stacks in lockstep),
    the same numbers as each one's own step; where their lr differs, or one cannot take the
    lean step, nothing is done and it says so."""
    torch.manual_seed(0)
    models = [nn.Linear(6, 4), nn.Sequential(nn.Linear(6, 3), nn.Linear(3, 2))]
    twins = copy.deepcopy(models)
    together = [FusedAdam(m.parameters(), lr=1e-2) for m in models]
    alone = [FusedAdam(m.parameters(), lr=1e-2) for m in twins]
    stepped = []
    for _ in range(4):
        x = torch.randn(5, 6)
        for ms, opts in ((models, together), (twins, alone)):
            for model, opt in zip(ms, opts, strict=True):
                opt.zero_grad()
                model(x).square().mean().backward()
        stepped.append(step_together(together))
        if not stepped[-1]:
            for opt in together:
                opt.step()
        for opt in alone:
            opt.step()
    assert stepped == [False, True, True, True]  # the first step makes the state: torch's own
    for a, b in zip(models, twins, strict=True):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(p, q)
    for opt_a, opt_b in zip(together, alone, strict=True):
        for sa, sb in zip(opt_a.state.values(), opt_b.state.values(), strict=True):
            assert all(torch.equal(sa[k], sb[k]) for k in sa)
    third = nn.Linear(6, 4)
    other = FusedAdam(third.parameters(), lr=1e-3)
    for _ in range(2):  # its state made: only its lr stands in the way
        other.zero_grad()
        third(torch.randn(5, 6)).sum().backward()
        other.step()
    third(torch.randn(5, 6)).sum().backward()
    assert other._lean_lists() is not None
    before = [p.detach().clone() for p in models[0].parameters()]
    assert not step_together([together[0], other])  # another lr: each steps by itself
    assert all(torch.equal(p, b) for p, b in zip(models[0].parameters(), before, strict=True))


def test_fused_adam_keeps_torchs_hooks_and_profiler_record():
    """The lean step skips torch's wrapper only where it would do nothing: hooks (global
    or the optimiser's own) still run once a step, and a profiler still sees the step."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    torch.optim.Adam(nn.Linear(2, 2).parameters())  # torch wraps Adam.step: not twice
    opt = FusedAdam(model.parameters(), lr=1e-2)
    calls = []

    def train(steps):
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            opt.step()

    train(2)  # the state exists: the lean path from here on
    for register in ((opt.register_step_pre_hook, opt.register_step_post_hook),
                     (register_optimizer_step_pre_hook, register_optimizer_step_post_hook)):
        handles = [register[0](lambda *a: calls.append("pre")), register[1](lambda *a: calls.append("post"))]
        try:
            train(2)
        finally:
            for handle in handles:
                handle.remove()
        assert calls == ["pre", "post"] * 2, register
        calls.clear()
    calls.clear()
    train(1)
    assert calls == []
    with torch.profiler.profile() as prof:
        train(1)
    assert "Optimizer.step#FusedAdam.step" in {e.name for e in prof.events()}


def test_fused_adam_takes_torchs_path_for_what_it_does_not_cover():
    model = nn.Linear(3, 2)
    opt = FusedAdam(model.parameters(), lr=1e-2)
    assert opt._lean_lists() is None  # no state yet: the first step creates it
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    model.bias.grad = None
    model(torch.randn(4, 3)).sum().backward()
    model.bias.grad = None
    assert opt._lean_lists() is None  # a parameter without a gradient
    before = model.bias.detach().clone()
    opt.step()
    assert torch.equal(model.bias, before)  # torch's Adam skips it, as it should



@pytest.mark.parametrize("loss", ["cce", "center", "cosine", "gaussian"])
def test_the_stacked_loss_without_vmap_is_the_vmapped_members(loss):
    from corel.data import load_dataset
    from corel.spec import ExperimentSpec
    from corel.train import StackedRun

    data = load_dataset(ExperimentSpec(dataset="digits")).astype(torch.float64)
    specs = [ExperimentSpec(dataset="digits", model="ffnn", loss=loss, lam=lam, epochs=1)
             for lam in (0.3, 0.6, 0.9)]
    group = StackedRun.start(specs, data, device="cpu")
    if loss == "center":  # centers away from zero, so that the term is not trivial
        group.buffers["head.centers"] = torch.randn_like(group.buffers["head.centers"])
    x, y = data.x_train[:50], data.y_train[:50]
    h = group.encode(x)
    got, got_sim = group._stacked_loss(h, y)
    want, want_sim = group._vmapped_loss(group.params, group.buffers, group.lam,
                                         group.one_minus_lam, group.loss_options, h, y)
    assert got.shape == (3,)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(got_sim, want_sim, rtol=1e-13, atol=1e-13)


def _gaussian_pair(dtype, stacked, learn):
    """(inputs, a copy): h, W, log gamma, labels and lambdas of one head or a stack of three."""
    torch.manual_seed(3)
    lead = (3,) if stacked else ()
    h = torch.randn(*lead, 37, 16, dtype=dtype) * 3
    W = torch.randn(*lead, 5, 16, dtype=dtype) * 3
    h[..., 0, :] = W[..., 2, :]  # a point on a class vector: zero distance
    log_gamma = (torch.tensor([-0.7, -0.3, 0.1], dtype=dtype).view(3, 1, 1) if stacked
                 else torch.tensor(-0.3, dtype=dtype))
    labels = torch.randint(0, 5, (37,))
    labels[0] = 2
    if stacked:  # per-member lambdas in float64, as StackedRun holds them
        lam = torch.tensor([[0.5], [0.7], [0.9]], dtype=torch.float64)
        one_minus_lam = 1.0 - lam
    else:
        lam, one_minus_lam = 0.85, 1.0 - 0.85
    def leaves():
        return [t.clone().requires_grad_(t is not log_gamma or learn) for t in (h, W, log_gamma)]
    return leaves(), leaves(), labels, lam, one_minus_lam


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("learn", [False, True])
def test_the_fused_gaussian_loss_gives_autograds_values_and_gradients_bit_for_bit(dtype, stacked, learn, nodes):
    (h, W, lg), (h2, W2, lg2), labels, lam, one_minus_lam = _gaussian_pair(dtype, stacked, learn)
    loss, sim = gaussian_ar(h, W, lg.exp(), labels, lam, one_minus_lam)
    assert _ran(loss, "GaussianAR")  # the fused node ran
    assert _compiled(loss) == (nodes == "native")
    sim2 = similarity._gaussian(h2, W2, lg2.exp())
    loss2 = _attractive_repulsive_core(sim2, labels, lam, one_minus_lam, "logsumexp")
    assert not _ran(loss2, "GaussianAR")
    assert torch.equal(loss, loss2) and torch.equal(sim, sim2)
    loss.sum().backward()
    loss2.sum().backward()
    named = (("h", h, h2), ("W", W, W2)) + ((("gamma", lg, lg2),) if learn else ())
    for name, a, b in named:
        assert torch.equal(a.grad, b.grad), name
    assert torch.isfinite(h.grad[..., 0, :]).all()  # finite at zero distance
    # Where the similarities also feed another term (a caller's own loss), autograd adds
    # the three contributions in its own order: the same to rounding.
    for t in (h, W, lg, h2, W2, lg2):
        t.grad = None
    extra = torch.randn_like(sim)
    loss, sim = gaussian_ar(h, W, lg.exp(), labels, lam, one_minus_lam)
    (loss.sum() + (sim * extra).sum()).backward()
    sim2 = similarity._gaussian(h2, W2, lg2.exp())
    loss2 = _attractive_repulsive_core(sim2, labels, lam, one_minus_lam, "logsumexp")
    (loss2.sum() + (sim2 * extra).sum()).backward()
    for name, a, b in named:
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_the_fused_gaussian_loss_checks_its_gradient_numerically(nodes):
    (h, W, lg), _, labels, lam, one_minus_lam = _gaussian_pair(torch.float64, False, True)
    h = h[1:].detach().requires_grad_()  # cdist's gradient is not smooth at zero distance
    node = _node(nodes, "GaussianAR")
    assert torch.autograd.gradcheck(
        lambda h, W, g: node(h, W, g.exp(), labels[1:], lam, one_minus_lam), (h, W, lg))


def test_the_gaussian_head_trains_with_the_fused_node_and_stands_aside_elsewhere(nodes):
    torch.manual_seed(0)
    head = GaussianCOREL(5, 16, lam=0.8)
    h, labels = torch.randn(9, 16, requires_grad=True), torch.randint(0, 5, (9,))
    loss, sim = head.loss_and_similarities(h, labels)
    assert _ran(loss, "GaussianAR")
    assert torch.equal(sim, head.similarities(h))
    assert torch.equal(head(h, labels), loss)  # forward takes it too
    with torch.no_grad():
        assert torch.equal(head.loss_and_similarities(h, labels)[0], loss)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not _ran(head.loss_and_similarities(h, labels)[0], "GaussianAR")
    with pytest.raises(ValueError, match=r"labels must lie in 0\.\.4"):
        head.loss_and_similarities(h, torch.full((9,), 5))


@pytest.mark.parametrize("members,width", [(4, 32), (10, 128)])  # (10, 128): the FFNN sweep's
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_squared_distances_backward_is_one_in_python_and_c_and_a_stack_is_its_members(dtype, members, width):
    """corel.native's squared-distance backward is corel.fused's bit for bit (the same calls),
    for a pair and a stack, for h and W alone and together; and each member of a stack gets
    the gradients it gets alone, to a few ulps of their largest component. (Bit for bit
    with this machine's MKL, as bench/sweep_throughput.py prints; but a batched product and
    a single one may round differently on another CPU's kernels, so the test allows the
    ulps that a different summation order of 128 terms may cost.)"""
    built = native.module()
    assert built is not None
    from corel.fused import squared_distance_backward

    g = torch.Generator().manual_seed(5)
    h = torch.randn(members, 128, width, generator=g, dtype=dtype) * 3
    W = torch.randn(members, 10, width, generator=g, dtype=dtype) * 3
    grad = torch.randn(members, 128, 10, generator=g, dtype=dtype)
    for args in ((grad, h, W), (grad[0], h[0], W[0])):
        for need in ((True, True), (True, False), (False, True)):
            python, c = squared_distance_backward(*args, *need), built.squared_distance_backward(*args, *need)
            for a, b, wanted in zip(python, c, need, strict=True):
                if wanted:
                    assert torch.equal(a, b)
                else:
                    assert a is None and b is None
    stacked_h, stacked_w = squared_distance_backward(grad, h, W)
    eps = torch.finfo(dtype).eps
    for m in range(members):
        for got, solo in zip((stacked_h[m], stacked_w[m]), squared_distance_backward(grad[m], h[m], W[m]),
                             strict=True):
            torch.testing.assert_close(got, solo, rtol=0, atol=64 * eps * float(solo.abs().max()))


def _wide_first_layer(x, W, b):
    """A stack's first layer as it was before SharedLinear: the members' weights side by
    side as one F.linear, made (M, N, out) with a copy; plain autograd."""
    members, out, dim = W.shape
    z = nn.functional.linear(x, W.reshape(members * out, dim), b.reshape(members * out))
    return z.view(len(x), members, out).transpose(0, 1).contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_shared_first_layer_has_the_wide_layers_gradients_bit_for_bit(dtype):
    """corel.fused.SharedLinear: the same layer as the members' weights side by side (its
    values to rounding, each member's as its own product), and the gradients of x, W and b
    that autograd takes for that wide product, bit for bit, which the stacked native step
    and the stacked runs' checkpoints rely on."""
    from corel.fused import shared_linear

    g = torch.Generator().manual_seed(7)
    x = torch.rand(128, 784, generator=g, dtype=dtype, requires_grad=True)
    W = (torch.randn(10, 128, 784, generator=g, dtype=dtype) * 0.05).requires_grad_()
    b = torch.randn(10, 128, generator=g, dtype=dtype, requires_grad=True)
    upstream = torch.randn(10, 128, 128, generator=g, dtype=dtype)
    out = shared_linear(x, W, b)
    assert _ran(out, "SharedLinear") and out.shape == (10, 128, 128)
    wide = _wide_first_layer(x, W, b)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, wide, rtol=0, atol=tol)
    for m in range(10):
        torch.testing.assert_close(out[m], nn.functional.linear(x, W[m], b[m]), rtol=0, atol=tol)
    got = torch.autograd.grad(out, (x, W, b), upstream)
    want = torch.autograd.grad(wide, (x, W, b), upstream)
    for a, c in zip(got, want, strict=True):
        assert torch.equal(a, c) and a.is_contiguous()


def test_the_shared_first_layer_checks_its_gradient_numerically_and_stands_aside():
    from corel.fused import shared_linear

    torch.manual_seed(3)
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    W = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(shared_linear, (x, W, b))
    with torch.no_grad():
        plain = shared_linear(x, W, b)
    assert plain.grad_fn is None and torch.equal(plain, shared_linear(x, W, b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = shared_linear(x.float(), W.float(), b.float())
    assert not _ran(cast, "SharedLinear") and cast.dtype == torch.bfloat16
