"""What a stored row is: its id (its position in the file it was read from), its text, or a
link to its image. /neighbors names its neighbours with them; the image routes
(``GET /datasets/builtin/{name}/rows/{row}/image``, ``GET /datasets/{id}/rows/{row}/image``)
answer the links.

A training run keeps its training rows' positions (corel's ``Dataset.rows``, stored beside
the split's latent space); a batch embedding job's rows are its upload's, in order. The
texts and pixels are read from the source again when asked (a built-in dataset's files on
this server, an upload from the artifact store), once per process and file.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session

from app.core.errors import InvalidInput, NotFound
from app.core.models import DatasetUpload, LatentSpace
from app.core.settings import Settings
from app.services.builtin import data_dir_for
from app.services.datasets import get_upload, stored_file
from app.storage.artifacts import read_array
from corel.data import DatasetNotFoundError, locate, read_texts, training_images
from corel.spec import MODALITY

IMAGE_BUILTINS = ("digits", "mnist", "fashion-mnist")
"""The built-in datasets whose rows are images (their training files' rows)."""


@dataclass(frozen=True)
class RowSource:
    """The file a reference's rows were read from: a built-in dataset's (``dataset_id``
    None) or an upload's."""

    dataset: str  # the loader's name (digits, mnist, ag-news, npz, text, images)
    dataset_id: int | None

    @property
    def modality(self) -> str:
        return MODALITY[self.dataset]

    def image_url(self, position: int) -> str | None:
        """The link to row ``position``'s image, for sources of images."""
        if self.modality != "image":
            return None
        if self.dataset_id is not None:
            return f"/datasets/{self.dataset_id}/rows/{position}/image"
        return f"/datasets/builtin/{self.dataset}/rows/{position}/image" if self.dataset in IMAGE_BUILTINS else None

    def texts(self, session: Session, settings: Settings) -> list[str] | None:
        """Every row's text, for sources of texts (None when the file is no longer here)."""
        if self.modality != "text":
            return None
        try:
            if self.dataset_id is not None:
                path, _, _ = stored_file(session, self.dataset_id)
                kind = "ag-news" if self.dataset == "ag-news" else "text"
            else:
                found = locate(self.dataset, data_dir_for(settings, self.dataset))
                if found is None:
                    return None
                path, kind = found, "ag-news"
            stat = path.stat()
        except (DatasetNotFoundError, NotFound, OSError):
            return None
        return _texts(str(path), kind, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _texts(path: str, kind: str, mtime_ns: int, size: int) -> list[str]:
    return read_texts(path, kind)


def training_positions(session: Session, experiment_id: int) -> np.ndarray | None:
    """The experiment's training rows' positions in their file (None for a run stored
    before they were kept)."""
    row = session.query(LatentSpace).filter_by(experiment_id=experiment_id, split="train").one_or_none()
    if row is None or row.rows_sha256 is None:
        return None
    return read_array(session, row.rows_sha256, np.int64)


def _png(pixels: np.ndarray) -> bytes:
    """A uint8 image (H, W) or (C, H, W) as PNG."""
    from PIL import Image

    if pixels.ndim == 3:
        pixels = pixels[0] if pixels.shape[0] == 1 else np.moveaxis(pixels, 0, -1)
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(out, format="PNG")
    return out.getvalue()


@functools.lru_cache(maxsize=2)
def _images(dataset: str, where: str, mtime_ns: int) -> np.ndarray:
    return training_images(dataset, where or None)


def _row(images: np.ndarray, row: int, what: str) -> np.ndarray:
    if not 0 <= row < len(images):
        raise NotFound(f"row {row} does not exist: {what} has {len(images)} rows (0 to {len(images) - 1})")
    return np.asarray(images[row])


def builtin_image(settings: Settings, dataset: str, row: int) -> bytes:
    """Row ``row`` of a built-in image dataset's training file, as PNG."""
    folder = data_dir_for(settings, dataset)
    try:
        found = locate(dataset, folder)
    except DatasetNotFoundError as exc:
        raise NotFound(f"{dataset}'s files are not on this server (GET /datasets/builtin says why)") from exc
    stamp = found.stat().st_mtime_ns if found is not None else 0
    what = "digits" if dataset == "digits" else f"{dataset}'s training file"
    return _png(_row(_images(dataset, str(folder or ""), stamp), row, what))


def upload_image(session: Session, dataset_id: int, row: int) -> bytes:
    """Row ``row`` of an uploaded image folder, as PNG."""
    upload: DatasetUpload = get_upload(session, dataset_id)
    if upload.kind != "images":
        raise InvalidInput(f"dataset {dataset_id} is a {upload.kind!r} upload; only image folders "
                           "(kind images) have rows to show as images")
    path, _, _ = stored_file(session, dataset_id)
    return _png(_row(_upload_images(str(path), path.stat().st_mtime_ns), row, f"dataset {dataset_id}"))


@functools.lru_cache(maxsize=2)
def _upload_images(path: str, mtime_ns: int) -> np.ndarray:
    """An image folder's images (uint8, N x C x H x W), read once per process and file: a
    page of neighbours asks for ten of them at once."""
    with np.load(path, allow_pickle=False) as loaded:
        images: np.ndarray = loaded["x"]
        return images
