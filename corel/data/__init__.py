"""Datasets: loading, fixed splits, and the serve-time preprocessing that matches training.

Every loader returns a :class:`Dataset` whose ``preprocessing`` dict (JSON-able) holds
everything needed to turn raw inputs into model inputs at serve time;
:func:`prepare_images`, :func:`prepare_texts` and :func:`prepare_vectors` read it, and the
loaders build their own tensors through the same functions, so serving reproduces training
exactly.

Splits are fixed: they are drawn with the constant :data:`SPLIT_SEED`, not ``spec.seed``, so
every experiment on a dataset sees the same validation and test sets. They are stratified:
each class gets its share (largest-remainder rounding) and at least one sample in every split.

One module per source (``idx``, ``digits``, ``npz``, ``text``, ``ag_news``), the splits
and the preprocessing in their own; this module holds the registry of loaders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

# The loaders, and the public names importable from corel.data as before it was split.
from corel.data.ag_news import (
    AgNewsTexts,
    _load_ag_news,
    _read_ag_news_csv,
    ag_news_texts,
    locate_ag_news,
    validate_ag_news_csv,
)
from corel.data.base import (
    AG_NEWS_VAL_FRACTION,
    DEFAULT_MAX_LEN,
    DTYPES,
    MNIST_VAL_SIZE,
    SPLIT_SEED,
    TEST_FRACTION,
    VAL_FRACTION,
    Dataset,
    DatasetNotFoundError,
    PathLike,
    check_dtype,
)
from corel.data.digits import _load_digits, digits_arrays
from corel.data.idx import (
    FASHION_MNIST_CLASSES,
    IDX_SOURCES,
    _idx_files_in,
    _load_fashion_mnist,
    _load_mnist,
    locate_idx,
    read_idx,
    write_idx,
)
from corel.data.npz import _load_images, _load_npz, validate_npz
from corel.data.preprocessing import prepare_images, prepare_vectors
from corel.data.splits import training_rows as split_training_rows
from corel.data.text import (
    DEFAULT_WORD_VECTORS,
    TOKEN_PATTERN,
    TOKENIZER_VERSION,
    WordVectors,
    _load_text,
    _read_text_npz,
    clean_text,
    load_word_vectors,
    prepare_texts,
    text_warnings,
    tokenize,
)
from corel.encoders import (
    choose_features,
    features_progress,
    kept,
    load,
    model_inputs,
    run_preprocessing,
)
from corel.encoders.features import split_progress
from corel.encoders.kept import FeatureStore
from corel.encoders.precision import fixed_features
from corel.spec import ExperimentSpec

__all__ = [
    "AG_NEWS_VAL_FRACTION",
    "BUILTIN_DATASETS",
    "DEFAULT_MAX_LEN",
    "DEFAULT_WORD_VECTORS",
    "DTYPES",
    "FASHION_MNIST_CLASSES",
    "LOADERS",
    "MNIST_VAL_SIZE",
    "SPLIT_SEED",
    "TEST_FRACTION",
    "TOKENIZER_VERSION",
    "TOKEN_PATTERN",
    "VAL_FRACTION",
    "AgNewsTexts",
    "Dataset",
    "DatasetNotFoundError",
    "PathLike",
    "WordVectors",
    "ag_news_texts",
    "available_datasets",
    "check_dtype",
    "clean_text",
    "load_dataset",
    "load_word_vectors",
    "locate",
    "prepare_images",
    "prepare_texts",
    "prepare_vectors",
    "read_idx",
    "read_texts",
    "text_warnings",
    "tokenize",
    "training_images",
    "training_split_rows",
    "validate_ag_news_csv",
    "validate_npz",
    "with_image_features",
    "write_idx",
]

Loader = Callable[[ExperimentSpec, Path | None, bool], Dataset]

LOADERS: dict[str, Loader] = {
    "fashion-mnist": _load_fashion_mnist,
    "mnist": _load_mnist,
    "ag-news": _load_ag_news,
    "digits": _load_digits,
    "npz": _load_npz,
    "text": _load_text,
    "images": _load_images,
}


def available_datasets() -> list[str]:
    """Names :func:`load_dataset` accepts in ``spec.dataset``."""
    return list(LOADERS)


BUILTIN_DATASETS = (*IDX_SOURCES, "ag-news", "digits")
"""The datasets whose files the library knows how to find (the others are the user's)."""


def locate(dataset: str, data_dir: PathLike | None = None) -> Path | None:
    """Where a built-in dataset's files are under ``data_dir`` (or a system location): the
    folder or file training would read; None for one that needs no files (digits).

    Raises DatasetNotFoundError naming every place looked, ValueError for a dataset that is
    not built in (npz, text, images: those are the user's files).
    """
    root = Path(data_dir).expanduser() if data_dir is not None else None
    if dataset in IDX_SOURCES:
        return locate_idx(dataset, root)
    if dataset == "ag-news":
        return locate_ag_news(root)
    if dataset == "digits":
        return None
    raise ValueError(f"{dataset!r} is not a built-in dataset; built in: "
                     f"{', '.join(BUILTIN_DATASETS)}")


RELEASE_TRAINING_ROWS = {"mnist": 60_000 - MNIST_VAL_SIZE, "fashion-mnist": 60_000 - MNIST_VAL_SIZE,
                         "ag-news": 120_000 - round(AG_NEWS_VAL_FRACTION * 120_000)}
"""Training rows of the public releases a worker downloads (before ``train_subset``)."""


@functools.lru_cache(maxsize=16)
def _csv_training_rows(path: str, with_test: bool, mtime_ns: int, size: int) -> int:
    _, labels = _read_ag_news_csv(Path(path))
    n, k = len(labels), len(np.unique(labels))
    if with_test:  # the validation split is taken from train.csv alone
        return n - max(k, round(AG_NEWS_VAL_FRACTION * n))
    return split_training_rows(n, k)


def training_split_rows(dataset: str, data_dir: PathLike | None = None) -> int | None:
    """How many rows built-in ``dataset``'s training split holds, before ``train_subset``
    (what a check at submission compares it with): counted in its files under ``data_dir``
    (or a system location), else the public release's; None for a dataset that is not built in."""
    root = Path(data_dir).expanduser() if data_dir is not None else None
    try:
        if dataset == "digits":
            return split_training_rows(1797, 10)  # scikit-learn's 8x8 digits: 1,797 images
        if dataset in IDX_SOURCES:
            files, _ = _idx_files_in(locate_idx(dataset, root))
            assert files is not None  # locate_idx found the four
            return len(read_idx(files["y_train"])) - MNIST_VAL_SIZE
        if dataset == "ag-news":
            train = locate_ag_news(root)
            with_test = train.name == "train.csv" and (train.parent / "test.csv").is_file()
            stat = train.stat()
            return _csv_training_rows(str(train), with_test, stat.st_mtime_ns, stat.st_size)
    except DatasetNotFoundError:
        return RELEASE_TRAINING_ROWS.get(dataset)
    return None


def read_texts(path: PathLike, kind: str) -> list[str]:
    """Every row's text, in order, of a text dataset's file: AG News's CSV (``kind``
    ``ag-news``: the fields after the class, joined by a space) or a text table's .npz
    (``text``). Row ``i`` is the text whose position (:attr:`Dataset.rows`) is ``i``."""
    if kind == "ag-news":
        return _read_ag_news_csv(Path(path))[0]
    if kind == "text":
        return _read_text_npz(Path(path))[0]
    raise ValueError(f"{kind!r} is no text dataset; read_texts reads ag-news or text")


def training_images(dataset: str, data_dir: PathLike | None = None) -> np.ndarray:
    """The images of built-in ``dataset``'s training file, uint8 (N, H, W): MNIST's or
    Fashion-MNIST's ``train-images`` under ``data_dir`` (or a system location), or
    scikit-learn's digits scaled from 0..16 to 0..255. Row ``i`` is the image whose
    position (:attr:`Dataset.rows`) is ``i``."""
    if dataset == "digits":
        return np.rint(digits_arrays()[0] * (255.0 / 16.0)).astype(np.uint8)
    if dataset not in IDX_SOURCES:
        raise ValueError(f"{dataset!r} is no built-in image dataset; built in: digits, "
                         f"{', '.join(IDX_SOURCES)}")
    files, _ = _idx_files_in(locate_idx(dataset, Path(data_dir).expanduser() if data_dir else None))
    assert files is not None  # locate_idx found the four
    images: np.ndarray = read_idx(files["x_train"])
    return images


def load_dataset(
    spec: ExperimentSpec, data_dir: PathLike | None = None, *, download: bool = False,
    features_dir: PathLike | None = None,
    on_features: Callable[[str, int, int], None] | None = None,
    features_path: dict[str, Any] | None = None,
    features_store: FeatureStore | None = None,
) -> Dataset:
    """Load ``spec.dataset`` with its fixed split; keep the first ``spec.train_subset`` of train.

    ``data_dir`` is where to look first (and where ``download=True`` puts MNIST,
    Fashion-MNIST or AG News when they are not found: see :mod:`corel.data.download`). Raises DatasetNotFoundError naming every place
    looked, ValueError for malformed data. With a frozen pretrained encoder (``spec.encoder``)
    the inputs are its features, kept in ``features_dir`` (when given) for later processes;
    ``on_features(encoder, done, total)`` hears how far their computation is. The features'
    CPU path is chosen for ``spec.precision`` (corel.encoders.precision), unless
    ``features_path`` (a checkpoint's recorded ``encoder.features_path``: a resumed run's) fixes it.
    ``features_store``: where the features are also kept for every host (the service's artifact
    store; :mod:`corel.encoders.kept`); the dataset's ``features_source`` says where they came from.
    """
    with contextlib.ExitStack() as given:  # what is not given stays as an outer block set it
        if on_features is not None:
            given.enter_context(features_progress(on_features))
        if features_path is not None:
            given.enter_context(fixed_features(features_path))
        if features_store is not None:
            given.enter_context(kept.features_store(features_store))
        heard = given.enter_context(kept.sources())
        data = _load_dataset(spec, data_dir, download, features_dir)
    source = kept.source_of(heard)
    if source is not None:
        data = dataclasses.replace(data, features_source=source)
    if spec.fewshot is not None:  # one member of a few-shot protocol: its draw and evaluation rows
        from corel.data.fewshot import as_fewshot

        data = as_fewshot(data, spec.fewshot)
    return data


def _load_dataset(spec: ExperimentSpec, data_dir: PathLike | None, download: bool,
                  features_dir: PathLike | None) -> Dataset:
    if not isinstance(spec, ExperimentSpec):
        raise ValueError(f"load_dataset needs an ExperimentSpec, got {type(spec).__name__}")
    loader = LOADERS.get(spec.dataset)
    if loader is None:
        raise ValueError(
            f"unknown dataset {spec.dataset!r}; available: {', '.join(available_datasets())}"
        )
    root = Path(data_dir).expanduser() if data_dir is not None else None
    if download and root is None:
        raise ValueError("download=True needs data_dir: the folder to download into")
    features = Path(features_dir).expanduser() if features_dir is not None else None
    if spec.encoder is not None and spec.modality == "text":  # the text loaders embed with it
        return loader(spec, root, download, features)  # type: ignore[call-arg]
    data = loader(spec, root, download)
    if spec.encoder is not None and spec.fine_tunes:  # pixels in, the encoder trains
        return dataclasses.replace(data, preprocessing=run_preprocessing(
            spec.encoder, "image", "finetune", spec.encoder_path, data.preprocessing))
    if spec.encoder is not None:  # images: the loader's pixels, then the frozen encoder
        data = with_image_features(data, spec.encoder, features, spec.encoder_path,
                                   spec.precision)
    return data


def with_image_features(data: Dataset, name: str, features_dir: PathLike | None = None,
                        encoder_path: PathLike | None = None, precision: str = "auto") -> Dataset:
    """An image dataset's splits as frozen pretrained encoder ``name``'s features (computed
    once: corel.encoders.features, on the CPU path corel.encoders.precision chooses on the
    validation split for ``precision``), with the preprocessing a checkpoint records (the
    pixels' own, then the encoder). ``encoder_path``: the weights of a user's own
    (``timm:<arch>``)."""
    preprocessing = run_preprocessing(name, "image", "frozen", encoder_path, data.preprocessing)
    preprocessing = choose_features(preprocessing, data.x_val, data.y_val, precision, features_dir, encoder_path)
    encoder = load(preprocessing, encoder_path)  # resolved once for the three splits

    total = len(data.x_train) + len(data.x_val) + len(data.x_test)

    def features(x: torch.Tensor, split: str, before: int) -> torch.Tensor:
        with split_progress(split, before, total):
            out: torch.Tensor = model_inputs(x, encoder, features_dir, keep=True)
        return out

    return dataclasses.replace(
        data, x_train=features(data.x_train, "train", 0),
        x_val=features(data.x_val, "validation", len(data.x_train)),
        x_test=features(data.x_test, "test", len(data.x_train) + len(data.x_val)),
        input_shape=(int(preprocessing["input_shape"][0]),), preprocessing=preprocessing)
