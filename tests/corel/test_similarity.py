"""Similarities against a per-pair loop of their definitions."""

import math

import pytest
import torch

from corel import similarity

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
