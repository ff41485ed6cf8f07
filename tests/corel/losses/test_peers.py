"""pytorch-metric-learning's losses inside corel: the same loss and gradients as its objects.

Each corel head is given the embeddings, labels and class (proxy) matrix of a
pytorch-metric-learning object with the same parameters, in float64; the loss values and
the gradients with respect to the embeddings and the matrix must agree.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from corel.loss_catalog import DECLARATIONS, PEER_LOSSES
from corel.losses import build_loss
from corel.models import Classifier

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels

K, H, N = 5, 16, 40


def _batch(seed: int, spread: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, K, (N,), generator=g)
    # clustered a little by class, so that mined triplets and margins are of every kind
    centers = torch.randn(K, H, generator=g, dtype=torch.float64)
    h = centers[labels] * spread + torch.randn(N, H, generator=g, dtype=torch.float64)
    return h, labels


def _pml_object(name: str, params: dict):
    if name == "arcface":
        return pml_losses.ArcFaceLoss(K, H, margin=params["margin"], scale=params["scale"])
    if name == "cosface":
        return pml_losses.CosFaceLoss(K, H, margin=params["margin"], scale=params["scale"])
    if name == "normsoftmax":
        return pml_losses.NormalizedSoftmaxLoss(K, H, temperature=params["temperature"])
    if name == "proxyanchor":
        return pml_losses.ProxyAnchorLoss(K, H, margin=params["margin"], alpha=params["scale"])
    if name == "supcon":
        return pml_losses.SupConLoss(temperature=params["temperature"])
    if name == "triplet":
        return pml_losses.TripletMarginLoss(margin=params["margin"])
    if name == "multisimilarity":
        return pml_losses.MultiSimilarityLoss(alpha=params["scale"], beta=params["scale_neg"],
                                              base=params["margin"])
    raise AssertionError(name)


def _defaults(name: str) -> dict:
    return {o.field: o.default for o in DECLARATIONS[name].options}


# Each loss at pytorch-metric-learning's defaults and at other values of its parameters.
CASES = [(name, _defaults(name)) for name in PEER_LOSSES] + [
    ("arcface", {"margin": 10.0, "scale": 8.0}),
    ("arcface", {"margin": 80.0, "scale": 30.0}),  # past pi - margin: the linear branch
    ("cosface", {"margin": 0.1, "scale": 16.0}),
    ("normsoftmax", {"temperature": 0.5}),
    ("proxyanchor", {"margin": 0.3, "scale": 4.0}),
    ("supcon", {"temperature": 0.5}),
    ("triplet", {"margin": 0.3, "miner": "none"}),
    ("triplet", {"margin": 0.5, "miner": "all"}),
    ("triplet", {"margin": 0.5, "miner": "hard"}),
    ("triplet", {"margin": 0.2, "miner": "semihard"}),
    ("multisimilarity", {"scale": 1.0, "scale_neg": 10.0, "margin": 0.2}),
]


def test_every_peer_loss_is_tested():
    assert {name for name, _ in CASES} == set(PEER_LOSSES)
    assert len(PEER_LOSSES) == 7


@pytest.mark.parametrize(("name", "params"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_loss_and_gradients_as_pytorch_metric_learning(name, params, seed):
    torch.manual_seed(seed)
    head = build_loss(name, K, H, **params).double()
    h, labels = _batch(seed, spread=0.7)
    pml = _pml_object(name, params).double()
    has_matrix = DECLARATIONS[name].class_vectors
    if has_matrix:  # the same class (proxy) matrix on both sides; pml's W is (H, K)
        with torch.no_grad():
            if name == "proxyanchor":
                pml.proxies.copy_(head.W)
            else:
                pml.W.copy_(head.W.T)

    h_ours = h.clone().requires_grad_(True)
    ours = head(h_ours, labels)
    ours.backward()

    h_theirs = h.clone().requires_grad_(True)
    if name == "triplet" and params["miner"] != "none":
        miner = pml_miners.TripletMarginMiner(margin=params["margin"], type_of_triplets=params["miner"])
        theirs = pml(h_theirs, labels, miner(h_theirs, labels))
    else:
        theirs = pml(h_theirs, labels)
    theirs.backward()

    assert ours.dtype == torch.float64
    assert float(theirs.detach()) != 0.0  # a loss to compare, not two zeros
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(h_ours.grad, h_theirs.grad, rtol=1e-9, atol=1e-12)
    if has_matrix:
        theirs_w = pml.proxies.grad if name == "proxyanchor" else pml.W.grad.T
        torch.testing.assert_close(head.W.grad, theirs_w, rtol=1e-9, atol=1e-12)


def test_triplet_miner_changes_what_trains():
    """The miner is really applied: semihard and hard differ from all triplets."""
    h, labels = _batch(3, spread=0.7)
    values = {m: float(build_loss("triplet", K, H, margin=0.5, miner=m).double()(h, labels))
              for m in ("none", "semihard", "hard")}
    assert len({round(v, 12) for v in values.values()}) == 3


def test_class_mean_heads_predict_with_the_training_means():
    """A pair-based head's W is the class means of the unit-length representations."""
    torch.manual_seed(0)
    head = build_loss("supcon", K, H).double()
    assert "W" not in dict(head.named_parameters()) and "W" in dict(head.named_buffers())
    h, labels = _batch(4, spread=3.0)
    head.set_class_means(h, labels)
    unit = torch.nn.functional.normalize(h, dim=1)
    for k in range(K):
        torch.testing.assert_close(head.W[k], unit[labels == k].mean(0))
    classifier = Classifier(torch.nn.Identity(), head)
    assert classifier.predict(h).classes.eq(labels).double().mean() > 0.9


@pytest.mark.parametrize("name", PEER_LOSSES)
def test_each_peer_loss_trains_resumes_and_serves(name):
    """A few epochs on digits: it learns, its best checkpoint serves the same predictions
    (class means included), and its spec says which rule predicts."""
    from corel.data import load_dataset
    from corel.export import export
    from corel.serving import ServedModel
    from corel.spec import ExperimentSpec
    from corel.train import checkpoint_from_bytes, checkpoint_to_bytes, fit

    spec = ExperimentSpec(dataset="digits", loss=name, epochs=4, lr=3e-3, batch_size=64, seed=0)
    data = load_dataset(spec)
    result = fit(spec, data=data, chance_epochs=0)
    assert result.best_val_accuracy > 0.5, (name, result.best_val_accuracy)
    head = result.model.head
    if not DECLARATIONS[name].class_vectors:
        assert head.uses_class_means and float(head.W.abs().sum()) > 0
    ckpt = checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    served = ServedModel.from_checkpoint(ckpt)
    want = result.model.predict(data.x_test).classes
    got = served.model.predict(data.x_test).classes
    assert torch.equal(want, got)
    assert len(export(ckpt, "torchscript")) > 0


def test_the_cli_trains_a_peer_loss_with_its_options(tmp_path, capsys):
    from corel.cli import main
    from corel.train import checkpoint_from_bytes

    out = tmp_path / "triplet.pt"
    assert main(["train", "--dataset", "digits", "--loss", "triplet", "--margin", "0.1",
                 "--miner", "hard", "--epochs", "2", "--lr", "0.003", "--no-progress",
                 "--checkpoint", str(out)]) == 0
    ckpt = checkpoint_from_bytes(out.read_bytes())
    spec = json.loads(ckpt["spec"])
    assert (spec["loss"], spec["margin"], spec["miner"]) == ("triplet", 0.1, "hard")
    assert "kmeans (cosine)" in capsys.readouterr().out


@pytest.mark.parametrize("miner", ["none", "all", "hard", "semihard"])
def test_triplet_at_a_training_batch_equals_the_dense_triplets(miner):
    """At batch 128 over 4 classes (hundreds of thousands of triplets), the counted form
    equals summing the (B, B, B) violations, loss and gradient (float64)."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 4, (128,), generator=g)
    h = (torch.randn(128, 16, generator=g, dtype=torch.float64) + 2 * torch.eye(4, 16, dtype=torch.float64)[labels])
    margin = 0.2
    h_ours = h.clone().requires_grad_(True)
    ours = build_loss("triplet", 4, 16, margin=margin, miner=miner).double()(h_ours, labels)
    ours.backward()

    h_dense = h.clone().requires_grad_(True)
    unit = F.normalize(h_dense, dim=1)
    dist = torch.cdist(unit, unit)
    same = labels[:, None] == labels[None, :]
    pos, neg = same & ~torch.eye(128, dtype=torch.bool), ~same
    ap, an = dist.unsqueeze(2), dist.unsqueeze(1)
    gap = (an - ap).detach()
    kept = pos.unsqueeze(2) & neg.unsqueeze(1)
    if miner != "none":
        kept &= gap <= margin
        kept &= (gap <= 0) if miner == "hard" else (gap > 0) if miner == "semihard" else kept
    violation = F.relu(ap - an + margin) * kept
    dense = violation.sum() / (violation > 0).sum()
    dense.backward()
    assert int((violation > 0).sum()) > 1000
    torch.testing.assert_close(ours, dense, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(h_ours.grad, h_dense.grad, rtol=1e-9, atol=1e-12)


# --- a member of a stack: the loss of a fixed shape, each member's options its own ----------

# Three members a loss, each with its own options (the defaults, CASES' values and others).
MEMBERS = {
    "arcface": [{"margin": 28.6, "scale": 64.0}, {"margin": 10.0, "scale": 8.0}, {"margin": 80.0, "scale": 30.0}],
    "cosface": [{"margin": 0.35, "scale": 64.0}, {"margin": 0.1, "scale": 16.0}, {"margin": 0.0, "scale": 30.0}],
    "normsoftmax": [{"temperature": 0.05}, {"temperature": 0.5}, {"temperature": 0.2}],
    "proxyanchor": [{"margin": 0.1, "scale": 32.0}, {"margin": 0.3, "scale": 4.0}, {"margin": 0.0, "scale": 16.0}],
    "supcon": [{"temperature": 0.1}, {"temperature": 0.5}, {"temperature": 0.07}],
    "multisimilarity": [{"scale": 2.0, "scale_neg": 50.0, "margin": 0.5},
                        {"scale": 1.0, "scale_neg": 10.0, "margin": 0.2},
                        {"scale": 4.0, "scale_neg": 20.0, "margin": -0.1}],
    # the miner is a name a stack shares; the margins are each member's own
    # (a margin of 0 where the miner keeps triplets at it: "hard" counts an < ap there, not <=)
    **{f"triplet-{miner}": [{"margin": 0.05, "miner": miner}, {"margin": 0.3, "miner": miner},
                            {"margin": 0.0 if miner != "semihard" else 0.15, "miner": miner}]
       for miner in ("none", "all", "hard", "semihard")},
}


def _functional(name: str):
    """The loss as a function of one member's (h, W, labels) and its options as 0-d tensors,
    as a stack would call it under torch.vmap."""
    from corel import similarity
    from corel.losses import peers

    def unit_pairs(h):
        unit = torch.nn.functional.normalize(h, dim=1, eps=1e-12)
        return unit @ unit.T

    def mined(miner: str):
        return lambda h, W, y, margin: peers.triplet_loss(
            torch.nn.functional.normalize(h, dim=1, eps=1e-12), y, margin, miner)

    return {
        "arcface": lambda h, W, y, margin, scale: peers.arcface_loss(
            similarity.cosine(h, W), y, margin * (math.pi / 180.0), scale),
        "cosface": lambda h, W, y, margin, scale: peers.cosface_loss(similarity.cosine(h, W), y, margin, scale),
        "normsoftmax": lambda h, W, y, temperature: peers.normsoftmax_loss(similarity.cosine(h, W), y, temperature),
        "proxyanchor": lambda h, W, y, margin, scale: peers.proxyanchor_loss(
            similarity.cosine(h, W), y, margin, scale),
        "supcon": lambda h, W, y, temperature: peers.supcon_loss(unit_pairs(h), y, temperature),
        "multisimilarity": lambda h, W, y, scale, scale_neg, margin: peers.multisimilarity_loss(
            unit_pairs(h), y, scale, scale_neg, margin),
        **{f"triplet-{miner}": mined(miner) for miner in ("none", "all", "hard", "semihard")},
    }[name]


def test_every_peer_loss_is_tested_as_a_member():
    assert {name.split("-")[0] for name in MEMBERS} == set(PEER_LOSSES)


@pytest.mark.parametrize("own_labels", [False, True], ids=["shared-batches", "own-batches"])
@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_a_member_under_vmap_with_its_own_options_equals_the_loss_alone(name, own_labels):
    """Issue 70's first step: each peer loss is of a fixed shape (no branch on a tensor's
    value), so torch.vmap runs M members at once, each with its own options (as a stack's
    lambdas), on the same batch or on its own seed's; each member's loss and gradients are
    the loss alone's, in float64."""
    members, loss = MEMBERS[name], name.split("-")[0]
    M = len(members)
    g = torch.Generator().manual_seed(7)
    labels = torch.stack([_batch(seed, spread=0.7)[1] for seed in range(M)]) if own_labels \
        else _batch(0, spread=0.7)[1]
    h = torch.stack([_batch(seed, spread=0.7)[0] for seed in range(M)])
    W = torch.randn(M, K, H, generator=g, dtype=torch.float64)
    fields = [f for f in members[0] if f != "miner"]
    options = [torch.tensor([m[f] for m in members], dtype=torch.float64) for f in fields]

    h_stack, W_stack = h.clone().requires_grad_(True), W.clone().requires_grad_(True)
    stacked = torch.vmap(_functional(name), in_dims=(0, 0, 0 if own_labels else None, *[0] * len(fields)))(
        h_stack, W_stack, labels, *options)
    stacked.sum().backward()

    for i, opts in enumerate(members):
        head = build_loss(loss, K, H, **opts).double()
        if DECLARATIONS[loss].class_vectors:
            with torch.no_grad():
                head.W.copy_(W[i])
        h_alone = h[i].clone().requires_grad_(True)
        alone = head(h_alone, labels[i] if own_labels else labels)
        alone.backward()
        assert float(alone.detach()) != 0.0
        torch.testing.assert_close(stacked[i], alone, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(h_stack.grad[i], h_alone.grad, rtol=1e-10, atol=1e-14)
        if DECLARATIONS[loss].class_vectors:
            torch.testing.assert_close(W_stack.grad[i], head.W.grad, rtol=1e-10, atol=1e-14)
        else:
            assert W_stack.grad is None  # a pair-based loss has no class vectors to train


def test_a_batch_without_pairs_or_triplets_is_zero_with_zero_gradients():
    """Where a Python branch returned 0 (no positive pair, no kept triplet), the fixed-shape
    forms give 0 as well, with the graph kept and zero gradients."""
    h = torch.randn(4, H, dtype=torch.float64, requires_grad=True)
    labels = torch.arange(4)  # every row its own class: no positive pair
    for name, opts in (("supcon", {}), ("triplet", {"miner": "none"}), ("triplet", {"miner": "semihard"})):
        loss = build_loss(name, K, H, **opts).double()(h, labels)
        assert float(loss.detach()) == 0.0, name
        (grad,) = torch.autograd.grad(loss, h)
        assert not grad.any(), name


@pytest.mark.parametrize("name", PEER_LOSSES)
def test_a_peer_head_s_repr_names_its_options(name):
    """A model's printout says which options its head trains with (each loss at a value that
    is not its default)."""
    options = {o.field: (o.choices[0] if o.choices else (o.default + (o.high - o.default) / 2))
               for o in DECLARATIONS[name].options}
    head = build_loss(name, K, H, **options)
    for option in DECLARATIONS[name].options:
        value = options[option.field]
        assert f"{option.field}={value if option.choices else float(value)}" in repr(head), repr(head)
