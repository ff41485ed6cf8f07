"""Similarities against a per-pair loop of their definitions."""

import math

import pytest
import torch

from corel import fused, similarity

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels

DTYPES = [torch.float32, torch.float64]


def loop(fn, h, W):
    return torch.tensor(
        [[fn(h[i], W[k]) for k in range(W.shape[0])] for i in range(h.shape[0])], dtype=h.dtype
    )


def dot_pair(a, b):
    return float(sum(float(x) * float(y) for x, y in zip(a, b, strict=True)))


def cos_pair(a, b):
    return dot_pair(a, b) / (math.sqrt(dot_pair(a, a)) * math.sqrt(dot_pair(b, b)))


def gau_pair(a, b, gamma=0.5):
    return -gamma * sum((float(x) - float(y)) ** 2 for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2, 1), (5, 3, 4), (17, 10, 33)])
def test_matches_definition(dtype, shape):
    n, k, d = shape
    g = torch.Generator().manual_seed(n * 100 + k)
    h = torch.randn(n, d, generator=g, dtype=dtype) * 3
    W = torch.randn(k, d, generator=g, dtype=dtype)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    torch.testing.assert_close(similarity.dot(h, W), loop(dot_pair, h, W), **tol)
    torch.testing.assert_close(similarity.cosine(h, W), loop(cos_pair, h, W), **tol)
    torch.testing.assert_close(similarity.gaussian(h, W), loop(gau_pair, h, W), **tol)
    torch.testing.assert_close(
        similarity.gaussian(h, W, gamma=2.0),
        loop(lambda a, b: gau_pair(a, b, 2.0), h, W),
        **tol,
    )
    for fn in (similarity.dot, similarity.cosine, similarity.gaussian):
        assert fn(h, W).dtype == dtype and fn(h, W).shape == (n, k)


def test_gaussian_of_a_point_with_itself_is_zero_not_negative_rounding():
    h = torch.randn(8, 128) * 50
    s = similarity.gaussian(h, h)
    assert (s <= 0).all()
    assert torch.diagonal(s).abs().max() == 0


def test_cosine_of_zero_vector_is_zero_not_nan():
    h = torch.zeros(2, 3)
    W = torch.randn(4, 3)
    assert torch.equal(similarity.cosine(h, W), torch.zeros(2, 4))


@pytest.mark.parametrize("name", ["dot", "cosine", "gaussian"])
def test_gradcheck(name):
    fn = similarity.SIMILARITIES[name]
    g = torch.Generator().manual_seed(0)
    h = torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    W = torch.randn(3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (h, W))


def test_gradcheck_gamma():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(4, 5, dtype=torch.float64, generator=g)
    W = torch.randn(3, 5, dtype=torch.float64, generator=g)
    gamma = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda gm: similarity.gaussian(h, W, gm), (gamma,))


@pytest.mark.parametrize(
    ("h", "W", "match"),
    [
        (torch.randn(3), torch.randn(2, 3), "h must have shape"),
        (torch.randn(3, 4), torch.randn(4), "W must have shape"),
        (torch.randn(3, 4), torch.randn(2, 5), "feature dimension"),
        (torch.ones(3, 4, dtype=torch.long), torch.randn(2, 4), "floating point"),
    ],
)
@pytest.mark.parametrize("name", ["dot", "cosine", "gaussian"])
def test_bad_input(name, h, W, match):
    with pytest.raises(ValueError, match=match):
        similarity.SIMILARITIES[name](h, W)


@pytest.mark.parametrize("gamma", [0.0, -1.0, float("nan")])
def test_bad_gamma(gamma):
    with pytest.raises(ValueError, match="gamma must be a positive"):
        similarity.gaussian(torch.randn(2, 3), torch.randn(2, 3), gamma)


def far_cluster(dtype, stack=(), n=12, k=5, dim=16, offset=500.0):
    """Points and class vectors a few units apart, all about ``offset`` from the origin
    (the case where an expansion about the origin loses the distances to rounding)."""
    g = torch.Generator().manual_seed(3)
    centre = torch.randn(*stack, 1, dim, generator=g, dtype=torch.float64)
    centre = centre / centre.norm(dim=-1, keepdim=True) * offset
    W = centre + torch.randn(*stack, k, dim, generator=g, dtype=torch.float64)
    h = centre + torch.randn(*stack, n, dim, generator=g, dtype=torch.float64)
    grad = torch.randn(*stack, n, k, generator=g, dtype=torch.float64)
    return h.to(dtype), W.to(dtype), grad.to(dtype)


def exact_gradients(h, W, grad):
    """2 sum_k grad_ik (h_i - w_k) and 2 sum_i grad_ik (w_k - h_i), from the differences in
    float64."""
    h, W, grad = h.double(), W.double(), grad.double()
    diff = h.unsqueeze(-2) - W.unsqueeze(-3)  # (..., N, K, H)
    return 2 * (grad.unsqueeze(-1) * diff).sum(-2), -2 * (grad.unsqueeze(-1) * diff).sum(-3)


@pytest.mark.parametrize("stack", [(), (3,)])
def test_the_squared_distances_gradient_is_accurate_far_from_the_origin(stack):
    """The gradient of the Gaussian similarity's squared distances comes from matrix
    products about the class vectors' mean: in float32, 500 away from the origin, it is as
    close to the exact one (float64, from the differences) as float32 rounding of the
    distances allows, in a pair and in a stack of pairs."""
    h, W, grad = far_cluster(torch.float32, stack)
    exact_h, exact_w = exact_gradients(h, W, grad)
    got_h, got_w = fused.squared_distance_backward(grad, h, W)
    for got, exact in ((got_h, exact_h), (got_w, exact_w)):
        assert got.dtype == torch.float32 and got.shape == exact.shape
        assert float((got.double() - exact).abs().max() / exact.abs().max()) < 1e-6
    # Expanded about the origin instead, the same products lose about 100 times more
    # (~1e-5 against ~6e-8, which the differences in float32 also give): the test above
    # tells the two apart.
    twice = grad * 2
    origin_h = h * twice.sum(-1, keepdim=True) - twice.matmul(W)
    assert float((origin_h.double() - exact_h).abs().max() / exact_h.abs().max()) > 1e-6


def test_the_gaussian_similarity_trains_through_its_squared_distance_node():
    """With a gradient wanted, similarity.gaussian records one SquaredDistance node whose
    gradients match the exact ones (float64) and pass gradcheck; without one (no_grad, or
    nothing requiring a gradient) it runs plain cdist: the same values either way."""
    h, W, grad = far_cluster(torch.float64, offset=3.0)
    h, W = h.requires_grad_(), W.requires_grad_()
    sim = similarity.gaussian(h, W, 0.5)
    assert type(sim.grad_fn).__name__ == "MulBackward0"
    assert sim.grad_fn.next_functions[1][0].name().endswith("SquaredDistanceBackward")
    sim.backward(grad)
    exact_h, exact_w = exact_gradients(h.detach(), W.detach(), -0.5 * grad)
    torch.testing.assert_close(h.grad, exact_h, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(W.grad, exact_w, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda a, b: fused.squared_distances(a, b), (h, W))
    with torch.no_grad():
        plain = similarity.gaussian(h, W, 0.5)
    assert plain.grad_fn is None and torch.equal(plain, sim.detach())
    assert torch.equal(similarity.gaussian(h.detach(), W.detach(), 0.5), plain)


def test_the_squared_distances_gradient_is_zero_at_zero_distance():
    """h_i = w_k exactly: that pair's term of the gradient is exactly 0 (the derivative of
    the squared distance), as cdist's own backward makes it."""
    W = torch.randn(1, 8) * 300
    h = W.clone()
    got_h, got_w = fused.squared_distance_backward(torch.ones(1, 1), h, W)
    assert torch.equal(got_h, torch.zeros_like(h)) and torch.equal(got_w, torch.zeros_like(W))
