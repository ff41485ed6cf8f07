"""The few-shot protocol (corel.fewshot): its draws are reproducible, balanced and disjoint
from the evaluation rows; bad requests say what is allowed; a method's draws trained as one
stack end as each trained alone; each row of the report is what the method gives trained
alone on that draw, and the summary's figures are those of a direct computation (mean, sd,
paired t-test by its formula)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from scipy.stats import t as student_t
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from corel.fewshot import (
    PROBE,
    SELFTRAIN,
    HeadSettings,
    SelfTrainSettings,
    class_vector_decay,
    draw_splits,
    run_fewshot,
    self_train,
    train_head,
    train_heads,
)
from corel.losses import LOSSES

# The tests whose figures come out of torch's and MKL's kernels (the heads, the fine-tune)
# are marked: make test runs them once more on other kernels. The draws, the refusals and
# self-training (numpy and scikit-learn) are kernel-free and run once.
KERNELS = pytest.mark.kernels


@pytest.fixture(scope="module")
def digits():
    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def test_draws_are_reproducible_balanced_and_disjoint_from_the_evaluation_rows(digits):
    _, y = digits
    rows = draw_splits(y, shots=(2, 8), splits=4, seed=3)
    again = draw_splits(y, shots=(8,), splits=4, seed=3)  # the other N not asked
    other = draw_splits(y, shots=(2, 8), splits=4, seed=4)
    assert np.intersect1d(rows.pool, rows.evaluation).size == 0
    assert len(rows.pool) + len(rows.evaluation) == len(y)
    assert np.array_equal(np.sort(np.concatenate([rows.pool, rows.evaluation])), np.arange(len(y)))
    for k in range(10):  # each class half held out for evaluation (rounded down)
        assert (y[rows.evaluation] == k).sum() == (y == k).sum() // 2
    for n, draws in rows.draws.items():
        assert len(draws) == 4 and len({tuple(d) for d in draws}) == 4  # four different draws
        for d in draws:
            assert np.isin(d, rows.pool).all() and len(np.unique(d)) == len(d)
            assert np.array_equal(np.bincount(y[d], minlength=10), np.full(10, n))
    assert all(np.array_equal(a, b) for a, b in zip(rows.draws[8], again.draws[8], strict=True))
    assert np.array_equal(rows.evaluation, again.evaluation)
    assert not np.array_equal(rows.evaluation, other.evaluation)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"shots": (8, 200)}, r"200 shots per class: class 'c\d' has \d+ rows in the pool \(\d+ in all, \d+ held "
                          r"out for evaluation\); allowed: at most \d+ shots"),
    ({"splits": 0}, "splits must be an integer from 1 to 100; got 0"),
    ({"splits": 101}, "splits must be an integer from 1 to 100; got 101"),
    ({"shots": ()}, "shots must be a non-empty list of positive integers"),
    ({"shots": (0, 8)}, "shots must be a non-empty list of positive integers"),
    ({"shots": (8, 8)}, "shots must not repeat a number"),
])
def test_a_bad_request_says_what_is_allowed(digits, kwargs, words):
    _, y = digits
    with pytest.raises(ValueError, match=words):
        draw_splits(y, class_names=[f"c{k}" for k in range(10)], **kwargs)


def test_the_class_too_small_for_n_is_named_with_its_size(digits):
    _, y = digits
    smallest = int(np.argmin(np.bincount(y)))
    total = int((y == smallest).sum())
    pool = total - total // 2
    with pytest.raises(ValueError, match=rf"class 'c{smallest}' has {pool} rows in the pool \({total} in all"):
        draw_splits(y, shots=(pool + 1,), class_names=[f"c{k}" for k in range(10)])


def test_one_class_is_refused(digits):
    with pytest.raises(ValueError, match="at least two classes; the data has one"):
        draw_splits(np.zeros(40, dtype=np.int64), shots=(2,))


@KERNELS
def test_each_result_is_the_method_trained_alone_and_the_summary_is_computed_as_defined(digits):
    """Each draw's figure is the method trained on that draw alone: scikit-learn's probe
    fitted directly, train_head called directly; the summary is computed from the figures as
    its docstring defines it."""
    x, y = digits
    settings = HeadSettings(steps=30)
    report = run_fewshot(x, y, methods=[PROBE, "normsoftmax", "gaussian"], shots=(4,), splits=3, seed=5,
                         settings=settings)
    rows = draw_splits(y, shots=(4,), splits=3, seed=5)
    ev = rows.evaluation
    direct: dict[str, list[float]] = {PROBE: [], "normsoftmax": [], "gaussian": []}
    for s, train in enumerate(rows.draws[4]):
        probe = LogisticRegression(max_iter=100, random_state=5).fit(x[train], y[train])
        direct[PROBE].append(float((probe.predict(x[ev]) == y[ev]).mean()))
        for loss in ("normsoftmax", "gaussian"):
            fitted = train_head(loss, torch.from_numpy(x[train]), torch.from_numpy(y[train]), 10, settings,
                                seed=5 * 1000 + s)
            direct[loss].append(float((fitted(torch.from_numpy(x[ev])).numpy() == y[ev]).mean()))
    # The probe is the same call; a head's draws trained as one stack round as a batch does
    # (float32): a row or two of the evaluation may fall the other way.
    assert report.accuracies(PROBE, 4).tolist() == direct[PROBE]
    for method in ("normsoftmax", "gaussian"):
        np.testing.assert_allclose(report.accuracies(method, 4), direct[method], rtol=0, atol=2.5 / len(ev))
    measured = {m: report.accuracies(m, 4).tolist() for m in direct}
    best = max(measured, key=lambda m: statistics.fmean(measured[m]))
    assert report.best(4) == best
    assert min(statistics.fmean(a) for a in measured.values()) > 0.6  # 4 digits each: far above chance
    for row in report.summary():
        accs = measured[row["method"]]
        assert row["mean"] == pytest.approx(statistics.fmean(accs), abs=1e-12)
        assert row["sd"] == pytest.approx(statistics.stdev(accs), abs=1e-12)
        assert (row["min"], row["max"], row["splits"]) == (min(accs), max(accs), 3)
        d = [a - b for a, b in zip(accs, measured[best], strict=True)]
        assert row["diff"] == pytest.approx(statistics.fmean(d), abs=1e-12)
        if row["method"] == best or statistics.pstdev(d) == 0:
            assert row["p"] is None
        else:  # the paired t-test by its formula
            tt = statistics.fmean(d) / (statistics.stdev(d) / math.sqrt(len(d)))
            assert row["p"] == pytest.approx(2 * student_t.sf(abs(tt), len(d) - 1), rel=1e-9)
    assert f"N=4 per class ({len(ev)} evaluation rows)" in report.table()


def test_self_training_reads_the_pool_s_rows_unlabeled_and_its_figures_are_a_direct_computation(digits):
    """The self-trained method's figure on each draw is self_train called directly on the
    draw's shots and the pool's other rows (never an evaluation row, never their labels);
    with few shots it is above the probe on each draw (digits' classes are clusters of their
    pixels; its defaults were chosen for a sentence encoder's unit vectors), and it is
    reproducible."""
    x, y = digits
    report = run_fewshot(x, y, methods=[PROBE, SELFTRAIN], shots=(2,), splits=3, seed=7)
    rows = draw_splits(y, shots=(2,), splits=3, seed=7)
    ev = rows.evaluation
    direct = []
    for train in rows.draws[2]:
        unlabeled = np.setdiff1d(rows.pool, train)
        assert not np.intersect1d(unlabeled, ev).size and not np.intersect1d(unlabeled, train).size
        predict = self_train(x[train], y[train], x[unlabeled], 10, seed=7)
        direct.append(float((predict(x[ev]) == y[ev]).mean()))
    assert report.accuracies(SELFTRAIN, 2).tolist() == direct
    mine, probe = report.accuracies(SELFTRAIN, 2), report.accuracies(PROBE, 2)
    assert (mine > probe).all() and mine.mean() > probe.mean() + 0.02, report.table()
    again = run_fewshot(x, y, methods=[SELFTRAIN], shots=(2,), splits=3, seed=7)
    assert again.accuracies(SELFTRAIN, 2).tolist() == direct


def test_self_training_s_steps_are_the_ones_its_settings_name(digits):
    """No round moves the class vectors, every unlabeled row kept, one fit: the probe fitted
    on the shots and the unlabeled rows labelled by their nearest shots' class mean in
    cosine (the class vectors' start). One round: the rows labelled by the vectors moved once."""
    x, y = digits
    rng = np.random.default_rng(3)
    shots = np.concatenate([rng.choice(np.flatnonzero(y == k), 3, replace=False) for k in range(10)])
    rest = np.setdiff1d(np.arange(len(y)), shots)
    xs, ys, xu = x[shots].astype(np.float64), y[shots], x[rest].astype(np.float64)

    def unit(a):
        return a / np.linalg.norm(a, axis=1, keepdims=True)

    sums = np.stack([unit(xs)[ys == k].sum(0) for k in range(10)])
    nearest = (unit(xu) @ unit(sums).T).argmax(1)
    want = LogisticRegression(max_iter=100, random_state=0).fit(np.concatenate([xs, xu]),
                                                                np.concatenate([ys, nearest]))
    got = self_train(xs, ys, xu, 10, SelfTrainSettings(rounds=0, keep=1.0, refits=1))
    assert (got(x) == want.predict(x)).all()
    # One round at temperature 0.05: each class vector the unit sum of its shots and the rows
    # softly assigned to it; the rows labelled again by the moved vectors.
    logits = unit(xu) @ unit(sums).T / 0.05
    soft = np.exp(logits - logits.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    relabelled = (unit(xu) @ unit(soft.T @ unit(xu) + sums).T).argmax(1)
    assert (relabelled != nearest).any()  # the round moved a row: the test can tell
    want = LogisticRegression(max_iter=100, random_state=0).fit(np.concatenate([xs, xu]),
                                                                np.concatenate([ys, relabelled]))
    got = self_train(xs, ys, xu, 10, SelfTrainSettings(temperature=0.05, rounds=1, keep=1.0, refits=1))
    assert (got(x) == want.predict(x)).all()


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"temperature": 0.0}, "temperature must be a positive number"),
    ({"keep": 1.5}, "keep must be a fraction in \\(0, 1\\]"),
    ({"rounds": -1}, "rounds must be at least 0"),
    ({"refits": -1}, "refits must be at least 0"),
])
def test_bad_self_training_settings_say_what_is_allowed(kwargs, words, digits):
    with pytest.raises(ValueError, match=words):
        SelfTrainSettings(**kwargs)
    x, y = digits
    with pytest.raises(ValueError, match="self_train ends with a fit of the probe: refits must be at least 1"):
        self_train(x[:20], y[:20], x[20:40], 10, SelfTrainSettings(refits=0))


def test_self_training_without_unlabeled_rows_is_refused(digits):
    x, y = digits
    with pytest.raises(ValueError, match="self-training needs unlabeled rows"):
        self_train(x[:20], y[:20], x[:0], 10)


def test_bad_methods_and_settings_say_what_is_allowed(digits):
    x, y = digits
    with pytest.raises(ValueError, match="unknown method 'svm'; allowed: probe, selftrain, cce"):
        run_fewshot(x, y, methods=["svm"], shots=(2,), splits=1)
    with pytest.raises(ValueError, match="unknown layer 'mlp'; allowed: none, linear"):
        HeadSettings(layer="mlp")
    with pytest.raises(ValueError, match="l2 must be a number of at least 0 \\(0: no penalty\\); got -1"):
        HeadSettings(l2=-1)
    with pytest.raises(ValueError, match="l2 must be a number of at least 0 \\(0: no penalty\\); got nan"):
        class_vector_decay("cce", float("nan"), 10)


def test_the_class_vectors_penalty_is_the_probe_s_on_the_heads_whose_scores_grow_with_them():
    """l2 / n on the dot-product and Gaussian heads' class vectors; none on those that
    normalise them or have none."""
    assert class_vector_decay("cce", 1.0, 40) == class_vector_decay("center", 1.0, 40) == 1.0 / 40
    assert class_vector_decay("gaussian", 2.0, 40) == 2.0 / 40
    assert {class_vector_decay(loss, 1.0, 40) for loss in ("cosine", "arcface", "cosface", "normsoftmax",
                                                           "proxyanchor", "supcon", "triplet")} == {0.0}
    assert class_vector_decay("cce", 0.0, 40) == 0.0


@KERNELS
def test_cce_with_the_probe_s_penalty_reaches_the_probe_s_optimum(digits):
    """HeadSettings' l2=1 makes CCE's objective scikit-learn's LogisticRegression's at C=1
    (MTEB's probe): trained long enough in float64, its class vectors are the probe's
    coefficients, its objective the probe's, and it predicts every evaluation row as the
    probe does. Without the penalty it fits the shots elsewhere."""
    from sklearn.linear_model import LogisticRegression

    x, y = digits
    rows = draw_splits(y, shots=(10,), splits=1, seed=3)
    train, ev = rows.draws[10][0], rows.evaluation
    xt, yt = torch.from_numpy(x[train]).double(), torch.from_numpy(y[train])
    probe = LogisticRegression(C=1.0, tol=1e-12, max_iter=10_000).fit(x[train].astype(np.float64), y[train])

    def objective(w: np.ndarray, b: np.ndarray) -> float:
        z = x[train].astype(np.float64) @ w.T + b
        z -= z.max(1, keepdims=True)
        ce = -(z[np.arange(len(train)), y[train]] - np.log(np.exp(z).sum(1))).mean()
        return float(ce + (w ** 2).sum() / (2 * len(train)))

    rows_ev = torch.from_numpy(x[ev]).double()
    head = train_head("cce", xt, yt, 10, HeadSettings(steps=1000, lr=1e-2), seed=1)
    w, b = head.head.W.detach().numpy(), head.head.bias.detach().numpy()
    assert abs(w - probe.coef_).max() < 5e-3 * abs(probe.coef_).max()
    assert objective(w, b) == pytest.approx(objective(probe.coef_, probe.intercept_), abs=1e-6)
    assert np.array_equal(head(rows_ev).numpy(), probe.predict(x[ev].astype(np.float64)))
    free = train_head("cce", xt, yt, 10, HeadSettings(steps=1000, lr=1e-2, l2=0.0), seed=1)
    assert abs(free.head.W.detach().numpy() - probe.coef_).max() > 0.5
    with pytest.raises(ValueError, match="features must be \\(rows, width\\) with one label per row"):
        run_fewshot(x[:10], y, shots=(2,), splits=1)


@KERNELS
def test_the_cli_runs_the_protocol_on_every_row_of_a_dataset(capsys):
    import re

    from corel.cli import main
    from corel.data import load_dataset
    from corel.spec import ExperimentSpec

    assert main(["fewshot", "--dataset", "digits", "--shots", "4", "--splits", "2", "--methods",
                 "probe,selftrain,cosine", "--steps", "20"]) == 0
    out = capsys.readouterr().out
    assert "digits: 1797 rows, 10 classes, features of width 64" in out
    data = load_dataset(ExperimentSpec(dataset="digits"))
    x = torch.cat([data.x_train, data.x_val, data.x_test]).flatten(1).numpy()
    y = torch.cat([data.y_train, data.y_val, data.y_test]).numpy()
    report = run_fewshot(x, y, methods=[PROBE, SELFTRAIN, "cosine"], shots=(4,), splits=2,
                         settings=HeadSettings(steps=20))
    for row in report.summary():
        assert re.search(rf"{row['method']} +{100 * row['mean']:.1f} +{100 * row['sd']:.1f} ", out), out
    assert main(["fewshot", "--dataset", "digits", "--shots", "4,500", "--splits", "1"]) == 2
    assert "500 shots per class: class '" in capsys.readouterr().err


@KERNELS
@pytest.mark.parametrize("loss", list(LOSSES))
def test_a_method_s_draws_trained_as_one_stack_end_as_each_trained_alone(digits, loss):
    """float64, the draws' own rows and seeds: every parameter and buffer of each member's
    head, and its predictions, as train_head gives them alone (heads that cannot stack train
    one after another, and are the same trivially)."""
    x, y = digits
    rows = draw_splits(y, shots=(3,), splits=4, seed=1)
    xs = [torch.from_numpy(x[r]).double() for r in rows.draws[3]]
    ys = [torch.from_numpy(y[r]) for r in rows.draws[3]]
    settings = HeadSettings(steps=25, lr=3e-2)
    stacked = train_heads(loss, xs, ys, 10, settings, seeds=[7, 8, 9, 10])
    ev = torch.from_numpy(x[rows.evaluation]).double()
    for m, fitted in enumerate(stacked):
        alone = train_head(loss, xs[m], ys[m], 10, settings, seed=7 + m)
        mine, theirs = dict(fitted.head.state_dict()), dict(alone.head.state_dict())
        assert mine.keys() == theirs.keys()
        for name in mine:
            torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=1e-10)
        assert torch.equal(fitted(ev), alone(ev))
    # Training moved what it trains: the class vectors left the shots' class means.
    w = stacked[0].head.W
    if isinstance(w, torch.nn.Parameter):
        means = torch.stack([xs[0][ys[0] == k].mean(0) for k in range(10)])
        assert (w - means).abs().max() > 1e-3


# --- a few-shot member as a run (spec.fewshot: what a few-shot sweep's members are) --------

def test_a_member_s_data_is_its_draw_to_train_on_and_the_evaluation_rows_to_test_on():
    from corel.data import load_dataset
    from corel.fewshot import protocol_labels
    from corel.spec import ExperimentSpec

    whole = load_dataset(ExperimentSpec(dataset="digits"))
    x = torch.cat([whole.x_train, whole.x_val])
    y = torch.cat([whole.y_train, whole.y_val])
    positions = np.concatenate([whole.rows["train"], whole.rows["val"]])
    labels, names = protocol_labels(ExperimentSpec(dataset="digits", fewshot={"shots": 3, "split": 1, "seed": 2}))
    assert np.array_equal(labels, y.numpy()) and names == whole.class_names
    cut = draw_splits(labels, [3], 2, 2, names)
    member = load_dataset(ExperimentSpec(dataset="digits", fewshot={"shots": 3, "split": 1, "seed": 2}))
    shots, evaluation = cut.draws[3][1], cut.evaluation
    assert torch.equal(member.x_train, x[shots]) and torch.equal(member.y_train, y[shots])
    assert torch.equal(member.x_val, member.x_train) and torch.equal(member.y_val, member.y_train)
    assert torch.equal(member.x_test, x[evaluation]) and torch.equal(member.y_test, y[evaluation])
    assert np.bincount(member.y_train.numpy()).tolist() == [3] * 10
    assert np.array_equal(member.rows["train"], positions[shots])
    assert np.array_equal(member.rows["test"], positions[evaluation])
    assert np.intersect1d(member.rows["train"], member.rows["test"]).size == 0


@KERNELS
def test_a_member_with_the_unlabeled_rows_trains_on_its_shots_and_the_pool_rows_pseudo_labels_keeps():
    """fewshot.unlabeled: the member trains on its shots and the pool's other rows that
    pseudo_labels keeps (called directly, on the shots' labels alone), with its labels;
    validates on the shots; tests on the evaluation rows, none of which it reads. A head
    trained on that is above the same head on the shots alone (digits' classes are clusters)."""
    from corel.data import load_dataset
    from corel.data.fewshot import pseudo_labels
    from corel.spec import ExperimentSpec

    whole = load_dataset(ExperimentSpec(dataset="digits"))
    x = torch.cat([whole.x_train, whole.x_val])
    y = torch.cat([whole.y_train, whole.y_val])
    positions = np.concatenate([whole.rows["train"], whole.rows["val"]])
    draw = {"shots": 3, "split": 1, "seed": 2}
    member = load_dataset(ExperimentSpec(dataset="digits", fewshot={**draw, "unlabeled": True}))
    alone = load_dataset(ExperimentSpec(dataset="digits", fewshot=draw))
    cut = draw_splits(y.numpy(), [3], 2, 2, whole.class_names)
    shots, evaluation = cut.draws[3][1], cut.evaluation
    others = np.setdiff1d(cut.pool, shots)
    flat = x.flatten(1).double().numpy()
    kept, labels = pseudo_labels(flat[shots], y[shots].numpy(), flat[others], 10, seed=2)
    assert 0.5 * len(others) < len(kept) < len(others)  # each class's most confident 80 %
    trained = np.concatenate([shots, others[kept]])
    assert torch.equal(member.x_train, x[trained])
    assert member.y_train.tolist() == y[shots].tolist() + labels.tolist()
    assert (labels == y[others[kept]].numpy()).mean() > 0.8  # mostly right: a real signal, not noise
    assert torch.equal(member.x_val, alone.x_train) and torch.equal(member.y_val, alone.y_train)
    assert torch.equal(member.x_test, x[evaluation]) and torch.equal(member.y_test, y[evaluation])
    assert np.array_equal(member.rows["train"], positions[trained])
    assert np.intersect1d(member.rows["train"], member.rows["test"]).size == 0
    accuracy = {}
    for name, data in (("with", member), ("alone", alone)):
        fitted = train_head("cce", data.x_train.flatten(1), data.y_train, 10, HeadSettings(), seed=1)
        accuracy[name] = float((fitted(data.x_test.flatten(1)) == data.y_test).float().mean())
    assert accuracy["with"] > accuracy["alone"] + 0.02, accuracy


@KERNELS
@pytest.mark.parametrize("loss", ["cosine", "arcface", "center", "gaussian"])
def test_a_member_trained_as_a_run_ends_as_the_protocol_s_head_trained_alone(loss):
    """fit() on a member's spec (what a worker runs for a few-shot sweep) keeps its last epoch,
    as train_head does, from the same initial head (the draw's seed, class vectors at the shots'
    class means, the draw's penalty on them where the head has one): in float64, the same class
    vectors to 1e-10 and the same test accuracy."""
    from corel.data import load_dataset
    from corel.spec import ExperimentSpec
    from corel.train import fit

    spec = ExperimentSpec(dataset="digits", loss=loss, fewshot={"shots": 4, "split": 2, "seed": 1,
                                                                "l2": HeadSettings().l2},
                          epochs=30, lr=1e-2, batch_size=65_536, seed=1002)
    data = load_dataset(spec).astype(torch.float64)
    result = fit(spec, data=data, chance_epochs=0)
    assert result.best_epoch == 30
    alone = train_head(loss, data.x_train.flatten(1), data.y_train, 10, HeadSettings(steps=30), seed=1002)
    run_w = result.run.model.head.W.detach()
    assert not torch.allclose(run_w, torch.zeros_like(run_w))
    assert torch.allclose(run_w, alone.head.W.detach(), atol=1e-10, rtol=0)
    right = int((alone(data.x_test.flatten(1)) == data.y_test).sum())
    assert round(result.test_accuracy * len(data.y_test)) == right  # the same rows right


def test_a_member_spec_refuses_what_the_protocol_sets_or_cannot_do():
    from corel.spec import ExperimentSpec

    with pytest.raises(ValueError, match="train_subset does not apply to a few-shot member"):
        ExperimentSpec(dataset="digits", train_subset=50, fewshot={"shots": 2, "split": 0})
    with pytest.raises(ValueError, match="model 'cnn': a few-shot member is a head over the inputs"):
        ExperimentSpec(dataset="digits", model="cnn", fewshot={"shots": 2, "split": 0})
    with pytest.raises(ValueError, match="split"):
        ExperimentSpec(dataset="digits", fewshot={"shots": 2, "split": 100})


@pytest.fixture(scope="module")
def topics(tmp_path_factory):
    """Texts of three topics (each sentence five times, numbered) and a small sentence-transformers
    model of two blocks."""
    from tests.encoder_files import TOPICS, tiny_sentence_transformer

    texts, y = [], []
    for k, sentences in enumerate(TOPICS.values()):
        for i in range(20):
            texts.append(f"{sentences[i % 4]} ({i})")
            y.append(k)
    return texts, np.array(y), tiny_sentence_transformer(tmp_path_factory.mktemp("fewshot-st") / "st")


@KERNELS
def test_an_untrained_fine_tune_scores_as_the_pretrained_encoder_s_nearest_class_mean(topics):
    from sentence_transformers import SentenceTransformer

    from corel.encoders.finetune import FrozenOutputs
    from corel.fewshot import TuneSettings, finetune_fewshot

    texts, y, folder = topics
    rows = draw_splits(y, shots=(2, 4), splits=3, seed=5)
    kept = FrozenOutputs()
    got = finetune_fewshot(texts, y, rows, [2, 4], encoder="sentence-transformers", encoder_path=folder,
                           settings=TuneSettings(blocks=1, steps=0), kept=kept)
    assert [(r.method, r.shots, r.split) for r in got] == [("finetune-cosine", n, s) for n in (2, 4) for s in range(3)]
    # Directly: the pretrained model's vectors, each draw's class means, the nearest by cosine.
    h = torch.as_tensor(SentenceTransformer(str(folder), device="cpu", local_files_only=True)
                        .encode(texts, convert_to_numpy=True))
    h = torch.nn.functional.normalize(h, dim=1)
    for r in got:
        train = rows.draws[r.shots][r.split]
        means = torch.stack([h[train][y[train] == k].mean(0) for k in range(3)])
        guessed = (h[rows.evaluation] @ torch.nn.functional.normalize(means, dim=1).T).argmax(1).numpy()
        assert r.accuracy == pytest.approx(float((guessed == y[rows.evaluation]).mean()), abs=1.5 / len(rows.evaluation))
    # The frozen block's output of each row was computed once, for all six draws.
    used = np.unique(np.concatenate([rows.evaluation, *rows.draws[2], *rows.draws[4]]))
    assert kept.computed == len({texts[i] for i in used})


@KERNELS
def test_a_fine_tuned_draw_trains_its_last_blocks_and_is_reproducible_by_seed(topics):
    from corel.fewshot import FewShotReport, FewShotResult, TuneSettings, finetune_fewshot

    texts, y, folder = topics
    rows = draw_splits(y, shots=(4,), splits=2, seed=1)
    settings = TuneSettings(blocks=1, steps=20, encoder_lr=1e-2)
    run = [finetune_fewshot(texts, y, rows, [4], encoder="sentence-transformers", encoder_path=folder,
                            settings=settings) for _ in range(2)]
    still = finetune_fewshot(texts, y, rows, [4], encoder="sentence-transformers", encoder_path=folder,
                             settings=TuneSettings(blocks=1, steps=0))
    assert [r.accuracy for r in run[0]] == [r.accuracy for r in run[1]]  # the same seed, the same figures
    assert [r.accuracy for r in run[0]] != [r.accuracy for r in still]  # the steps moved the block
    # The second draw alone (a long comparison run a few draws at a time) is that draw of the whole run.
    later = finetune_fewshot(texts, y, rows, [4], encoder="sentence-transformers", encoder_path=folder,
                             settings=settings, first=1)
    assert [(r.split, r.accuracy) for r in later] == [(1, run[0][1].accuracy)]
    with pytest.raises(ValueError, match="first must be a draw's index, at least 0; got -1"):
        finetune_fewshot(texts, y, rows, [4], encoder="sentence-transformers", encoder_path=folder, first=-1)
    # A method run on fewer draws is paired with the others on the draws both ran.
    probe = [FewShotResult(PROBE, 4, s, 1.0, 0.0) for s in range(2)]
    report = FewShotReport([*probe, run[0][0]], evaluation_rows=len(rows.evaluation))
    assert report.best(4) == PROBE
    row = next(r for r in report.summary() if r["method"] == "finetune-cosine")
    assert row["splits"] == 1 and row["p"] is None
    assert row["diff"] == pytest.approx(run[0][0].accuracy - 1.0)


@pytest.mark.parametrize(("fields", "words"), [
    ({"loss": "nope"}, "unknown loss 'nope'; allowed: "),
    ({"blocks": 0}, "blocks must be at least 1; got 0"),
    ({"steps": -1}, "steps must be at least 0; got -1"),
    ({"encoder_lr": 0.0}, "encoder_lr must be a positive number; got 0.0"),
])
def test_bad_fine_tuning_settings_say_what_is_allowed(fields, words):
    from corel.fewshot import TuneSettings

    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        TuneSettings(**fields)


def test_a_member_whose_class_vectors_decay_trains_alone_and_the_others_still_stack():
    """A decayed member's optimiser has a group of its own for its class vectors, which a
    stack's one Adam does not hold: group_key keeps it alone; a cosine head's draw (no decay
    on its vectors) and a member without l2 group as before."""
    from corel.spec import ExperimentSpec
    from corel.train import group_key

    draw = {"shots": 4, "split": 0, "seed": 1, "l2": 1.0}
    assert group_key(ExperimentSpec(dataset="digits", loss="cce", fewshot=draw)) is None
    assert group_key(ExperimentSpec(dataset="digits", loss="gaussian", fewshot=draw)) is None
    cosine = [ExperimentSpec(dataset="digits", loss="cosine", lam=lam, fewshot=draw) for lam in (0.5, 0.7)]
    assert group_key(cosine[0]) is not None and group_key(cosine[0]) == group_key(cosine[1])
    assert group_key(ExperimentSpec(dataset="digits", loss="cce", fewshot={**draw, "l2": 0.0})) is not None
    with pytest.raises(ValueError, match="l2"):
        ExperimentSpec(dataset="digits", loss="cce", fewshot={**draw, "l2": -1.0})


def test_setfit_s_schedule_draws_each_shot_once_a_pass_and_warms_up_then_decays():
    from corel.fewshot import minibatches, warmup_linear

    steps = minibatches(10, 4, 6, seed=3)
    assert [len(idx) for idx in steps] == [4] * 6
    flat = torch.cat(steps).tolist()  # 24 rows: two whole passes over the 10, then 4 of a third
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert len(set(flat[20:])) == 4
    assert [i.tolist() for i in minibatches(10, 4, 6, seed=3)] == [i.tolist() for i in steps]  # by seed
    assert [i.tolist() for i in minibatches(10, 4, 6, seed=4)] != [i.tolist() for i in steps]
    assert all(i.tolist() == list(range(10)) for i in minibatches(10, None, 3, seed=3))
    assert all(i.tolist() == list(range(10)) for i in minibatches(10, 16, 3, seed=3))
    # 20 steps, 2 of warm-up: 0.5, 1, then down by 1/18 a step to 1/18 at the last.
    factor = warmup_linear(20, 0.1)
    assert [factor(i) for i in (0, 1, 2, 19)] == pytest.approx([0.5, 1.0, 1.0, 1 / 18])
    assert all(factor(i) > factor(i + 1) for i in range(2, 19))
    assert warmup_linear(20, None)(7) == 1.0


@KERNELS
def test_a_fine_tune_on_setfit_s_schedule_is_reproducible_and_its_full_batch_form_is_adam_s(topics):
    """The schedule trains (the figures move from the untrained ones), reproduces itself by
    seed, and a batch holding every shot with no warm-up left is the full-batch run."""
    from corel.fewshot import TuneSettings, finetune_fewshot

    texts, y, folder = topics
    rows = draw_splits(y, shots=(4,), splits=2, seed=1)

    def run(**fields):
        settings = TuneSettings(blocks=1, steps=20, encoder_lr=1e-2, **fields)
        return [r.accuracy for r in finetune_fewshot(texts, y, rows, [4], encoder="sentence-transformers",
                                                      encoder_path=folder, settings=settings)]

    scheduled = run(batch=4, warmup=0.1)
    assert scheduled == run(batch=4, warmup=0.1)
    untrained = finetune_fewshot(texts, y, rows, [4], encoder="sentence-transformers", encoder_path=folder,
                                 settings=TuneSettings(blocks=1, steps=0))
    assert scheduled != [r.accuracy for r in untrained]
    assert run(batch=12) == run()  # 3 classes x 4 shots: every shot every step, Adam as before


@pytest.mark.parametrize(("fields", "words"), [
    ({"batch": 0}, "batch must be at least 1 (or None: every shot every step); got 0"),
    ({"warmup": 1.0}, "warmup must be a fraction of the steps, at least 0 and under 1"),
    ({"average": 1.0}, "average must be the fraction of the steps after which the weights are averaged"),
    ({"average": -0.1}, "average must be the fraction of the steps after which the weights are averaged"),
])
def test_a_bad_schedule_says_what_is_allowed(fields, words):
    from corel.fewshot import TuneSettings

    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        TuneSettings(**fields)


@KERNELS
def test_averaged_weights_end_as_the_mean_of_each_step_s_weights_from_that_fraction_on():
    """``average=0.5``: the same steps as without it (the averaging moves no step), and the
    blocks' and the head's weights end as the mean of their values after each of the last
    half of the steps, computed here from a hook on the optimiser; float64."""
    from corel.fewshot import TuneSettings, _scheduled_steps
    from corel.losses import build_loss

    generator = torch.Generator().manual_seed(2)
    x = torch.randn(12, 5, generator=generator, dtype=torch.float64)
    y = torch.arange(12) % 3

    def trained(average: float | None) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 4).double()
        head = build_loss("cosine", 3, 4).double()
        params = [*model.parameters(), *head.parameters()]
        optimizer = torch.optim.AdamW(params, lr=0.05)
        seen: list[list[torch.Tensor]] = []
        optimizer.register_step_post_hook(lambda *_: seen.append([p.detach().clone() for p in params]))
        _scheduled_steps(model, x, y, head, optimizer, TuneSettings(steps=10, batch=4, warmup=0.1,
                                                                    average=average), seed=7)
        return [p.detach().clone() for p in params], seen

    last, steps = trained(None)
    averaged, same = trained(0.5)
    assert all(torch.equal(a, b) for a, b in zip(last, steps[-1], strict=True))
    assert all(torch.equal(a, b) for s, t in zip(steps, same, strict=True) for a, b in zip(s, t, strict=True))
    for i, p in enumerate(averaged):
        expected = torch.stack([s[i] for s in steps[5:]]).mean(0)
        torch.testing.assert_close(p, expected, rtol=1e-12, atol=1e-12)
        assert not torch.allclose(p, last[i])  # the weights moved over those steps
