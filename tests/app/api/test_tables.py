"""Users' own tables through POST /datasets: a CSV feature table (standardised) and a
Parquet text table with string labels, each trained by a real worker and then served
by /embed and /predict; and bad variants of each, refused with a 422 naming the problem."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from sklearn.datasets import load_digits

FAST = {"lr": 0.003, "batch_size": 64, "epochs": 3}


def _csv(rows: list[list], header: list[str], delimiter: str = ",") -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter)
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue().encode()


def _upload(client, name: str, data: bytes, **fields):
    return client.post("/datasets", files={"file": (name, data)},
                       data={k: str(v).lower() if isinstance(v, bool) else v for k, v in fields.items()})


@pytest.fixture(scope="module")
def digits_table() -> tuple[np.ndarray, np.ndarray, bytes]:
    d = load_digits()
    x, y = d.data[:600] * 3.0 + 5.0, d.target[:600]  # off-centre, so that standardising matters
    header = [f"px{i}" for i in range(64)] + ["digit"]
    rows = [[*map(float, row), f"digit {label}"] for row, label in zip(x, y, strict=True)]
    return x.astype(np.float32), y, _csv(rows, header)


def test_a_train_subset_above_an_uploads_training_split_is_a_422(client, digits_table):
    _, _, data = digits_table
    ds = _upload(client, "subset.csv", data, label_column="digit").json()
    rows = 600 - 90 - 90  # 600 rows, 15 % each to validation and test
    before = client.get("/experiments", params={"limit": 1}).json()["total"]
    r = client.post("/experiments", json={"dataset": "npz", "dataset_id": ds["id"], **FAST,
                                          "train_subset": rows + 1})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == (f"train_subset is {rows + 1}, but dataset_id {ds['id']}'s training "
                                  f"split holds {rows} rows; ask for at most {rows}, or leave "
                                  "train_subset unset to train on all of them")
    assert client.get("/experiments", params={"limit": 1}).json()["total"] == before


@pytest.fixture(scope="module")
def news(shared_datasets) -> tuple[list[str], list[str]]:
    names = ["World", "Sports", "Business", "Sci/Tech"]
    with open(shared_datasets / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[:800]
    return [f"{r[1]} {r[2]}" for r in rows], [names[int(r[0]) - 1] for r in rows]


@pytest.mark.parametrize(("name", "table", "fields", "words"), [
    ("missing-column.csv", ([[1, 2, "a"]] * 9, ["f1", "f2", "label"]), {"label_column": "class"},
     "no column 'class' for the label; the columns are 'f1', 'f2', 'label'"),
    ("not-numeric.csv", ([[1, 2, "a"]] * 4 + [[1, "n/a", "b"]] + [[3, 4, "b"]] * 4, ["f1", "f2", "label"]),
     {"kind": "features"}, "column 'f2', row 5: the value is 'n/a', not a number"),
    # One typo in a numeric column: diagnosed as such, with no kind given (it was taken
    # for a text table: "cannot tell which column holds the text").
    ("typo.csv", ([[1, 2, "a"]] * 10 + [[1, "l.5", "b"]] + [[3, 4, "b"]] * 9, ["f1", "f2", "label"]),
     {}, "column 'f2', row 11: the value is 'l.5', not a number"),
    ("small-class.csv", ([[1, 2, "a"]] * 6 + [[1, 2, "rare"]] * 2, ["f1", "f2", "label"]), {},
     "every class needs at least 3 rows (one for each split), but these have fewer: 'rare' (2)"),
    ("empty-text.csv", ([["hello there", "x"]] * 3 + [["", "y"]] + [["fine", "y"]] * 3, ["text", "label"]),
     {"kind": "text"}, "column 'text', row 4: the text is empty"),
    ("no-label.csv", ([[1, 2]] * 9, ["f1", "f2"]), {}, "cannot tell which column holds the label"),
])
def test_bad_tables_are_refused_naming_the_problem(client, name, table, fields, words):
    rows, header = table
    r = _upload(client, name, _csv(rows, header), **fields)
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"], r.json()["detail"]
    assert "/tmp" not in r.json()["detail"]


def test_a_corrupt_parquet_is_a_422(client):
    r = _upload(client, "broken.parquet", b"PAR1 this is not parquet at all PAR1")
    assert r.status_code == 422 and "not a readable parquet table" in r.json()["detail"], r.text


def _latent_rows(client, eid: int) -> int:
    table = np.load(io.BytesIO(client.get(f"/experiments/{eid}/latent").content), allow_pickle=False)
    return len(table)


def test_a_table_whose_one_column_of_words_is_the_label_needs_no_label_column(client):
    """Iris as a new user has it: four numeric columns and `species`. It was refused with
    "cannot tell which column holds the label"; the one column of words is the label."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    rows = [[*map(float, x), iris.target_names[y]] for x, y in zip(iris.data, iris.target, strict=True)]
    header = ["sepal_length", "sepal_width", "petal_length", "petal_width", "species"]
    r = _upload(client, "iris.csv", _csv(rows, header))
    assert r.status_code == 201, r.text
    summary = r.json()["summary"]
    assert summary["label_column"] == "species" and summary["feature_columns"] == header[:4]
    assert summary["class_names"] == ["setosa", "versicolor", "virginica"]
    # Two columns of words and no label named: still a question for the user.
    r = _upload(client, "two.csv", _csv([[1.0, "a", "x"]] * 9, ["f", "g", "h"]))
    assert r.status_code == 422 and "label_column" in r.json()["detail"], r.text


def _iris_rows() -> tuple[list[list], list[str]]:
    from sklearn.datasets import load_iris

    iris = load_iris()
    rows = [[*map(float, x), iris.target_names[y]] for x, y in zip(iris.data, iris.target, strict=True)]
    return rows, ["sepal_length", "sepal_width", "petal_length", "petal_width", "species"]


@pytest.mark.parametrize("delimiter", [";", "\t", "|"])
@pytest.mark.parametrize("fields", [{}, {"label_column": "species"}])
def test_a_table_separated_by_semicolons_tabs_or_bars_is_read_by_its_delimiter(client, delimiter, fields):
    """A ;-separated iris was read as one column 'sepal_length;...;species': refused with
    "name it with label_column", and refused again when it was named."""
    rows, header = _iris_rows()
    r = _upload(client, "iris.csv", _csv(rows, header, delimiter), **fields)
    assert r.status_code == 201, r.text
    summary = r.json()["summary"]
    assert summary["label_column"] == "species" and summary["feature_columns"] == header[:4]


def test_a_table_of_one_column_is_told_its_columns_are_not_separated(client):
    rows, header = _iris_rows()
    data = "\n".join(" ".join(map(str, row)) for row in [header, *rows]).encode()
    r = _upload(client, "spaces.csv", data, label_column="species")
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "one column, 'sepal_length sepal_width petal_length petal_width species'" in detail, detail
    assert "commas, semicolons, tabs or |" in detail, detail


def test_a_decimal_comma_is_named_as_such(client):
    rows, header = _iris_rows()
    text = _csv(rows, header, ";").decode().replace("5.1;", "5,1;", 1)
    r = _upload(client, "comma.csv", text.encode())
    assert r.status_code == 422, r.text
    assert "the value is '5,1', not a number: write decimals with a point (5.1)" in r.json()["detail"]
