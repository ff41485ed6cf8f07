"""A Python client of the corel service, in the library itself (no service extra needed).

    from corel.client import Client

    corel = Client("http://127.0.0.1:8000", token="...")      # token: None in the open mode
    run = corel.train({"dataset": "digits", "budget": "quick"}).wait(progress=True)
    h = run.embed(arrays=digits_images)                          # numpy (N, dim)
    print(run.predict(arrays=digits_images).class_names)
    print(run.neighbors(arrays=digits_images, k=5)[0])
    print(run.clustering()["results"]["kmeans"]["accuracy"])

Built on the standard library's ``http.client`` rather than on the generated models or
httpx: the library's install holds neither (``pip install corel`` is torch, numpy and
pydantic), the client should work where the library does, and the few routes a user
calls are stable. Uploads stream from disk (chunked multipart, never read whole); a 503
(the service's dependency restarting) or a connection refused is retried, honouring
``Retry-After``; every other error is a :class:`CorelError` carrying the service's own
message and status.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import numpy as np

__all__ = ["Client", "CorelError", "Embeddings", "Experiment", "Model", "Predictions", "Promotion", "Sweep"]

CHUNK = 1 << 20
"""Bytes an upload sends at a time."""

TERMINAL = ("succeeded", "failed", "cancelled")


class CorelError(Exception):
    """An answer of the service that is not a success: ``status`` (the HTTP status, 0 when
    none came) and ``message`` (the service's own words, its ``detail``)."""

    def __init__(self, status: int, message: str, body: Any = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.body = body


@dataclass
class Embeddings:
    """What ``/embed`` answered: the representations (float32, one row per input), the
    layer, the checkpoint (``epoch``, ``sha256``) and any per-input warning."""

    h: np.ndarray
    layer: str
    checkpoint: dict[str, Any]
    warnings: list[str | None] = field(default_factory=list)
    model_version: int | None = None  # the version that answered, when a model was named


@dataclass
class Predictions:
    """What ``/predict`` answered: each input's class index and name, and its similarity
    to every class (rows), with the class names."""

    classes: list[int]
    class_names: list[str]
    similarities: np.ndarray
    names: list[str]
    warnings: list[str | None] = field(default_factory=list)
    model_version: int | None = None  # the version that answered, when a model was named


class Client:
    """The service at ``url``; ``token``: a bearer token (``corel users token``), None in
    the open mode. ``retries`` times a 503 or a refused connection is tried again, after
    the ``Retry-After`` the service gives (else ``backoff`` seconds, doubling)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 120.0, retries: int = 5,
                 backoff: float = 0.5) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host[:port], not {url!r}")
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff

    # -- the routes ---------------------------------------------------------------------

    def train(self, spec: Mapping[str, Any]) -> Experiment:
        """Submit an experiment (``POST /experiments``): its :class:`Experiment`, queued.
        The spec's warnings (a budget overridden, a lam that diverges) are on it."""
        body = self.request("POST", "/experiments", json_body=dict(spec))
        return Experiment(self, int(body["id"]), warnings=list(body.get("warnings") or []))

    def experiment(self, experiment_id: int) -> Experiment:
        """An existing experiment."""
        return Experiment(self, int(experiment_id))

    def get_sweep(self, sweep_id: int) -> Sweep:
        """An existing sweep."""
        sweep = Sweep(self, int(sweep_id))
        sweep.refresh()
        return sweep

    def sweep(self, base: Mapping[str, Any], grid: Mapping[str, Sequence[Any]], **fields: Any) -> Sweep:
        """Submit a sweep (``POST /sweeps``): ``base`` a spec, ``grid`` the values of each
        field to cross; ``fields``: the body's others, e.g. ``fewshot={"shots": [8, 16, 64],
        "splits": 10}`` for a few-shot sweep (its figures: :meth:`Sweep.fewshot`)."""
        body = self.request("POST", "/sweeps", json_body={"base": dict(base),
                                                          "grid": {k: list(v) for k, v in grid.items()}, **fields})
        sweep = Sweep(self, int(body["id"]))
        sweep.refresh()
        return sweep

    def create_model(self, name: str, description: str | None = None) -> Model:
        """``POST /models``: a new model with a name (you own it)."""
        self.request("POST", "/models", json_body={"name": name, "description": description})
        model = Model(self, name)
        model.refresh()
        return model

    def model(self, name: str) -> Model:
        """An existing model, by name."""
        model = Model(self, name)
        model.refresh()
        return model

    def upload(self, path: str | os.PathLike[str], kind: str | None = None) -> dict[str, Any]:
        """Upload a dataset file (``POST /datasets``), streamed from disk: its row (``id``,
        ``summary``). ``kind``: as the route takes it (``text``, ``images``, ...)."""
        return self.request("POST", "/datasets", files={"file": Path(path)},
                            form={"kind": kind} if kind else {})

    # -- plumbing -------------------------------------------------------------------------

    def request(self, method: str, path: str, *, json_body: Any = None, query: Mapping[str, Any] | None = None,
                files: Mapping[str, Path] | None = None, form: Mapping[str, str] | None = None) -> Any:
        """One call, its JSON answer; CorelError for an error answer, after the retries."""
        target = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        delay = self.backoff
        for attempt in range(self.retries + 1):
            headers = {"Accept": "application/json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            body: Any = None
            if files:
                boundary = uuid.uuid4().hex
                headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
                headers["Transfer-Encoding"] = "chunked"
                body = _multipart(boundary, form or {}, files)
            elif json_body is not None:
                headers["Content-Type"] = "application/json"
                body = json.dumps(json_body).encode()
            conn = (http.client.HTTPSConnection if self._https else http.client.HTTPConnection)(
                self._host, self._port, timeout=self.timeout)
            try:
                conn.request(method, target, body=body, headers=headers, encode_chunked=bool(files))
                answer = conn.getresponse()
                status, raw = answer.status, answer.read()
                retry_after = answer.getheader("Retry-After")
            except ConnectionRefusedError as exc:
                if attempt == self.retries:
                    raise CorelError(0, f"the service at {self.url} refused the connection ({exc})") from exc
                time.sleep(delay)
                delay *= 2
                continue
            finally:
                conn.close()
            if status == 503 and attempt < self.retries:
                time.sleep(float(retry_after) if retry_after and retry_after.isdigit() else delay)
                delay *= 2
                continue
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            if status >= 400:
                detail = parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed
                raise CorelError(status, detail if isinstance(detail, str) else json.dumps(detail), parsed)
            return parsed
        raise AssertionError("unreachable")


def _multipart(boundary: str, form: Mapping[str, str], files: Mapping[str, Path]) -> Iterator[bytes]:
    """A multipart body, a chunk at a time: the files read from disk as it is sent."""
    for name, value in form.items():
        yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
               f"{value}\r\n").encode()
    for name, file in files.items():
        yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; "
               f"filename=\"{file.name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
        with open(file, "rb") as fh:
            while chunk := fh.read(CHUNK):
                yield chunk
        yield b"\r\n"
    yield f"--{boundary}--\r\n".encode()


def _inputs(texts: Sequence[str] | None, arrays: Any, images: Sequence[str | os.PathLike[str]] | None
            ) -> dict[str, Any]:
    given = [k for k, v in (("texts", texts), ("arrays", arrays), ("images", images)) if v is not None]
    if len(given) != 1:
        raise ValueError("give exactly one of texts, arrays or images")
    if texts is not None:
        if isinstance(texts, str):
            raise ValueError("texts is a list of strings; wrap one text: [text]")
        return {"texts": list(texts)}
    if arrays is not None:
        a = np.ascontiguousarray(arrays)
        if a.dtype == np.uint8 or a.dtype == np.float32:  # compact: base64 of the bytes
            import base64

            return {"binary": {"dtype": str(a.dtype), "shape": list(a.shape),
                               "data": base64.b64encode(a.astype(a.dtype.newbyteorder("<")).tobytes()).decode()}}
        return {"arrays": a.tolist()}
    import base64

    return {"images": [base64.b64encode(Path(p).read_bytes()).decode() for p in images or []]}


def _embed(client: Client, which: dict[str, Any], inputs: dict[str, Any], layer: str) -> Embeddings:
    body = client.request("POST", "/embed", json_body={**which, "layer": layer, **inputs})
    return Embeddings(np.asarray(body["embeddings"], dtype=np.float32), body["layer"], body["checkpoint"],
                      list(body.get("warnings") or [None] * int(body["n"])), body.get("model_version"))


def _predict(client: Client, which: dict[str, Any], inputs: dict[str, Any]) -> Predictions:
    body = client.request("POST", "/predict", json_body={**which, **inputs})
    rows = body["predictions"]
    return Predictions([int(p["class_index"]) for p in rows], list(body["class_names"]),
                       np.asarray([p["similarities"] for p in rows], dtype=np.float32),
                       [str(p["class_name"]) for p in rows], [p.get("warning") for p in rows],
                       body.get("model_version"))


class Model:
    """A model with a name (``/models/{name}``): its numbered versions, each a run, served
    by name (``"name:N"``)."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name
        self.body: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Model({self.name!r})"

    def refresh(self) -> dict[str, Any]:
        """``GET /models/{name}``: its contract and versions."""
        self.body = self.client.request("GET", f"/models/{self.name}")
        return self.body

    @property
    def versions(self) -> dict[int, int]:
        """Each version's run (experiment id), as last read."""
        return {int(v["version"]): int(v["experiment_id"]) for v in self.body.get("versions", [])}

    def add_version(self, experiment: Experiment | int) -> int:
        """``POST /models/{name}/versions``: the run as the next version; its number."""
        run = experiment.id if isinstance(experiment, Experiment) else int(experiment)
        body = self.client.request("POST", f"/models/{self.name}/versions", json_body={"experiment_id": run})
        self.refresh()
        return int(body["version"])

    @property
    def aliases(self) -> dict[str, int]:
        """Each alias's version, as last read."""
        return {str(k): int(v) for k, v in self.body.get("aliases", {}).items()}

    def promote(self, version: int, alias: str, *, force: bool = False, margin: float | None = None,
                protected: bool | None = None) -> Promotion:
        """``POST /models/{name}/aliases/{alias}``: move ``alias`` to ``version`` through the
        gate, expecting the alias where it was last read (:meth:`refresh`); :meth:`Promotion.wait`
        for its outcome."""
        self.refresh()
        body: dict[str, Any] = {"version": int(version), "expected_version": self.aliases.get(alias),
                                "force": force}
        if margin is not None:
            body["margin"] = margin
        if protected is not None:
            body["protected"] = protected
        answer = self.client.request("POST", f"/models/{self.name}/aliases/{alias}", json_body=body)
        return Promotion(self, int(answer["promotion_id"]), answer)

    def history(self, alias: str) -> list[dict[str, Any]]:
        """Every move of ``alias``: from, to, who, when, the promotion and its gate's summary."""
        return list(self.client.request("GET", f"/models/{self.name}/aliases/{alias}/history"))

    def _which(self, version: int | None, alias: str | None) -> dict[str, Any]:
        if (version is None) == (alias is None):
            raise ValueError("give exactly one of version and alias")
        return {"model": f"{self.name}:{int(version)}" if version is not None else f"{self.name}@{alias}"}

    def embed(self, texts: Sequence[str] | None = None, arrays: Any = None,
              images: Sequence[str | os.PathLike[str]] | None = None, *, version: int | None = None,
              alias: str | None = None, layer: str = "head") -> Embeddings:
        """``/embed`` by a version of the model, or by an alias (the version it names now)."""
        return _embed(self.client, self._which(version, alias), _inputs(texts, arrays, images), layer)

    def predict(self, texts: Sequence[str] | None = None, arrays: Any = None,
                images: Sequence[str | os.PathLike[str]] | None = None, *, version: int | None = None,
                alias: str | None = None) -> Predictions:
        """``/predict`` by a version of the model, or by an alias."""
        return _predict(self.client, self._which(version, alias), _inputs(texts, arrays, images))


class Promotion:
    """A promotion of a model's alias (``/models/{name}/promotions/{id}``)."""

    ENDED = ("succeeded", "refused", "conflict", "failed")

    def __init__(self, model: Model, promotion_id: int, body: dict[str, Any]) -> None:
        self.model = model
        self.id = promotion_id
        self.body = body

    def __repr__(self) -> str:
        return f"Promotion({self.model.name!r}, {self.id}, {self.status!r})"

    @property
    def status(self) -> str:
        return str(self.body.get("status", "unknown"))

    @property
    def report(self) -> dict[str, Any] | None:
        """The gate's report (figures, intervals, per-class recall, passed, reason)."""
        return self.body.get("report")

    def refresh(self) -> dict[str, Any]:
        self.body = self.model.client.request("GET", f"/models/{self.model.name}/promotions/{self.id}")
        return self.body

    def wait(self, timeout: float | None = None, poll: float = 0.5) -> Promotion:
        """Until it ends: succeeded, refused, conflict or failed (:attr:`status`, :attr:`report`).
        CorelError when ``timeout`` seconds pass first."""
        started = time.monotonic()
        while self.refresh()["status"] not in self.ENDED:
            if timeout is not None and time.monotonic() - started > timeout:
                raise CorelError(0, f"promotion {self.id} is still {self.status} after {timeout:g} s")
            time.sleep(poll)
        self.model.refresh()
        return self


class Experiment:
    """One experiment of the service: its state (:meth:`refresh`), and once it succeeded
    (or was cancelled with a best checkpoint), its model."""

    def __init__(self, client: Client, experiment_id: int, warnings: list[str] | None = None) -> None:
        self.client = client
        self.id = experiment_id
        self.warnings = warnings or []
        self.body: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Experiment({self.id}, {self.status!r})"

    @property
    def status(self) -> str:
        return str(self.body.get("status", "unknown"))

    def refresh(self) -> dict[str, Any]:
        """``GET /experiments/{id}``: its row (status, epochs, accuracies, spec, warnings)."""
        self.body = self.client.request("GET", f"/experiments/{self.id}")
        self.warnings = list(self.body.get("warnings") or [])
        return self.body

    def wait(self, timeout: float | None = None, progress: bool = False, poll: float = 0.5) -> Experiment:
        """Until it ends (succeeded, failed or cancelled); ``progress``: a bar of its epochs.
        CorelError if it failed (its error) or ``timeout`` seconds passed."""
        started = time.monotonic()
        bar = None
        try:
            while True:
                body = self.refresh()
                if progress:
                    if bar is None:
                        from tqdm.auto import tqdm

                        bar = tqdm(total=int(body.get("epochs_total") or 0), desc=f"experiment {self.id}",
                                   unit="epoch")
                    bar.n = int(body.get("current_epoch") or 0)
                    bar.set_postfix_str(body.get("phase") or body["status"])
                    bar.refresh()
                if body["status"] in TERMINAL:
                    break
                if timeout is not None and time.monotonic() - started > timeout:
                    raise CorelError(0, f"experiment {self.id} is still {body['status']} after {timeout:g} s")
                time.sleep(poll)
        finally:
            if bar is not None:
                bar.close()
        if body["status"] == "failed":
            raise CorelError(0, f"experiment {self.id} failed: {body.get('error')}", body)
        return self

    def embed(self, texts: Sequence[str] | None = None, arrays: Any = None,
              images: Sequence[str | os.PathLike[str]] | None = None, layer: str = "head") -> Embeddings:
        """``/embed``: the representations of new inputs (texts, arrays, or image files)."""
        return _embed(self.client, {"experiment_id": self.id}, _inputs(texts, arrays, images), layer)

    def predict(self, texts: Sequence[str] | None = None, arrays: Any = None,
                images: Sequence[str | os.PathLike[str]] | None = None) -> Predictions:
        """``/predict``: each input's class and its similarity to every class."""
        return _predict(self.client, {"experiment_id": self.id}, _inputs(texts, arrays, images))

    def neighbors(self, texts: Sequence[str] | None = None, arrays: Any = None,
                  images: Sequence[str | os.PathLike[str]] | None = None, k: int = 10) -> list[dict[str, Any]]:
        """``/experiments/{id}/neighbors``: per input, its ``k`` nearest training rows
        (``id``: its row in the data trained on, ``label``, ``class_name``, ``distance``,
        and its ``text`` or ``image_url``), the vote and the prediction."""
        body = self.client.request("POST", f"/experiments/{self.id}/neighbors",
                                   json_body={"k": k, **_inputs(texts, arrays, images)})
        return list(body["results"])

    def clustering(self, **query: Any) -> dict[str, Any]:
        """``/experiments/{id}/clustering``: K-Means and Gaussian-mixture scores of its latent space."""
        return dict(self.client.request("GET", f"/experiments/{self.id}/clustering", query=query or None))

    def cancel(self) -> dict[str, Any]:
        return dict(self.client.request("POST", f"/experiments/{self.id}/cancel"))


class Sweep:
    """A sweep of the service and its experiments."""

    def __init__(self, client: Client, sweep_id: int) -> None:
        self.client = client
        self.id = sweep_id
        self.experiments: list[Experiment] = []

    def refresh(self) -> dict[str, Any]:
        """``GET /sweeps/{id}``: its progress, and its experiments."""
        body = dict(self.client.request("GET", f"/sweeps/{self.id}"))
        self.experiments = [Experiment(self.client, int(i)) for i in body["experiment_ids"]]
        return body

    def wait(self, timeout: float | None = None, progress: bool = False) -> Sweep:
        """Until every experiment ends (CorelError where one failed)."""
        for e in self.experiments:
            e.wait(timeout=timeout, progress=progress)
        return self

    def report(self) -> dict[str, Any]:
        return dict(self.client.request("GET", f"/sweeps/{self.id}/report"))

    def fewshot(self) -> dict[str, Any] | None:
        """A few-shot sweep's figures (the report's ``fewshot``: per N and method the mean,
        sd, min, max and the paired difference against the best with its p-value); None for
        another sweep."""
        found = self.report().get("fewshot")
        return dict(found) if found is not None else None
