"""The paper's tables from sweep records: means, tuning, paired t-tests."""

import numpy as np
import pytest
from scipy import stats

from corel import report


def records():
    rng = np.random.default_rng(0)
    out = []
    for seed in range(5):
        out.append({"loss": "cce", "lam": None, "seed": seed, "val_accuracy": 0.80 + 0.01 * rng.random(),
                    "test_accuracy": 0.79 + 0.01 * rng.random()})
        for lam in (0.2, 0.5, 0.8):
            bump = {0.2: 0.0, 0.5: 0.02, 0.8: 0.05}[lam]
            out.append({"loss": "gaussian", "lam": lam, "seed": seed,
                        "val_accuracy": 0.80 + bump + 0.01 * rng.random(),
                        "test_accuracy": 0.80 + bump + 0.01 * rng.random(),
                        "clustering": {"kmeans": {"accuracy": 0.6 + seed / 100, "ari": 0.5,
                                                  "v_measure": 0.55, "silhouette": None,
                                                  "metric": "euclidean"}}})
    return out


def test_lambda_tuning_picks_the_best_mean_validation_accuracy():
    recs = records()
    tuning = report.lambda_tuning(recs)
    assert tuning["cce"]["tuned_lambda"] is None and len(tuning["cce"]["by_lambda"]) == 1
    rows = tuning["gaussian"]["by_lambda"]
    assert [r["lam"] for r in rows] == [0.2, 0.5, 0.8]
    for r in rows:
        vals = [x["val_accuracy"] for x in recs if x["loss"] == "gaussian" and x["lam"] == r["lam"]]
        assert r["mean_val"] == pytest.approx(np.mean(vals))
        assert r["std_val"] == pytest.approx(np.std(vals, ddof=1))
        assert r["n"] == 5
    assert tuning["gaussian"]["tuned_lambda"] == 0.8


def test_ties_go_to_the_smaller_lambda():
    recs = [{"loss": "cosine", "lam": lam, "seed": 0, "val_accuracy": 0.5, "test_accuracy": 0.5}
            for lam in (0.9, 0.1)]
    assert report.lambda_tuning(recs)["cosine"]["tuned_lambda"] == 0.1


def test_test_accuracy_table_and_paired_t_test():
    recs = records()
    table = report.test_accuracy_table(recs)
    rows = {r["loss"]: r for r in table["rows"]}
    gauss = [x["test_accuracy"] for x in recs if x["loss"] == "gaussian" and x["lam"] == 0.8]
    cce = [x["test_accuracy"] for x in recs if x["loss"] == "cce"]
    assert rows["gaussian"]["mean"] == pytest.approx(np.mean(gauss))
    assert rows["gaussian"]["std"] == pytest.approx(np.std(gauss, ddof=1))
    assert rows["gaussian"]["lam"] == 0.8 and rows["cce"]["lam"] is None
    assert table["rows"][0]["loss"] == "gaussian"  # sorted best first
    c = table["comparison"]
    assert (c["best"], c["runner_up"], c["paired_seeds"]) == ("gaussian", "cce", [0, 1, 2, 3, 4])
    expected = stats.ttest_rel(gauss, cce)
    assert c["p"] == pytest.approx(expected.pvalue) and c["t"] == pytest.approx(expected.statistic)
    assert c["significance"] == report.significance(expected.pvalue)


def test_t_test_pairs_by_seed_and_needs_two_seeds():
    recs = [
        {"loss": "a", "lam": 0.5, "seed": 1, "val_accuracy": 0.9, "test_accuracy": 0.9},
        {"loss": "b", "lam": 0.5, "seed": 2, "val_accuracy": 0.8, "test_accuracy": 0.8},
    ]
    c = report.test_accuracy_table(recs)["comparison"]
    assert c["paired_seeds"] == [] and c["p"] is None and c["significance"] == "n/a"
    one = report.test_accuracy_table(recs[:1])
    assert one["comparison"] is None and one["rows"][0]["std"] is None


@pytest.mark.parametrize(("p", "mark"), [(0.0001, "p < 0.001"), (0.01, "p < 0.05"), (0.2, "n.s."),
                                         (None, "n/a")])
def test_significance_marks(p, mark):
    assert report.significance(p) == mark


def test_clustering_table_averages_over_seeds_at_the_tuned_lambda():
    rows = report.clustering_table(records())
    assert len(rows) == 1
    row = rows[0]
    assert (row["loss"], row["lam"], row["algorithm"], row["n"]) == ("gaussian", 0.8, "kmeans", 5)
    assert row["accuracy"] == pytest.approx(np.mean([0.6 + s / 100 for s in range(5)]))
    assert row["silhouette"] is None


def test_paper_numbers_are_there():
    assert report.PAPER_TABLE1[("fashion-mnist", "ffnn")]["gaussian"] == 88.88
    assert report.PAPER_TABLE1[("mnist", "cnn")]["cce"] == 99.15
    # Table 2, every setting: the CNN rows train at these.
    assert report.PAPER_TABLE2[("fashion-mnist", "cnn")] == {"center": 0.35, "cosine": 0.15, "gaussian": 0.85}
    assert report.PAPER_TABLE2[("mnist", "ffnn")]["cosine"] == 0.20
    assert all(set(lams) == {"center", "cosine", "gaussian"} for lams in report.PAPER_TABLE2.values())


def test_clustering_rows_carry_the_papers_scores_of_their_setting():
    paper = report.PAPER_CLUSTERING[("fashion-mnist", "cnn")]
    assert paper[("gaussian", "kmeans")] == {"accuracy": 0.913, "ari": 0.824, "v_measure": 0.840,
                                             "silhouette": 0.740}
    assert paper[("cce", "gmm")]["silhouette"] == 0.296
    assert report.PAPER_CLUSTERING[("ag-news", "cnn")][("cosine", "kmeans")]["silhouette"] == 0.891
    assert all(len(rows) == 8 for rows in report.PAPER_CLUSTERING.values())
    row = report.clustering_table(records(), paper=paper)[0]
    assert row["paper"] == paper[("gaussian", "kmeans")]
    assert row["paper"] is not paper[("gaussian", "kmeans")]  # a copy: the table stays as published
    assert report.clustering_table(records(), paper={})[0]["paper"] is None
    assert "paper" not in report.clustering_table(records())[0]
