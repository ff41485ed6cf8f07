"""/experiments/...: clustering reports, pictures and side-by-side comparisons.

This router is included before the experiments router, so that
``/experiments/compare`` is not read as ``/experiments/{experiment_id:int}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

import app.services.clustering as clustering_service
import app.services.compare as compare_service
import app.services.downloads as downloads_service
import app.services.figures as figures_service
import app.services.retrieval as retrieval_service
from app.api.deps import SessionDep, SettingsDep
from app.core.schemas.common import Split
from app.services.compare import IDS_PATTERN, MAX_IDS
from corel.geometry import Geometry

router = APIRouter(prefix="/experiments", tags=["analysis"])

PNG: dict[int | str, dict[str, Any]] = {
    200: {"content": {"image/png": {}}, "description": "A PNG image"}
}


# Response bodies are specific to these routes, so they live with them.
class ClusteringScores(BaseModel):
    algorithm: str
    metric: str
    n_clusters: int
    n_samples: int
    accuracy: float
    ari: float
    v_measure: float
    silhouette: float | None
    silhouette_sample_size: int | None
    seconds: float


class ClusteringRead(BaseModel):
    experiment_id: int
    split: Split
    metric: Geometry
    metric_source: Literal["default", "query"]
    n_samples: int
    results: dict[str, ClusteringScores]


class RetrievalRead(BaseModel):
    """Retrieval of the test split (queries) among the training split (reference)."""

    experiment_id: int
    precision_at_1: float = Field(description="Share of queries whose nearest reference row "
                                  "has their class.")
    r_precision: float = Field(description="Share of the first R neighbours of a query with its "
                               "class (R: the reference rows of that class), averaged.")
    mean_average_precision_at_r: float = Field(description="MAP@R (Musgrave et al., 2020), as "
                                               "pytorch-metric-learning computes it.")
    geometry: Geometry
    n_queries: int
    n_reference: int
    seconds: float


class CompareRead(BaseModel):
    columns: list[str]
    rows: list[dict[str, Any]]
    differing_fields: list[str]


@router.get(
    "/compare", response_model=CompareRead,
    responses={200: {"content": {"text/csv": {}}}},
    summary="Experiments side by side (the paper's Tables 1 and 3); ?format=csv for CSV",
)
def compare(
    session: SessionDep,
    # The pattern is documented, and checked by parse_ids with messages of its own.
    ids: Annotated[list[str], Query(
        min_length=1, max_length=MAX_IDS,
        description=f"1,2,3 or ids=1&ids=2: at most {MAX_IDS} ids a value, {MAX_IDS} values",
        json_schema_extra={"items": {"type": "string", "pattern": IDS_PATTERN}})],
    format_: Annotated[Literal["json", "csv"], Query(alias="format")] = "json",
):
    table = compare_service.compare(session, compare_service.parse_ids(ids))
    if format_ == "csv":
        return Response(compare_service.to_csv(table), media_type="text/csv; charset=utf-8")
    return table


@router.get(
    "/{experiment_id:int}/clustering", response_model=ClusteringRead,
    summary="K-Means and GMM on the stored latent space, scored against the classes",
)
def clustering(
    experiment_id: int,
    session: SessionDep,
    metric: Annotated[
        Geometry | None, Query(description="default: the loss's own geometry")
    ] = None,
    on: Annotated[Split, Query(description="the split")] = "test",
):
    return clustering_service.clustering_report(session, experiment_id, split=on, metric=metric)


@router.get(
    "/{experiment_id:int}/retrieval", response_model=RetrievalRead,
    summary="precision@1, R-precision and MAP@R of the test split among the training split",
)
def retrieval(
    experiment_id: int,
    session: SessionDep,
    geometry: Annotated[
        Geometry | None, Query(description="default: the loss's own geometry")
    ] = None,
):
    return retrieval_service.retrieval_report(session, experiment_id, geometry)


@router.get(
    "/{experiment_id:int}/latent.png", response_class=Response, responses=PNG,
    summary="PCA of the test latent space by class, with the class vectors (the paper's Figure 1)",
)
def latent_png(experiment_id: int, session: SessionDep) -> Response:
    return Response(figures_service.latent_png(session, experiment_id), media_type="image/png")


@router.get(
    "/{experiment_id:int}/curves.png", response_class=Response, responses=PNG,
    summary="Per-epoch train loss and train/validation accuracy, best epoch marked",
)
def curves_png(experiment_id: int, session: SessionDep) -> Response:
    return Response(figures_service.curves_png(session, experiment_id), media_type="image/png")


@router.get(
    "/{experiment_id:int}/latent/scatter",
    summary="The test latent space in its two PCA axes, with the class vectors, as data",
)
def latent_scatter(
    experiment_id: int, session: SessionDep,
    max_points: Annotated[int, Query(ge=10, le=20_000, description="points to send at most")] = 3000,
) -> dict[str, Any]:
    return figures_service.latent_scatter(session, experiment_id, max_points)


LatentFormat = Literal["npy", "csv", "parquet"]
LATENT_FORMATS = {"npy": "application/octet-stream", "csv": "text/csv; charset=utf-8",
                  "parquet": "application/vnd.apache.parquet"}


@router.get(
    "/{experiment_id:int}/latent", response_class=Response,
    responses={200: {"content": {v.split(";")[0]: {} for v in LATENT_FORMATS.values()},
                     "description": "The stored test representations with their labels"}},
    summary="Download the test latent space: npy (a structured array), csv or parquet",
)
def latent_download(
    experiment_id: int, session: SessionDep,
    format_: Annotated[LatentFormat, Query(alias="format")] = "npy",
) -> Response:
    body = downloads_service.latent_space_file(session, experiment_id, format_)
    name = f"experiment-{experiment_id}-test-latent.{format_}"
    return Response(body, media_type=LATENT_FORMATS[format_],
                    headers={"content-disposition": f'attachment; filename="{name}"'})


@router.get(
    "/{experiment_id:int}/checkpoint", response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}},
                     "description": "torch.save bytes: the model, its spec and class names"}},
    summary="Download the best-validation checkpoint (load with corel.train.checkpoint_from_bytes)",
)
def checkpoint_download(experiment_id: int, session: SessionDep) -> Response:
    # Streamed from the artifact store's file, never whole in memory; answers Range, and
    # its ETag is the content's digest.
    path, digest = downloads_service.checkpoint(session, experiment_id)
    return FileResponse(path, media_type="application/octet-stream",
                        filename=f"experiment-{experiment_id}-best.pt",
                        headers={"etag": f'"{digest}"', "x-checkpoint-sha256": digest})


EXPORT_MEDIA = {"onnx": "application/onnx", "pt": "application/octet-stream", "zip": "application/zip"}


@router.get(
    "/{experiment_id:int}/export", response_class=Response,
    responses={200: {"content": {media: {} for media in EXPORT_MEDIA.values()},
                     "description": "The encoder and head in one file, the preprocessing in its "
                     "metadata. A run on a pretrained encoder exports the whole model: for images "
                     "from the pixels in [0, 1]; for texts from input_ids and attention_mask, as a zip "
                     "of model.onnx (or model.pt), the tokenizer's files (tokenizer/) and corel.json"}},
    summary="The trained model as one ONNX or TorchScript file (input: the preprocessed tensor, or for a "
    "pretrained encoder what it takes; outputs: embeddings, similarities, and the encoder's own)",
)
def export_model(
    experiment_id: int, session: SessionDep, settings: SettingsDep,
    format_: Annotated[Literal["onnx", "torchscript"], Query(alias="format")] = "onnx",
) -> Response:
    exported = downloads_service.exported_model(session, experiment_id, format_, settings)
    name = f"experiment-{experiment_id}.{exported.suffix}"
    return Response(exported.data, media_type=EXPORT_MEDIA[exported.suffix],
                    headers={"content-disposition": f'attachment; filename="{name}"'})
