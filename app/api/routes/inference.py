"""POST /embed and POST /predict over trained experiments."""

from __future__ import annotations

import copy
import csv
import io
from typing import Any, TypeVar

import numpy as np
import orjson
import pybase64
import torch
from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app.api.deps import require_access, resolve_model, search_collection
from app.api.openapi import without_nulls
from app.api.state import state_of
from app.core.errors import (
    MAX_ID,
    NO_CONTENT_TYPE,
    InvalidInput,
    PayloadTooLarge,
    check_id,
    describe_errors,
    json_kind,
    route_of,
    send_hint,
)
from app.core.schemas.inference import (
    INPUT_KINDS,
    EmbedRead,
    EmbedRequest,
    InferenceRequest,
    NeighborsRead,
    NeighborsRequest,
    PredictRead,
)
from app.core.schemas.models import ModelNeighborsRequest
from app.serving import inference
from app.serving import neighbors as neighbors_service
from app.serving.model_cache import LoadedModel
from corel.data.tables import delimiter_of
from corel.layers import Layer

router = APIRouter(tags=["inference"])
JSON, FORM = "application/json", "multipart/form-data"

# The answers' schemas (the routes build their JSON themselves, with orjson: the models
# document it, for clients generated from the document, and schemathesis checks it).
EMBED_READ: dict[int | str, dict[str, Any]] = {200: {"model": EmbedRead, "description": "The representations"}}
PREDICT_READ: dict[int | str, dict[str, Any]] = {200: {"model": PredictRead, "description": "The predictions"}}
NEIGHBORS_READ: dict[int | str, dict[str, Any]] = {200: {"model": NeighborsRead, "description": "The neighbours"}}

def by_kind(model: type[InferenceRequest], prefix: str, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON body of ``model`` as a oneOf of named object schemas, one per input kind
    (``<prefix>Texts``, ``<prefix>Images``, ...), each requiring its kind and taking no
    other: a client generator types each as a model of its own (a bare oneOf of ``required``
    lists it typed as Any). ``drop``: fields the route takes elsewhere (the path's id)."""
    full = without_nulls(model.model_json_schema())
    defs: dict[str, Any] = dict(full.pop("$defs", {}))
    props = {k: v for k, v in full["properties"].items() if k not in drop}
    required = [r for r in full.get("required", []) if r not in drop]
    refs = []
    for kind in INPUT_KINDS:
        name = f"{prefix}{kind.capitalize()}"
        defs[name] = {
            "type": "object", "title": name, "additionalProperties": False,
            "description": f"{full.get('description', '')} These inputs: {kind}.".strip(),
            "properties": {k: v for k, v in props.items() if k == kind or k not in INPUT_KINDS},
            "required": [*required, kind]}
        refs.append({"$ref": f"#/$defs/{name}"})
    return {"oneOf": refs, "$defs": defs}


_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": by_kind(InferenceRequest, "Predict")},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["experiment_id", "files"],
                    "properties": {
                        "experiment_id": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                        "files": {"type": "array", "minItems": 1,
                                  "items": {"type": "string", "format": "binary"},
                                  "description": "PNG/JPEG images or UTF-8 text files (one input "
                                  "each), or CSV files with a header row (one input per row: "
                                  "feature columns by name for models trained from a feature "
                                  "table, a column of texts for text models (as rows takes it); "
                                  "cells separated by commas, semicolons, tabs or |, as "
                                  "the header row is). Answers name each input by its file (and "
                                  "row)."},
                        "output": {"type": "string", "enum": ["json", "binary"]},
                    },
                }
            },
        },
    }
}


def only(doc: dict[str, Any], media_type: str) -> dict[str, Any]:
    """``doc`` with its request body in ``media_type`` alone: one operation, one body (a
    generated client types an operation of two bodies badly; openapi-python-client 0.29.1
    writes one that does not import). The JSON form is on the route itself, the files on
    ``<route>/files``; each route takes either, as it always has."""
    out = copy.deepcopy(doc)
    out["requestBody"]["content"] = {media_type: out["requestBody"]["content"][media_type]}
    return out


def _embed_doc() -> dict[str, Any]:
    """/embed takes the bodies of /predict, and which layer to return (in a form or the
    octet-stream query too)."""
    doc = copy.deepcopy(_BODY_DOC)
    content = doc["requestBody"]["content"]
    schema = without_nulls(EmbedRequest.model_json_schema())
    content["application/json"]["schema"] = by_kind(EmbedRequest, "Embed")
    content["multipart/form-data"]["schema"]["properties"]["layer"] = schema["properties"]["layer"]
    return doc


def _neighbors_doc() -> dict[str, Any]:
    """/neighbors takes /embed's bodies, the experiment in the path, and k."""
    doc = copy.deepcopy(_BODY_DOC)
    content = doc["requestBody"]["content"]
    schema = without_nulls(NeighborsRequest.model_json_schema())
    content["application/json"]["schema"] = by_kind(NeighborsRequest, "Neighbors", drop=("experiment_id",))
    form = content["multipart/form-data"]["schema"]
    form["properties"].pop("experiment_id")
    form["properties"]["k"] = schema["properties"]["k"]
    form["required"] = ["files"]
    return doc


def _raw_request(request: Request, data: bytes, schema: type[Req],
                 path_id: int | None) -> Req:
    """application/octet-stream: the array's bytes as the body, the rest in the query
    (``?experiment_id=1&dtype=uint8&shape=1024,28,28``): no base64, no JSON."""
    q = request.query_params
    try:
        shape = [int(v) for v in q.get("shape", "").split(",") if v.strip()]
    except ValueError as exc:
        raise InvalidInput("shape: give the array's shape as comma-separated integers") from exc
    body = {"experiment_id": q.get("experiment_id"), "output": q.get("output", "json"),
            "binary": {"dtype": q.get("dtype", ""), "shape": shape, "data": ""},
            **{k: q[k] for k in ("model", *schema.EXTRA_FIELDS) if k in q}}
    _from_path(body, path_id)
    try:
        req = schema.model_validate(body)
    except ValidationError as exc:
        raise InvalidInput(describe_errors(exc.errors()) + " (octet-stream bodies take experiment_id, dtype "
                           "and shape as query parameters)") from exc
    req._raw = data
    return req


Req = TypeVar("Req", bound=InferenceRequest)


def _from_path(body: dict[str, Any], path_id: int | None) -> None:
    """An experiment id in the path (/experiments/{id}/neighbors) is the request's own."""
    if path_id is None:
        return
    given = body.get("experiment_id")
    if given is not None and str(given) != str(path_id):
        raise InvalidInput(f"experiment_id {given} differs from the path's experiment {path_id}; "
                           "leave it out of the body")
    body["experiment_id"] = path_id


async def _read_request(request: Request, schema: type[Req] = InferenceRequest,  # type: ignore[assignment]
                        path_id: int | None = None) -> Req:
    """The inputs of /embed, /predict (or /neighbors, with ``schema`` and the path's id),
    whichever way they came: JSON, multipart, or an octet-stream body."""
    settings = state_of(request).settings
    content_type = request.headers.get("content-type", "")
    route = (route_of(request) or "").removesuffix("/files")  # the files routes take every form too
    media = content_type.split(";")[0].strip().lower()
    if content_type.startswith("application/octet-stream"):
        return _raw_request(request, await request.body(), schema, path_id)
    if content_type.startswith("multipart/form-data"):
        form = await request.form(max_files=settings.max_embed_batch + 1)
        files = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
        if len(files) > settings.max_embed_batch:
            raise PayloadTooLarge(
                f"a request may carry at most {settings.max_embed_batch} inputs; this one has more"
            )
        contents = [await f.read() for f in files]
        experiment_id = form.get("experiment_id")
        output = form.get("output") or "json"
        body: dict[str, Any] = {"output": output,
                                **{k: form.get(k) for k in schema.EXTRA_FIELDS if form.get(k)}}
        model = form.get("model")
        if path_id is None and isinstance(model, str) and experiment_id is None:
            body["model"] = model
        elif path_id is None:
            if not isinstance(experiment_id, str) or not experiment_id.strip().isdigit():
                raise InvalidInput("experiment_id: a multipart request needs an integer "
                                   "experiment_id field (or a model field: \"name:N\")")
            body["experiment_id"] = int(experiment_id)
        else:
            body["experiment_id"] = experiment_id if isinstance(experiment_id, str) else None
            _from_path(body, path_id)
        names = [f.filename or f"input {i}" for i, f in enumerate(files)]
        tables = [_is_csv(f) for f in files]
        if any(tables) and not all(tables):
            raise InvalidInput("send either CSV files (rows of feature columns) or inputs of "
                               "one kind each (images, or text files), not both in one request")
        if files and all(tables):
            body["rows"], names = _csv_rows(files, contents, settings.max_embed_batch)
        elif files and all((f.content_type or "").startswith("text/") for f in files):
            texts = []
            for i, raw in enumerate(contents):
                try:
                    texts.append(raw.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise InvalidInput(f"input {i}: text is not valid UTF-8 ({exc.reason})") from exc
            body["texts"] = texts
        else:
            body["images"] = [pybase64.b64encode(c).decode("ascii") for c in contents]
        raw_body: Any = body
    else:
        if not media:  # as on every route (app.core.errors.NO_CONTENT_TYPE)
            raise InvalidInput(NO_CONTENT_TYPE)
        if media != "application/json" and not media.endswith("+json"):
            raise InvalidInput(f"POST {route.replace(':int}', '}')} takes a JSON object (Content-Type: "
                               "application/json), multipart/form-data at "
                               f"POST {route.replace(':int}', '}')}/files, or an octet-stream array; "
                               f"this body came as {media}")
        data = await request.body()
        if path_id is None:
            try:
                return schema.model_validate_json(data)
            except ValidationError as exc:
                raise InvalidInput(describe_errors(exc.errors(), route=route)) from exc
        try:
            raw_body = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"the body is not valid JSON ({exc}); {send_hint(route)}") from exc
        if not isinstance(raw_body, dict):
            raise InvalidInput(f"the body must be a JSON object, not {json_kind(raw_body)}; "
                               f"{send_hint(route)}")
        _from_path(raw_body, path_id)
        names = None
    try:
        req = schema.model_validate(raw_body)
    except ValidationError as exc:
        raise InvalidInput(describe_errors(exc.errors(), route=route)) from exc
    req._names = names
    return req


def _is_csv(f: UploadFile) -> bool:
    return (f.filename or "").lower().endswith(".csv") or (f.content_type or "").split(";")[0] in (
        "text/csv", "application/csv")


def _csv_rows(files: list[UploadFile], contents: list[bytes],
              limit: int) -> tuple[list[dict[str, str]], list[str]]:
    """Each CSV's rows (a header row names the columns), and a name for each row."""
    rows: list[dict[str, str]] = []
    names: list[str] = []
    for f, raw in zip(files, contents, strict=True):
        name = f.filename or "the CSV"
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{name}: not UTF-8 text ({exc.reason}); save it as UTF-8") from exc
        reader = csv.DictReader(io.StringIO(text), delimiter=delimiter_of(text.split("\n", 1)[0]))
        if not reader.fieldnames:
            raise InvalidInput(f"{name}: empty; a CSV needs a header row naming its columns")
        for k, row in enumerate(reader, 1):
            if None in row:  # more cells than the header has columns
                raise InvalidInput(f"{name}, row {k}: more cells than the header's "
                                   f"{len(reader.fieldnames)} columns")
            rows.append({key: value.strip() if isinstance(value, str) else value
                         for key, value in row.items()})
            names.append(f"{name}, row {k}")
            if len(rows) > limit:
                raise PayloadTooLarge(f"a request may carry at most {limit} inputs; these CSVs "
                                      "hold more rows")
    return rows, names


@router.post("/experiments/{experiment_id:int}/neighbors",
             summary="The nearest training rows of new inputs, with their classes",
             openapi_extra=only(_neighbors_doc(), JSON), tags=["experiments"], responses=NEIGHBORS_READ)
async def neighbors(experiment_id: int, request: Request) -> Response:
    check_id("experiment", experiment_id)
    req = await _read_request(request, NeighborsRequest, path_id=experiment_id)
    return _json(await neighbors_service.search(state_of(request), req))


@router.post("/experiments/{experiment_id:int}/neighbors/files",
             summary="The nearest training rows of uploaded files (images, texts, CSV rows)",
             openapi_extra=only(_neighbors_doc(), FORM), tags=["experiments"], responses=NEIGHBORS_READ)
async def neighbors_of_files(experiment_id: int, request: Request) -> Response:
    return await neighbors(experiment_id, request)


@router.post("/models/{name}/neighbors", tags=["models"],
             summary="The nearest rows of a model's collection, as the version an alias names "
             "embeds and indexed them", responses=NEIGHBORS_READ)
async def model_neighbors(name: str, request: Request) -> Response:
    """Inputs as /neighbors takes them (``texts``, ``arrays``, ``images``, ...), with
    ``alias``, ``collection`` (the collection's dataset id) and ``k``. The alias and the
    collection's index are read in one statement, so the version that embeds the inputs is
    the one that built the index; the answer names it (``model_version``)."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the body is not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise InvalidInput('the body is a JSON object: {"alias": "production", "collection": D, '
                           '"texts": [...], "k": 10}')
    try:
        asked = ModelNeighborsRequest.model_validate({k: body.get(k) for k in ("alias", "collection", "k")
                                                      if k in body})
    except ValidationError as exc:
        raise InvalidInput(describe_errors(exc.errors())) from exc
    searched = await search_collection(request, name, asked.alias, asked.collection)
    inputs = {k: v for k, v in body.items() if k not in ("alias", "collection")}
    try:
        req = NeighborsRequest.model_validate({**inputs, "experiment_id": searched.experiment_id,
                                               "index_id": searched.index_id})
    except ValidationError as exc:
        raise InvalidInput(describe_errors(exc.errors())) from exc
    # The index was read with the alias, in one statement: not looked up a second time.
    answer = await neighbors_service.search(state_of(request), req, index_checked=True)
    return _json({"model": name, "model_version": searched.version, "alias": asked.alias,
                  "collection": asked.collection, **answer})


def _named(req: InferenceRequest) -> dict[str, Any]:
    """The model and version that answered, for a request that named one."""
    served = req._served
    return {} if served is None else {"model": served.model, "model_version": served.version}


def _json(content: dict[str, Any]) -> Response:
    # orjson writes numpy arrays directly; through jsonable_encoder and json.dumps the float
    # lists cost more than the model does.
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY),
                    media_type="application/json")


async def _infer(
    request: Request, req: InferenceRequest, similarities: bool, layer: Layer = "head"
) -> tuple[LoadedModel, torch.Tensor, torch.Tensor | None]:
    """The request's model, and the representations (of ``layer``) and similarities of its
    inputs. A model named by version (``req.model``) is served to whoever may read the model;
    ``req.experiment_id`` is then its run."""
    if req.model is not None:
        served = await resolve_model(request, req.model)
        req.experiment_id, req._served = served.experiment_id, served
    else:
        assert req.experiment_id is not None  # the schema asks for one of the two
        await require_access(request, "experiment", req.experiment_id)
    return await inference.infer(state_of(request), req, similarities, layer,
                                 gone=lambda: _disconnected(request))


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed its connection: after the body, the next message
    the server sends the app is ``http.disconnect`` (at the latest when the answer is sent;
    the runner stops listening before that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _run(
    request: Request, similarities: bool
) -> tuple[InferenceRequest, LoadedModel, torch.Tensor, torch.Tensor | None]:
    """The request, its model, and the representations (and similarities) of its inputs."""
    req: InferenceRequest = await _read_request(request)
    loaded, h, sims = await _infer(request, req, similarities)
    return req, loaded, h, sims


@router.post("/embed", summary="Representations of new inputs: the final hidden layer (the head's h), "
             "or a pretrained encoder's own (layer)", openapi_extra=only(_embed_doc(), JSON),
             responses=EMBED_READ)
async def embed(request: Request) -> Response:
    req = await _read_request(request, EmbedRequest)
    loaded, h_tensor, _ = await _infer(request, req, similarities=False, layer=req.layer)
    h = h_tensor.numpy()
    if "application/octet-stream" in request.headers.get("accept", ""):
        # A view of the array: Starlette and uvicorn pass it on without a copy.
        return Response(np.ascontiguousarray(h, "<f4").data, media_type="application/octet-stream",
                        headers={"X-Corel-Shape": f"{h.shape[0]},{h.shape[1]}",
                                 "X-Corel-Dtype": "float32",
                                 "X-Corel-Checkpoint": loaded.checkpoint["sha256"],
                                 "X-Corel-Epoch": str(loaded.checkpoint["epoch"]),
                                 "X-Corel-Layer": req.layer})
    out: dict[str, Any] = {
        "experiment_id": loaded.experiment_id,
        **_named(req),
        "checkpoint": loaded.checkpoint,
        "layer": req.layer,
        "dim": int(h.shape[1]),
        "n": int(h.shape[0]),
    }
    if req._names is not None:  # multipart: which file (or CSV row) each row is
        out["inputs"] = req._names
    warned = inference.warnings(req, loaded)
    if any(w is not None for w in warned):  # one per input, null where there is nothing to say
        out["warnings"] = warned
    if req.output == "binary":
        out["embeddings"] = inference.encode_binary(h)
    else:
        out["embeddings"] = h
    return _json(out)


@router.post("/embed/files", summary="Representations of uploaded files (images, texts, CSV rows)",
             openapi_extra=only(_embed_doc(), FORM), responses=EMBED_READ)
async def embed_files(request: Request) -> Response:
    return await embed(request)


@router.post("/predict/files", summary="Predicted class of uploaded files (images, texts, CSV rows)",
             openapi_extra=only(_BODY_DOC, FORM), responses=PREDICT_READ)
async def predict_files(request: Request) -> Response:
    return await predict(request)


@router.post("/predict", summary="Predicted class and the similarity to every class",
             openapi_extra=only(_BODY_DOC, JSON), responses=PREDICT_READ)
async def predict(request: Request) -> Response:
    req, loaded, _, sims = await _run(request, similarities=True)
    assert sims is not None
    classes = sims.argmax(1)
    names = loaded.class_names
    sims_np = sims.numpy()
    predictions: list[dict[str, Any]] = [
        {"class_index": k, "class_name": names[k], "similarities": row}
        for k, row in zip(classes.tolist(), sims_np, strict=True)
    ]
    if req._names is not None:  # multipart: which file (or CSV row) each prediction is for
        for prediction, name in zip(predictions, req._names, strict=True):
            prediction["input"] = name
    for prediction, warning in zip(predictions, inference.warnings(req, loaded), strict=True):
        if warning is not None:  # an answer not to trust: a text with no word the model knows
            prediction["warning"] = warning
    return _json({
        "experiment_id": loaded.experiment_id,
        **_named(req),
        "checkpoint": loaded.checkpoint,
        "similarity": loaded.similarity,
        "class_names": names,
        "predictions": predictions,
    })
