"""Turning request inputs into model inputs, and running the encoder and head."""

from __future__ import annotations

import asyncio
import binascii
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pybase64
import torch
from fastapi.concurrency import run_in_threadpool
from PIL import Image, UnidentifiedImageError

from app.core.db import session_scope
from app.core.errors import ClientGone, InvalidInput, PayloadTooLarge, QueueFull
from app.core.schemas.inference import INPUT_KINDS, BinaryArray, InferenceRequest
from app.serving.model_cache import LoadedModel, load_from_database
from app.serving.state import ServingState
from corel.data.image_folders import MAX_PIXELS, ImageTooLarge, open_image, why_unreadable
from corel.data.tables import texts_of_rows
from corel.encoders.record import EncoderRecord
from corel.layers import Layer

log = logging.getLogger("corel.api")

MAX_TEXT_BYTES = 256 * 1024  # Settings.max_text_bytes's default

ACCEPTS = {
    "image": ("images", "arrays", "binary"),
    "text": ("texts", "rows"),
    "vector": ("arrays", "rows", "binary"),
}


def batch_size(req: InferenceRequest) -> int:
    if req.binary is not None:
        return int(req.binary.shape[0])
    kind = next(k for k in INPUT_KINDS if getattr(req, k) is not None)
    return len(getattr(req, kind) or [])


def _rows(rows: list[dict[str, Any]], loaded: LoadedModel) -> np.ndarray:
    """Inputs given by column name, in the order of the table the model was trained from."""
    names = loaded.preprocessing.get("feature_names")
    if not names:
        d = int(loaded.preprocessing["input_shape"][0])
        raise InvalidInput(
            f"experiment {loaded.experiment_id} was trained from an .npz without column names, "
            f"so its inputs cannot be given by name; send arrays (one list of {d} numbers per input)")
    out = np.empty((len(rows), len(names)), np.float32)
    for i, row in enumerate(rows):
        missing = [n for n in names if n not in row]
        if missing:
            raise InvalidInput(
                f"input {i}: no value for feature column(s) {', '.join(map(repr, missing))}; the "
                f"model takes {', '.join(map(repr, names))} (other columns are ignored)")
        for j, name in enumerate(names):
            value = row[name]
            try:
                if isinstance(value, bool):
                    raise ValueError
                out[i, j] = float(value)
            except (TypeError, ValueError):
                raise InvalidInput(f"input {i}, column {name!r}: {value!r} is not a number") from None
    return out


def check_batch(req: InferenceRequest, limit: int) -> None:
    n = batch_size(req)
    if n == 0:
        raise InvalidInput("the batch is empty: send at least one input")
    if n > limit:
        raise PayloadTooLarge(f"a request may carry at most {limit} inputs; this one has {n}")


def _b64(data: str, what: str) -> bytes:
    try:
        # pybase64: SIMD base64, ~10x the standard library on a 1 MB batch.
        return pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"{what} is not valid base64") from exc


def decode_binary(binary: BinaryArray, raw: bytes | None = None) -> np.ndarray:
    """The array of a BinaryArray; ``raw`` is given for application/octet-stream bodies."""
    if raw is None:
        raw = _b64(binary.data, "binary.data")
    dtype = np.dtype("<f4") if binary.dtype == "float32" else np.dtype(np.uint8)
    if any(s < 0 for s in binary.shape):
        raise InvalidInput(f"binary.shape must be non-negative; got {binary.shape}")
    expected = math.prod(binary.shape) * dtype.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"binary.data holds {len(raw)} bytes but shape {binary.shape} of {binary.dtype} "
            f"needs {expected}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(binary.shape)


def _decode_image(data: bytes, index: int, loaded: LoadedModel, max_pixels: int) -> np.ndarray:
    pixels_of = loaded.served.pixels  # a frozen encoder's run: the dataset's own pixels
    channels, height, width = (int(s) for s in pixels_of["input_shape"])
    try:
        with open_image(data, max_pixels) as img:
            if img.format not in ("PNG", "JPEG"):
                raise InvalidInput(f"input {index}: {img.format} images are not accepted; send PNG or JPEG")
            converted = img.convert("L" if channels == 1 else "RGB")
            if converted.size != (width, height):
                converted = converted.resize((width, height), Image.Resampling.BILINEAR)
            pixels = np.asarray(converted, dtype=np.float32)
            if channels > 1:  # (H, W, C) -> (C, H, W), as the model takes it
                pixels = pixels.transpose(2, 0, 1)
    except ImageTooLarge as exc:
        raise PayloadTooLarge(f"input {index}: {exc} (COREL_MAX_IMAGE_PIXELS)") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidInput(f"input {index}: not a decodable PNG or JPEG image "
                           f"({why_unreadable(data, exc)})") from exc
    # 8-bit grey levels onto the dataset's own pixel scale (255 for (Fashion-)MNIST, 16 for digits).
    return pixels * (float(pixels_of["pixel_max"]) / 255.0)


def _per_item_arrays(arrays: list[Any]) -> np.ndarray:
    try:
        out = np.asarray(arrays, dtype=np.float32)
    except (ValueError, TypeError):
        shapes = []
        for i, item in enumerate(arrays):
            try:
                shapes.append(np.asarray(item, dtype=np.float32).shape)
            except (ValueError, TypeError) as exc:
                raise InvalidInput(f"input {i}: not a numeric array") from exc
            if shapes[-1] != shapes[0]:
                raise InvalidInput(
                    f"input {i}: shape {shapes[-1]} differs from input 0's shape {shapes[0]}"
                ) from None
        raise InvalidInput("arrays must be numeric, one array per input") from None
    return out


def model_inputs(req: InferenceRequest, loaded: LoadedModel, max_pixels: int = MAX_PIXELS,
                 max_text_bytes: int = MAX_TEXT_BYTES) -> torch.Tensor:
    """The request's inputs as the model's input tensor, preprocessed exactly as in training."""
    return prepare(decode(req, loaded, max_pixels, max_text_bytes), loaded)


def decode(req: InferenceRequest, loaded: LoadedModel, max_pixels: int = MAX_PIXELS,
           max_text_bytes: int = MAX_TEXT_BYTES) -> np.ndarray | list[str]:
    """The request's inputs, one per row, before the training preprocessing: pixel or
    vector arrays, or texts. Checks the modality, the encodings and the values; an image
    that declares more than ``max_pixels``, or a text of more than ``max_text_bytes``, is
    refused (413) before it is decoded."""
    kind = next(k for k in INPUT_KINDS if getattr(req, k) is not None)
    if kind not in ACCEPTS[loaded.modality]:
        raise InvalidInput(
            f"experiment {loaded.experiment_id} was trained on {loaded.modality} inputs "
            f"({loaded.spec.dataset}); send {' or '.join(ACCEPTS[loaded.modality])}, not {kind}"
        )
    if loaded.modality == "text":
        texts = texts_of(req, loaded)
        for i, text in enumerate(texts):
            try:
                size = len(text.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise InvalidInput(f"input {i}: text is not valid UTF-8 ({exc.reason})") from exc
            if size > max_text_bytes:
                raise PayloadTooLarge(f"input {i}: the text is {size:,} bytes of UTF-8; a text may "
                                      f"have at most {max_text_bytes:,} (COREL_MAX_TEXT_BYTES)")
        return texts
    if kind == "images":
        return np.stack([_decode_image(_b64(s, f"input {i}"), i, loaded, max_pixels)
                         for i, s in enumerate(req.images or [])])
    if kind == "rows":
        array = _rows(req.rows or [], loaded)
    else:
        array = (decode_binary(req.binary, req._raw) if req.binary is not None
                 else _per_item_arrays(req.arrays or []))
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        bad = int(np.argwhere(~np.isfinite(array.reshape(len(array), -1)))[0][0])
        raise InvalidInput(f"input {bad}: contains NaN or infinite values")
    return array


def texts_of(req: InferenceRequest, loaded: LoadedModel) -> list[str]:
    """A text model's inputs: the texts, or those of rows by column name (a CSV of texts)."""
    if req.rows is None:
        return req.texts or []
    try:
        return texts_of_rows(req.rows, loaded.text_column)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from exc


def warnings(req: InferenceRequest, loaded: LoadedModel) -> list[str | None]:
    """For each input, None or what to know before trusting its answer (a text model's text
    with no word the model knows)."""
    if loaded.modality != "text":
        return [None] * batch_size(req)
    return loaded.served.warnings(texts_of(req, loaded))


def prepare(raw: np.ndarray | list[str], loaded: LoadedModel) -> torch.Tensor:
    """Decoded inputs (or a slice of them) -> the model's input tensor, as in training."""
    try:
        return loaded.served.prepare(raw)
    except ValueError as exc:
        # The library's own checks (shape, range, ...) say what is wrong and what is allowed.
        raise InvalidInput(str(exc)) from exc


class TextBatchObserver(Protocol):
    """Where the text queue's batches are counted (the API's metrics)."""

    def observe_text_batch(self, inputs: int, tokens: int, queued: list[float], compute: float) -> None:
        """One forward pass: its texts, their tokens, each request's seconds in the queue
        (arrival to the pass's start), and the pass's seconds."""

    def observe_text_refused(self, reason: str, inputs: int) -> None:
        """Inputs not computed: ``"queue_full"`` (a 429) or ``"client_gone"``."""


class InferenceRunner:
    """Runs the encoder and head for the API, so that it keeps up with many clients.

    Small requests run on the event loop, on the API's one torch thread (setting
    ``api_torch_threads``), and those that arrive together share one forward pass:
    a request waits for the end of the loop's current round, never for a timer, so a
    lone request is not delayed. A large batch (``LARGE_BATCH`` inputs or more) is
    prepared and computed on a team of ``threads`` threads, split into one slice per
    thread, while the event loop goes on reading the next requests. Rows come out
    the same up to float32 rounding whatever they were batched with.

    Raw texts for a frozen pretrained encoder (which costs far more than the head) wait in
    a queue of their own, as text-embeddings-inference batches them:

    * no timer: whenever the encoder is free, the next batch is taken at once;
    * a token budget (``batch_tokens``, counted by the encoder's own tokenizer as each
      request arrives, beside the pass under way) rather than a row count: the waiting
      requests of one model and layer are taken first in first out while their tokens fit
      (a first request larger than the budget goes alone); within a batch the encoder
      sorts the texts by length and pads each of its own batches to its longest;
    * the pass runs off the event loop, which meanwhile reads, checks and counts the next
      requests, on ``text_threads`` torch threads (setting ``api_text_threads``; the event
      loop keeps its one): the encoder is where a text request's time goes;
    * a request whose client has gone (``gone`` returns) leaves the queue at once and is
      never computed; one already in a pass gets no answer;
    * past ``queue_max_inputs`` waiting texts a request is refused (:class:`QueueFull`, a
      429) with the seconds the waiting tokens take at the rate measured so far.
    """

    LARGE_BATCH = 256

    def __init__(self, threads: int, max_image_pixels: int = MAX_PIXELS, *,
                 max_text_bytes: int = MAX_TEXT_BYTES, batch_tokens: int = 16384,
                 queue_max_inputs: int = 8192, observer: TextBatchObserver | None = None,
                 text_threads: int = 1) -> None:
        if text_threads < 1:
            raise ValueError(f"text_threads must be at least 1, got {text_threads}")
        self.threads = threads
        self.text_threads = text_threads
        self.max_image_pixels = max_image_pixels
        self.max_text_bytes = max_text_bytes
        self.batch_tokens = batch_tokens
        self.queue_max_inputs = queue_max_inputs
        self.observer = observer
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="corel-inference")
        # Requests waiting for the flush at the end of this loop round (scheduled by the first).
        self._pending: dict[tuple[int, tuple[int, ...]], list[_Pending]] = {}
        self.forward_passes = 0  # for tests and curiosity: small requests share them
        # Texts waiting for a frozen encoder (oldest first), and whether a drain is under way.
        self._texts: list[_PendingTexts] = []
        self.queued_inputs = 0
        self.queued_tokens = 0
        self._draining = False
        self._drain: asyncio.Future[None] | None = None
        self._tokens_per_second = 0.0  # measured over the passes so far (for Retry-After)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def queued_requests(self) -> int:
        return len(self._texts)

    async def run(
        self, req: InferenceRequest, loaded: LoadedModel, similarities: bool, layer: Layer = "head",
        gone: Callable[[], Awaitable[object]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The request's representations (of ``layer``: the head's h, or a pretrained
        encoder's features), and its similarities to every class if asked. ``gone``: returns
        when the request's client has closed its connection (then :class:`ClientGone`)."""
        loop = asyncio.get_running_loop()
        if batch_size(req) >= self.LARGE_BATCH:
            # Decoding a binary array is a view of the body; images are decoded in the team.
            raw = (decode(req, loaded) if req.binary is not None
                   else await loop.run_in_executor(self._pool, decode, req, loaded,
                                                   self.max_image_pixels, self.max_text_bytes))
            total, n = len(raw), self.threads if loaded.device.type == "cpu" else 1
            # Each slice writes its rows straight into the answer, in its own thread.
            h = np.empty((total, loaded.served.width(layer)), np.float32)
            sims = np.empty((total, len(loaded.class_names)), np.float32) if similarities else None
            bounds = [total * i // n for i in range(n + 1)]
            try:
                await asyncio.gather(*(
                    loop.run_in_executor(self._pool, _slice, raw, a, b, loaded, h, sims, layer)
                    for a, b in itertools.pairwise(bounds) if b > a
                ))
            except InvalidInput:
                prepare(raw, loaded)  # the same complaint, worded for the whole batch's shape
                raise
            self.forward_passes += 1
            return torch.from_numpy(h), None if sims is None else torch.from_numpy(sims)
        if loaded.modality == "text" and _frozen_encoder(loaded):
            return await self._queue_texts(req, loaded, similarities, layer, gone)
        x = model_inputs(req, loaded, self.max_image_pixels, self.max_text_bytes)
        if layer == "encoder":  # a frozen encoder's features are the head's prepared input
            return loaded.served.embed(x, "encoder"), None
        pending = _Pending(loaded, x, similarities, loop.create_future())
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.setdefault((id(loaded), tuple(x.shape[1:])), []).append(pending)
        return await pending.result

    async def _queue_texts(
        self, req: InferenceRequest, loaded: LoadedModel, similarities: bool, layer: Layer,
        gone: Callable[[], Awaitable[object]] | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        texts = decode(req, loaded, self.max_image_pixels, self.max_text_bytes)
        assert isinstance(texts, list)  # a text model's inputs decode to strings
        if self.queued_inputs + len(texts) > self.queue_max_inputs:
            if self.observer is not None:
                self.observer.observe_text_refused("queue_full", len(texts))
            raise QueueFull(
                f"{self.queued_inputs:,} texts are waiting for the encoder and this request's "
                f"{len(texts):,} would pass the queue's cap of {self.queue_max_inputs:,} "
                f"(COREL_TEXT_QUEUE_MAX_INPUTS); retry after Retry-After seconds",
                retry_after=self.retry_after())
        tokens = sum(loaded.served.tokens(texts))  # the fast tokenizer, beside the pass under way
        loop = asyncio.get_running_loop()
        waiting = _PendingTexts(loaded, texts, similarities, layer, loop.create_future(), tokens,
                                time.perf_counter())
        self._texts.append(waiting)
        self.queued_inputs += len(texts)
        self.queued_tokens += tokens
        if not self._draining:
            self._draining = True
            self._drain = asyncio.ensure_future(self._drain_texts())
        watcher = None if gone is None else asyncio.ensure_future(gone())
        if watcher is not None:
            watcher.add_done_callback(lambda done: self._client_gone(waiting, done))
        try:
            return await waiting.result
        finally:
            if watcher is not None:
                watcher.cancel()

    def retry_after(self) -> int:
        """Whole seconds the waiting tokens take at the measured rate (at least 1)."""
        if self._tokens_per_second <= 0:
            return 1
        return max(1, math.ceil(self.queued_tokens / self._tokens_per_second))

    def _client_gone(self, waiting: _PendingTexts, watcher: asyncio.Future[object]) -> None:
        if watcher.cancelled() or watcher.exception() is not None or waiting.result.done():
            return
        if waiting in self._texts:  # still waiting: out of the queue, never computed
            self._texts.remove(waiting)
            self._dequeued(waiting)
            if self.observer is not None:
                self.observer.observe_text_refused("client_gone", len(waiting.texts))
        waiting.result.set_exception(ClientGone("the client closed its connection"))

    def _dequeued(self, waiting: _PendingTexts) -> None:
        self.queued_inputs -= len(waiting.texts)
        self.queued_tokens -= waiting.tokens

    def _take(self) -> list[_PendingTexts]:
        """The next batch: the oldest waiting request's model and layer, and the requests
        of the same after it, first in first out, while their tokens fit the budget."""
        first = self._texts[0]
        key = (id(first.loaded), first.layer)
        batch, tokens, rest = [first], first.tokens, []
        for i, w in enumerate(self._texts[1:], 1):
            if (id(w.loaded), w.layer) != key:
                rest.append(w)
                continue
            if tokens + w.tokens > self.batch_tokens:
                rest.extend(self._texts[i:])
                break
            batch.append(w)
            tokens += w.tokens
        self._texts = rest
        for w in batch:
            self._dequeued(w)
        return batch

    async def _drain_texts(self) -> None:
        """Compute the waiting texts, a batch at a time, until none wait."""
        loop = asyncio.get_running_loop()
        try:
            while self._texts:
                await asyncio.sleep(0)  # the end of this round: the texts that arrived together
                if not self._texts:  # their clients have all gone
                    break
                group = self._take()
                self.forward_passes += 1
                started = time.perf_counter()
                try:
                    outcome: tuple[torch.Tensor, torch.Tensor | None] | Exception = (
                        await loop.run_in_executor(self._pool, _texts_batch, group, self.text_threads))
                except Exception as exc:
                    outcome = exc
                compute = time.perf_counter() - started
                tokens = sum(w.tokens for w in group)
                if not isinstance(outcome, Exception) and compute > 0:
                    rate = tokens / compute
                    self._tokens_per_second = (rate if self._tokens_per_second <= 0 else
                                               0.8 * self._tokens_per_second + 0.2 * rate)
                if self.observer is not None:
                    self.observer.observe_text_batch(sum(len(w.texts) for w in group), tokens,
                                                     [started - w.arrived for w in group], compute)
                _hand_out(group, [len(w.texts) for w in group], outcome)
        finally:
            self._draining = False

    def _flush(self) -> None:
        groups, self._pending = self._pending, {}
        for group in groups.values():
            self.forward_passes += 1
            try:
                x = group[0].x if len(group) == 1 else torch.cat([p.x for p in group])
                h, sims = forward(group[0].loaded, x, any(p.similarities for p in group))
            except Exception as exc:
                _hand_out(group, [len(p.x) for p in group], exc)
                continue
            _hand_out(group, [len(p.x) for p in group], (h, sims))


def _hand_out(group: Sequence[_Pending | _PendingTexts], sizes: list[int],
              outcome: tuple[torch.Tensor, torch.Tensor | None] | Exception) -> None:
    """Each waiting request of a batch its rows of the batch's answer (``sizes``: its rows,
    in order), or every one the batch's error; those whose clients have gone are passed by."""
    start = 0
    for waiting, size in zip(group, sizes, strict=True):
        stop = start + size
        if not waiting.result.done():
            if isinstance(outcome, Exception):
                waiting.result.set_exception(outcome)
            else:
                h, sims = outcome
                waiting.result.set_result((h[start:stop], sims[start:stop]
                                           if sims is not None and waiting.similarities else None))
        start = stop


@dataclass(eq=False)  # compared by identity: the queue removes this one, not an equal one
class _PendingTexts:
    loaded: LoadedModel
    texts: list[str]
    similarities: bool
    layer: Layer
    result: asyncio.Future[tuple[torch.Tensor, torch.Tensor | None]]
    tokens: int
    arrived: float  # time.perf_counter() when it was queued


def _frozen_encoder(loaded: LoadedModel) -> bool:
    """Whether the model's inputs go through a frozen pretrained encoder first."""
    record = EncoderRecord.of(loaded.preprocessing)
    return record is not None and not record.fine_tuned


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """This thread's torch threads at ``n`` for the block, then as they were: OpenMP's count
    is the calling thread's own, so the event loop and the pool's other work keep theirs."""
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _texts_batch(group: list[_PendingTexts], threads: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One batch of waiting texts (one model, one layer), on ``threads`` torch threads: the
    frozen encoder's features (on the run's recorded path), then the head's h and
    similarities where asked."""
    loaded = group[0].loaded
    with torch_threads(threads):
        x = prepare([t for w in group for t in w.texts], loaded)
        if group[0].layer == "encoder":
            return loaded.served.embed(x, "encoder"), None
        h, sims = forward(loaded, x, any(w.similarities for w in group))
    return h, sims if any(w.similarities for w in group) else None


@dataclass
class _Pending:
    loaded: LoadedModel
    x: torch.Tensor
    similarities: bool
    result: asyncio.Future[tuple[torch.Tensor, torch.Tensor | None]]


def _slice(raw: np.ndarray | list[str], start: int, stop: int, loaded: LoadedModel,
           h: np.ndarray, sims: np.ndarray | None, layer: Layer = "head") -> None:
    """Rows start:stop of a large batch, prepared, computed and written into h (and sims)."""
    x = prepare(raw[start:stop], loaded)
    if layer == "encoder":
        h[start:stop] = loaded.served.embed(x, "encoder").numpy()
        return
    h_part, sims_part = forward(loaded, x, sims is not None)
    h[start:stop] = h_part.numpy()
    if sims is not None:
        sims[start:stop] = sims_part.numpy()


def forward(
    loaded: LoadedModel, x: torch.Tensor, similarities: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Representations and (if asked; else an empty tensor) similarities to every class."""
    h, sims = loaded.served.forward(x, similarities)
    return h, torch.empty(0) if sims is None else sims


async def model_for(state: ServingState, experiment_id: int) -> LoadedModel:
    """The experiment's served model: from the API process's cache, or loaded once from
    its best checkpoint (off the event loop)."""
    loaded: LoadedModel | None = state.model_cache.peek(experiment_id)
    if loaded is not None:
        return loaded
    return await run_in_threadpool(load_model, state, experiment_id)


def load_model(state: ServingState, experiment_id: int) -> LoadedModel:
    """:func:`model_for` on the calling thread."""

    def load() -> LoadedModel:
        with session_scope(state.sessionmaker) as session:
            loaded = load_from_database(session, experiment_id, state.settings.device, state.settings)
        warm_texts(loaded, state.settings.text_threads)
        return loaded

    return state.model_cache.get(experiment_id, load)


WARM_TEXT = "corel warms this model before it answers."


def warm_texts(loaded: LoadedModel, threads: int) -> None:
    """A model on a frozen text encoder computes one text on the text passes' ``threads``
    while it loads: the encoder's weights, and the ONNX Runtime session its served texts run
    on (made for that thread count; about 1.5 s for MiniLM), are then ready before the
    first request, which would otherwise wait for them. A failure is logged: the first
    request then meets it and answers it."""
    if loaded.modality != "text" or not _frozen_encoder(loaded):
        return
    try:
        with torch_threads(threads):
            loaded.served.prepare([WARM_TEXT])
    except Exception as exc:  # logged; a request gets the error itself
        log.warning("a text model could not be warmed", extra={"experiment_id": loaded.experiment_id,
                                                               "error": f"{type(exc).__name__}: {exc}"})


async def infer(state: ServingState, req: InferenceRequest, similarities: bool,
                layer: Layer = "head", gone: Callable[[], Awaitable[object]] | None = None,
                ) -> tuple[LoadedModel, torch.Tensor, torch.Tensor | None]:
    """The one service behind /embed and /predict: the batch checked, the model got, the
    inputs run through it (batched with other requests'), the time recorded. ``layer``: the
    head's representations, or a pretrained encoder's own (a 422 for a run without one).
    ``gone``: returns once the client has closed its connection (its texts then leave the
    queue)."""
    check_batch(req, state.settings.max_embed_batch)
    assert req.experiment_id is not None  # a model named by version is resolved to its run first
    loaded = await model_for(state, req.experiment_id)
    try:
        loaded.served.check_layer(layer)
    except ValueError as exc:
        raise InvalidInput(f"experiment {loaded.experiment_id}: {exc}") from exc
    started = time.perf_counter()
    h, sims = await state.inference.run(req, loaded, similarities, layer, gone)
    state.metrics.observe_inference("predict" if similarities else "embed", batch_size(req),
                                    time.perf_counter() - started)
    return loaded, h, sims


def encode_binary(array: np.ndarray) -> dict[str, Any]:
    array = np.ascontiguousarray(array, dtype="<f4")
    return {"dtype": "float32", "shape": list(array.shape),
            "data": pybase64.b64encode(array.tobytes()).decode("ascii")}
