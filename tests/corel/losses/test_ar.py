"""AR losses against a slow per-sample loop of the paper's equations."""

import math

import pytest
import torch
import torch.nn.functional as F

from corel import losses, similarity
from corel.loss_catalog import LOSS_NAMES, PAPER_LOSSES

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels

DTYPES = [torch.float32, torch.float64]


def tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}


def ar_loop(sim, labels, lam, repulsion):
    """L_AR = mean_i [ -lam attract_i + (1 - lam) repulse_i ], one sample at a time."""
    total = 0.0
    n, k = sim.shape
    for i in range(n):
        row = [float(v) for v in sim[i].detach()]
        y = int(labels[i])
        attract = row[y]
        if repulsion == "logsumexp":
            m = max(row)
            repulse = m + math.log(sum(math.exp(v - m) for v in row))
        else:
            repulse = max(row[j] for j in range(k) if j != y) ** 2
        total += -lam * attract + (1 - lam) * repulse
    return total / n


def random_case(seed, dtype, n=None, k=None, d=None):
    g = torch.Generator().manual_seed(seed)
    n = n or int(torch.randint(1, 40, (1,), generator=g))
    k = k or int(torch.randint(2, 12, (1,), generator=g))
    d = d or int(torch.randint(1, 20, (1,), generator=g))
    h = torch.randn(n, d, generator=g, dtype=dtype) * 2
    W = torch.randn(k, d, generator=g, dtype=dtype)
    y = torch.randint(0, k, (n,), generator=g)
    return h, W, y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lam", [0.1, 0.5, 0.85, 1.0])
@pytest.mark.parametrize(
    ("sim_name", "repulsion"),
    [("dot", "logsumexp"), ("gaussian", "logsumexp"), ("cosine", "max_squared")],
)
def test_attractive_repulsive_matches_loop(dtype, seed, lam, sim_name, repulsion):
    h, W, y = random_case(seed, dtype)
    sim = similarity.SIMILARITIES[sim_name](h, W)
    got = losses.attractive_repulsive(sim, y, lam, repulsion)
    assert got.dtype == dtype
    torch.testing.assert_close(got, torch.tensor(ar_loop(sim, y, lam, repulsion), dtype=dtype), **tol(dtype))


def test_logsumexp_is_stable_at_large_distances():
    h = torch.tensor([[0.0, 0.0], [100.0, 100.0]])
    W = torch.tensor([[50.0, 0.0], [0.0, -60.0]])
    y = torch.tensor([0, 1])
    loss = losses.attractive_repulsive(similarity.gaussian(h, W), y, 0.85)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss.double(), torch.tensor(ar_loop(similarity.gaussian(h, W).double(), y, 0.85, "logsumexp"), dtype=torch.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_center_loss_term_matches_loop(dtype, seed):
    h, C, y = random_case(seed, dtype)
    expected = sum(
        0.5 * sum((float(h[i, j]) - float(C[y[i], j])) ** 2 for j in range(h.shape[1]))
        for i in range(h.shape[0])
    ) / h.shape[0]
    torch.testing.assert_close(losses.center_loss_term(h, y, C), torch.tensor(expected, dtype=dtype), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lam", [0.3, 0.7, 1.0])
def test_presets_match_loop(dtype, seed, lam):
    h, _, y = random_case(seed, dtype, k=5, d=7)
    for name in PAPER_LOSSES:  # the others: tests/corel/losses/test_peers.py
        head = losses.build_loss(name, 5, 7, lam=lam, gamma=0.8).to(dtype)
        with torch.no_grad():
            head.W.normal_()
        loss = head(h, y)
        # The training loop's path, labels validated beforehand: the same computation.
        assert torch.equal(head.loss(head.similarities(h), h, y, check=False), loss)
        if name in ("cce", "center"):
            logits = h @ head.W.T + head.bias
            expected = ar_loop(logits, y, 0.5, "logsumexp") * 2
            if name == "center":
                expected += lam * losses.center_loss_term(h, y, head.centers).item()
        elif name == "cosine":
            expected = ar_loop(similarity.cosine(h, head.W), y, lam, "max_squared")
        else:
            expected = ar_loop(similarity.gaussian(h, head.W, 0.8), y, lam, "logsumexp")
        torch.testing.assert_close(loss, torch.tensor(expected, dtype=dtype), **tol(dtype))


def test_gaussian_at_half_lambda_is_half_cce_with_tied_bias():
    """-gamma|h|^2 cancels in the logsumexp: Gaussian-COREL(lam=.5) = CE(2g h.w - g|w|^2) / 2."""
    h, W, y = random_case(3, torch.float64, n=50, k=7, d=9)
    gamma = 0.5
    head = losses.GaussianCOREL(7, 9, lam=0.5, gamma=gamma).double()
    with torch.no_grad():
        head.W.copy_(W)
    tied_logits = 2 * gamma * h @ W.T - gamma * (W * W).sum(1)
    torch.testing.assert_close(head(h, y), 0.5 * F.cross_entropy(tied_logits, y))
    # ... and lam > 0.5 is not a rescaled cross-entropy any more.
    head.lam = 0.85
    assert not torch.allclose(head(h, y), 0.5 * F.cross_entropy(tied_logits, y))


def test_cce_is_ar_with_dot_at_half_lambda():
    h, W, y = random_case(4, torch.float64)
    torch.testing.assert_close(
        F.cross_entropy(h @ W.T, y), 2 * losses.attractive_repulsive(h @ W.T, y, 0.5, "logsumexp")
    )


@pytest.mark.parametrize("repulsion", losses.REPULSIONS)
def test_gradcheck_attractive_repulsive(repulsion):
    h, W, y = random_case(5, torch.float64, n=6, k=4, d=3)
    sim = similarity.gaussian(h, W).requires_grad_()
    assert torch.autograd.gradcheck(lambda s: losses.attractive_repulsive(s, y, 0.7, repulsion), (sim,))


@pytest.mark.parametrize("name", ["cce", "center", "cosine", "gaussian"])
def test_gradcheck_presets(name):
    h, _, y = random_case(6, torch.float64, n=6, k=4, d=3)
    head = losses.build_loss(name, 4, 3, lam=0.7, learn_gamma=name == "gaussian").double()
    with torch.no_grad():
        head.W.normal_()
    h.requires_grad_()
    params = [p for p in head.parameters()]
    assert torch.autograd.gradcheck(lambda x, *ps: head(x, y), (h, *params))


def test_gradcheck_center_loss_term():
    h, C, y = random_case(7, torch.float64, n=6, k=4, d=3)
    h.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: losses.center_loss_term(x, y, C), (h,))


def test_center_update_follows_wen_et_al():
    head = losses.CenterLoss(3, 2, lam=0.5, alpha=0.25).double()
    head.centers.copy_(torch.tensor([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]]))
    h = torch.tensor([[1.0, 0.0], [3.0, 0.0], [1.0, 3.0]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1])
    expected = head.centers.clone()
    for j in range(3):
        members = [i for i in range(3) if int(y[i]) == j]
        delta = sum((expected[j] - h[i] for i in members), torch.zeros(2, dtype=torch.float64))
        expected[j] = expected[j] - 0.25 * delta / (1 + len(members))
    head.after_batch(h, y)
    torch.testing.assert_close(head.centers, expected)
    assert torch.equal(head.centers[2], torch.tensor([5.0, 5.0], dtype=torch.float64))
    assert "centers" not in dict(head.named_parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_class_counts_are_bincounts_with_absent_classes(dtype):
    labels = torch.randint(0, 7, (300,), generator=torch.Generator().manual_seed(3))
    labels = labels[labels != 4]  # class 4 absent; 8 and 9 beyond the largest label
    counts = losses.class_counts(labels, 10, dtype)
    assert counts.dtype == dtype and counts.shape == (10,)
    assert torch.equal(counts, torch.bincount(labels, minlength=10).to(dtype))
    assert counts[4] == 0 and counts[8] == 0 and counts[9] == 0


def test_gamma_learnable_only_on_request():
    assert "log_gamma" not in dict(losses.GaussianCOREL(3, 4).named_parameters())
    head = losses.GaussianCOREL(3, 4, gamma=0.3, learn_gamma=True)
    assert "log_gamma" in dict(head.named_parameters())
    assert float(head.gamma.detach()) == pytest.approx(0.3)


def test_registry_names():
    assert set(losses.LOSSES) == set(LOSS_NAMES)
    with pytest.raises(ValueError, match=f"unknown loss 'npair'; allowed: {', '.join(LOSS_NAMES)}$"):
        losses.build_loss("npair", 3, 4)


def test_prediction_is_argmax_similarity():
    h, _, _ = random_case(8, torch.float32, n=20, k=5, d=6)
    for name in losses.LOSSES:
        head = losses.build_loss(name, 5, 6)
        assert torch.equal(head.predict(h), head.similarities(h).argmax(1))


sim = torch.randn(4, 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lam": 0.0}, r"lam must be a number in \(0, 1\]"),
        ({"lam": 1.5}, r"lam must be a number in \(0, 1\]"),
        ({"lam": float("nan")}, r"lam must be a number in \(0, 1\]"),
        ({"labels": torch.tensor([0, 1, 2, 3])}, r"labels must lie in 0\.\.2"),
        ({"labels": torch.tensor([0, -1, 2, 1])}, r"labels must lie in 0\.\.2"),
        ({"labels": torch.tensor([0.0, 1.0, 2.0, 1.0])}, "int64"),
        ({"labels": torch.tensor([0, 1, 2], dtype=torch.long)}, r"shape \(4,\)"),
        ({"labels": [0, 1, 2, 1]}, "int64"),
        ({"repulsion": "softmax"}, "repulsion must be one of logsumexp, max_squared"),
        ({"sim": torch.randn(4)}, r"shape \(N, K\)"),
        ({"sim": torch.randn(4, 1), "labels": torch.zeros(4, dtype=torch.long)}, "at least 2 classes"),
        ({"sim": torch.randn(0, 3), "labels": torch.zeros(0, dtype=torch.long)}, "empty"),
    ],
)
def test_attractive_repulsive_bad_input(kwargs, match):
    args = {"sim": sim, "labels": torch.tensor([0, 1, 2, 1]), "lam": 0.5, "repulsion": "logsumexp"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        losses.attractive_repulsive(**args)


@pytest.mark.parametrize("name", ["center", "cosine", "gaussian"])
@pytest.mark.parametrize("lam", [0.0, -0.2, 1.01])
def test_presets_reject_bad_lambda(name, lam):
    with pytest.raises(ValueError, match=r"lam must be a number in \(0, 1\]"):
        losses.build_loss(name, 3, 4, lam=lam)


@pytest.mark.parametrize("name", ["cce", "center", "cosine", "gaussian"])
def test_presets_reject_bad_batches(name):
    head = losses.build_loss(name, 3, 4)
    with pytest.raises(ValueError, match="feature dimension"):
        head(torch.randn(2, 5), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"labels must lie in 0\.\.2"):
        head(torch.randn(2, 4), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="int64"):
        head(torch.randn(2, 4), torch.tensor([0, 1], dtype=torch.int32))


def test_center_loss_term_bad_input():
    with pytest.raises(ValueError, match="labels must lie"):
        losses.center_loss_term(torch.randn(2, 3), torch.tensor([0, 5]), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="feature dimension"):
        losses.center_loss_term(torch.randn(2, 3), torch.tensor([0, 1]), torch.zeros(2, 4))
