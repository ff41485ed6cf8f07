"""AG News: its positional CSV (class_index,title,description), found in a data directory
or downloaded from its public release."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.data.base import (
    AG_NEWS_VAL_FRACTION,
    SPLIT_SEED,
    Dataset,
    DatasetNotFoundError,
    PathLike,
)
from corel.data.download import DownloadError
from corel.data.download import download as download_dataset
from corel.data.splits import (
    _check_class_sizes,
    _resolve_user_path,
    _split_three,
    _stratified_take,
    _subset,
)
from corel.data.text import text_inputs
from corel.spec import ExperimentSpec


def _read_ag_news_csv(path: Path) -> tuple[list[str], np.ndarray]:
    """Texts (fields after the class joined by a space) and 1-based labels of a CSV file."""
    if not path.is_file():
        raise DatasetNotFoundError(f"CSV file {path} does not exist")
    texts: list[str] = []
    labels: list[int] = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                where = f"{path}, line {reader.line_num}"
                if len(row) < 2:
                    raise ValueError(
                        f"{where}: expected class_index,title,description; got {len(row)} field"
                    )
                try:
                    label = int(row[0].strip())
                except ValueError:
                    header = " (the file must not have a header row)" if not labels else ""
                    raise ValueError(
                        f"{where}: class_index {row[0]!r} is not an integer{header}"
                    ) from None
                if label < 1:
                    raise ValueError(f"{where}: class_index {label} must be 1 or more")
                texts.append(" ".join(row[1:]))
                labels.append(label)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc}); save it as UTF-8") from exc
    except csv.Error as exc:
        raise ValueError(f"{path} is not valid CSV: {exc}") from exc
    if not texts:
        raise ValueError(f"{path} holds no rows; expected class_index,title,description rows")
    return texts, np.asarray(labels, dtype=np.int64)


def _read_class_names(path: Path | None, labels: Sequence[np.ndarray], where: str) -> list[str]:
    top = max(int(y.max()) for y in labels)
    if path is None:
        return [str(i) for i in range(1, top + 1)]
    with open(path, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()]
    if top > len(names):
        raise ValueError(
            f"{where} uses class_index {top}, but {path} names only {len(names)} classes"
        )
    return names


def validate_ag_news_csv(path: PathLike) -> dict[str, Any]:
    """Check an uploaded AG-News-style CSV the way :func:`load_dataset` would; return a summary.

    Rows are ``class_index,title,description`` (no header, class_index 1..K); every class
    1..K needs 3 rows for the 70/15/15 split. Summary: ``n``, ``num_classes``,
    ``class_counts``.
    """
    p = Path(path).expanduser()
    _, labels = _read_ag_news_csv(p)
    k = int(labels.max())
    _check_class_sizes(labels - 1, 3, [str(i) for i in range(1, k + 1)], str(p))
    return {
        "n": len(labels),
        "num_classes": k,
        "class_counts": np.bincount(labels - 1, minlength=k).tolist(),
    }


@dataclass(frozen=True)
class _AgNewsFiles:
    train: Path | None
    test: Path | None
    classes: Path | None


def _ag_news_files_in(place: Path) -> tuple[_AgNewsFiles | None, str]:
    if place.is_file():
        classes = place.parent / "classes.txt"
        return _AgNewsFiles(place, None, classes if classes.is_file() else None), ""
    if not place.is_dir():
        return None, "no such file or folder"
    train, test, classes = (place / n for n in ("train.csv", "test.csv", "classes.txt"))
    cls = classes if classes.is_file() else None
    if train.is_file():
        return _AgNewsFiles(train, test if test.is_file() else None, cls), ""
    if test.is_file():  # only one CSV: split it like a single file
        return _AgNewsFiles(test, None, cls), ""
    return None, "no train.csv or test.csv"


def _locate_ag_news(spec: ExperimentSpec, data_dir: Path | None,
                    download: bool = False) -> _AgNewsFiles:
    if spec.dataset_path:
        places = [_resolve_user_path(spec.dataset_path, data_dir)]
    else:
        places = [data_dir / sub for sub in ("ag_news", "ag-news")] if data_dir else []
        places += [data_dir] if data_dir else []
    looked = []
    for place in places:
        files, why = _ag_news_files_in(place)
        if files is not None:
            return files
        looked.append(f"  {place} ({why})")
    download_error = ""
    if download and data_dir is not None and not spec.dataset_path:
        try:
            files, _ = _ag_news_files_in(download_dataset("ag-news", data_dir))
        except DownloadError as exc:
            download_error = f"\nThe download into {data_dir} failed: {exc}"
        else:
            assert files is not None
            return files
    raise DatasetNotFoundError(
        "AG News not found. Looked in:\n"
        + ("\n".join(looked) if looked else "  nowhere: neither dataset_path nor data_dir is set")
        + download_error
        + "\nTo get it: set dataset_path to a CSV of class_index,title,description rows, or to a "
        "folder with train.csv (and test.csv, classes.txt) from the AG News corpus; or pass a "
        "data_dir with an ag_news/ subfolder holding them, or call "
        "load_dataset(spec, data_dir, download=True) to download them."
    )


def locate_ag_news(data_dir: Path | None) -> Path:
    """The AG News CSV training reads under ``data_dir``; DatasetNotFoundError naming each
    place looked otherwise."""
    files = _locate_ag_news(ExperimentSpec(dataset="ag-news"), data_dir)
    assert files.train is not None
    return files.train


@dataclass(frozen=True)
class AgNewsTexts:
    """AG News as corel splits it, before any encoder: each split's texts and labels
    (0-based), and the class names."""

    train: tuple[list[str], np.ndarray]
    val: tuple[list[str], np.ndarray]
    test: tuple[list[str], np.ndarray]
    class_names: list[str]
    rows: dict[str, np.ndarray] | None = None  # each split's positions in its CSV file (Dataset.rows)


def ag_news_texts(spec: ExperimentSpec, data_dir: Path | None = None, download: bool = False) -> AgNewsTexts:
    """The texts of the rows a run on ``spec`` trains, validates and tests on (its
    ``train_subset`` applied): what a peer trains on, for a like-for-like comparison."""
    files = _locate_ag_news(spec, data_dir, download)
    assert files.train is not None
    texts, labels = _read_ag_news_csv(files.train)
    rng = np.random.default_rng(SPLIT_SEED)
    if files.test is not None:
        test_texts, test_labels = _read_ag_news_csv(files.test)
        names = _read_class_names(files.classes, [labels, test_labels], str(files.train.parent))
        y, y_test = labels - 1, test_labels - 1
        _check_class_sizes(y, 2, names, str(files.train))
        n_val = max(len(names), round(AG_NEWS_VAL_FRACTION * len(y)))
        train_idx, val_idx = _stratified_take(y, n_val, keep=1, rng=rng)
        test_idx = np.arange(len(test_labels))
    else:
        names = _read_class_names(files.classes, [labels], str(files.train))
        y = labels - 1
        _check_class_sizes(y, 3, names, str(files.train))
        train_idx, val_idx, test_idx = _split_three(y, rng)
        test_texts, y_test = [texts[i] for i in test_idx], y[test_idx]
    train_idx = _subset(train_idx, spec.train_subset, spec.dataset)
    return AgNewsTexts(train=([texts[i] for i in train_idx], y[train_idx]),
                       val=([texts[i] for i in val_idx], y[val_idx]),
                       test=(list(test_texts), np.asarray(y_test, dtype=np.int64)), class_names=names,
                       rows={"train": train_idx, "val": val_idx, "test": test_idx})


def _load_ag_news(spec: ExperimentSpec, data_dir: Path | None, download: bool,
                  features_dir: Path | None = None) -> Dataset:
    split = ag_news_texts(spec, data_dir, download)
    prepare = text_inputs(spec, data_dir, features_dir)
    prepare.choose(split.val[0], split.val[1], spec.precision)
    preprocessing = prepare.preprocessing
    x_train, x_val, x_test = prepare.splits(split.train[0], split.val[0], split.test[0])
    return Dataset(
        name="ag-news",
        modality="text",
        x_train=x_train,
        y_train=torch.from_numpy(split.train[1]),
        x_val=x_val,
        y_val=torch.from_numpy(split.val[1]),
        x_test=x_test,
        y_test=torch.from_numpy(split.test[1]),
        class_names=split.class_names,
        input_shape=tuple(int(s) for s in preprocessing["input_shape"]),
        preprocessing=preprocessing,
        rows=split.rows,
    )
