"""Named budgets (``"budget": "quick" | "paper"``): they fill lr, epochs and batch_size where the
spec leaves them out, an explicit field wins, and quick's first result is a good one."""

from __future__ import annotations

import numpy as np
import pytest

from corel.spec import BUDGETS, ExperimentSpec
from corel.train import fit
from tests.conftest import SHARED_DATASETS

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels


def test_a_budget_fills_only_the_fields_left_out_and_no_budget_is_the_paper_s():
    quick = ExperimentSpec(dataset="digits", budget="quick")
    assert (quick.lr, quick.epochs, quick.batch_size) == (1e-3, 10, 64)
    assert ExperimentSpec(dataset="digits", budget="quick", lr=0.01, epochs=3).model_dump(
        include={"lr", "epochs", "batch_size"}) == {"lr": 0.01, "epochs": 3, "batch_size": 64}
    none = ExperimentSpec(dataset="digits")
    paper = ExperimentSpec(dataset="digits", budget="paper")
    assert (none.lr, none.epochs, none.batch_size) == (paper.lr, paper.epochs, paper.batch_size) \
        == tuple(BUDGETS["paper"][k] for k in ("lr", "epochs", "batch_size"))
    with pytest.raises(ValueError, match="'quick' or 'paper'"):
        ExperimentSpec(dataset="digits", budget="fast")


def test_quick_gives_a_good_first_result_on_digits_mnist_and_a_small_upload(tmp_path):
    from sklearn.datasets import load_iris

    iris = load_iris()
    np.savez(tmp_path / "iris.npz", x=iris.data.astype("float32"), y=iris.target,
             class_names=np.array(iris.target_names))
    for fields in ({"dataset": "digits"}, {"dataset": "mnist", "train_subset": 5000},
                   {"dataset": "npz", "dataset_path": str(tmp_path / "iris.npz")}):
        result = fit(ExperimentSpec(**fields, budget="quick"), data_dir=SHARED_DATASETS)
        assert result.test_accuracy >= 0.85, (fields, result.test_accuracy)


def test_the_not_learning_advice_follows_from_the_run():
    from corel.train import EpochMetrics, NotLearningError, not_learning

    # The case: one epoch of digits at the paper's rate stays at chance, and more
    # steps or a larger rate is what helps, never a smaller one.
    with pytest.raises(NotLearningError) as caught:
        fit(ExperimentSpec(dataset="digits", epochs=1, loss="cosine", lam=0.85))
    said = str(caught.value)
    assert "It took only 10 optimiser steps (1 epoch of 10): train more epochs" in said, said
    assert "a larger learning rate (the quick budget's is 1e-3; this run's is 0.0001)" in said
    assert "smaller learning rate" not in said

    def history(accuracies):
        return [EpochMetrics(epoch=i + 1, train_loss=1.0, train_accuracy=0.1, val_accuracy=a, seconds=0.1,
                             is_best=False)
                for i, a in enumerate(accuracies)]

    spec = ExperimentSpec(dataset="digits", epochs=30, lr=0.01, batch_size=16)
    collapsed = not_learning(history([0.9] + [0.1] * 29), 0.1, spec, n_val=300, n_train=1258)
    assert collapsed is not None and "Try a smaller learning rate (this run's is 0.01" in collapsed
    slow = not_learning(history([0.1] * 30), 0.1, spec.model_copy(update={"lr": 1e-5}), n_val=300, n_train=1258)
    assert slow is not None and "Try a larger learning rate" in slow
    tiny = not_learning(history([0.3] * 5), 0.3, spec.model_copy(update={"epochs": 5, "batch_size": 64}),
                        n_val=30, n_train=100)
    assert tiny is not None and "or a smaller batch_size (this run's is 64 for 100 training rows)" in tiny


def test_the_cli_takes_a_budget_and_a_flag_given_wins(tmp_path):
    from corel.cli import main
    from corel.train import checkpoint_from_bytes

    out = tmp_path / "quick.pt"
    assert main(["train", "--dataset", "digits", "--budget", "quick", "--epochs", "2", "--no-progress",
                 "--checkpoint", str(out)]) == 0
    import json

    spec = json.loads(checkpoint_from_bytes(out.read_bytes())["spec"])
    assert (spec["budget"], spec["lr"], spec["batch_size"], spec["epochs"]) == ("quick", 0.001, 64, 2)
