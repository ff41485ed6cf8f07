"""Users' image folders: a .zip or .tar.gz laid out as ``class_name/*.png|jpg`` (the
``ImageFolder`` convention), read with Pillow.

Grey or colour: the images become one channel if every one is grey, three (RGB)
otherwise. Any size: each is resized to one size, by default the median width and
height, capped at ``MAX_SIDE`` pixels, recorded in the preprocessing. The result is the
.npz the ``images`` dataset trains from: ``x`` uint8 ``(N, C, H, W)``, ``y``,
``class_names``. Every problem is a ``ValueError`` naming the member or the class.
"""

from __future__ import annotations

import io
import re
import struct
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from corel.limits import MAX_PIXELS

__all__ = ["EXTENSIONS", "MAX_PIXELS", "MAX_SIDE", "ImageTooLarge", "open_image", "read_image_folder",
           "why_unreadable"]

EXTENSIONS = (".png", ".jpg", ".jpeg")
MAX_SIDE = 64
MAX_IMAGES = 200_000
MIN_PER_CLASS = 3


class ImageTooLarge(ValueError):
    """An image declares more pixels than may be decoded; ``pixels`` is how many it declares,
    ``size`` its (width, height) where known, ``limit`` the bound."""

    def __init__(self, pixels: int, limit: int, size: tuple[int, int] | None = None,
                 where: str = "the image") -> None:
        self.pixels, self.limit, self.size = pixels, limit, size
        shown = f"{size[0]:,} x {size[1]:,} pixels ({pixels:,})" if size else f"{pixels:,} pixels"
        super().__init__(f"{where} declares {shown}; at most {limit:,} pixels are decoded "
                         "(send a smaller image)")


_DECLARED = re.compile(r"\((\d+) pixels\)")


def _png_size(data: bytes) -> tuple[int, int] | None:
    """A PNG's (width, height) from its header, where ``data`` begins as a PNG does."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    return None


def open_image(data: bytes, max_pixels: int = MAX_PIXELS) -> Any:
    """The PIL image of ``data``, its header read but no pixel decoded yet; ImageTooLarge
    where it declares more than ``max_pixels`` (checked before any decoding, so a
    decompression bomb costs its header's parse alone), PIL's own errors otherwise."""
    from PIL import Image

    if max_pixels <= 0:
        raise ValueError(f"max_pixels must be positive; got {max_pixels}")
    try:
        img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        # Past twice Pillow's own bound (about 179 million pixels) it refuses in open().
        size = _png_size(data)
        found = _DECLARED.search(str(exc))
        pixels = size[0] * size[1] if size else int(found.group(1)) if found else 0
        raise ImageTooLarge(pixels, max_pixels, size) from None
    width, height = img.size
    if width * height > max_pixels:
        img.close()
        raise ImageTooLarge(width * height, max_pixels, (width, height))
    return img


def why_unreadable(data: bytes, exc: Exception) -> str:
    """Why Pillow could not read an image's bytes, in the user's terms: Pillow's own words
    for a damaged file, but never its "cannot identify image file <_io.BytesIO object at
    0x...>", which names the buffer it was handed rather than anything the user sent."""
    from PIL import UnidentifiedImageError

    if not isinstance(exc, UnidentifiedImageError):
        return str(exc)
    if not data:
        return "it is empty"
    if data.startswith(b"\x89PNG"):
        return "it begins as a PNG does, but the rest is damaged"
    if data.startswith(b"\xff\xd8"):
        return "it begins as a JPEG does, but the rest is damaged"
    return "its bytes are not an image's: a PNG begins with the bytes 89 50 4E 47, a JPEG with FF D8"


def _inside(name: str) -> str:
    """``name`` if the member lies inside its archive's folder; ValueError otherwise (as an
    encoder's upload is refused: app/services/encoders.py)."""
    if name.startswith(("/", "\\")) or ".." in PurePosixPath(name.replace("\\", "/")).parts or ":" in name:
        raise ValueError(f"the archive's member {name!r} lies outside its folder (an absolute path, a "
                         "drive or '..'); archive the class folders themselves (class_name/image.png)")
    return name


def _members(path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every regular file in the archive; ValueError for a member whose path
    leads outside it."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                _inside(info.filename)
                if not info.is_dir():
                    yield info.filename, zf.read(info)
        return
    try:
        with tarfile.open(path, "r:*") as tf:
            for member in tf:
                _inside(member.name)
                if member.isfile():
                    fh = tf.extractfile(member)
                    if fh is not None:
                        yield member.name, fh.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        # Said in the user's terms: tarfile's own words list each compression it tried.
        raise ValueError(f"not a readable .zip or .tar.gz archive: {_what_it_is(path)}") from exc


def _what_it_is(path: Path) -> str:
    """What a file that is no archive seems to be, from its first bytes."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head[:2] == b"\x1f\x8b":
        return "it begins as a gzip file does, but what it holds is no tar archive"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if text and all(c.isprintable() or c in "\r\n\t" for c in text):
        return ("its first bytes are text, not an archive's (a table? upload a CSV or Parquet "
                "table without kind=images)")
    return ("its first bytes are not an archive's: a .zip begins with the bytes 50 4B ('PK'), "
            "a .tar.gz with 1F 8B")


def read_image_folder(path: str | Path, size: tuple[int, int] | None = None,
                      max_pixels: int = MAX_PIXELS) -> dict[str, Any]:
    """``{"x": uint8 (N, C, H, W), "y", "class_names", "size": (H, W), "channels"}``. An
    image that declares more than ``max_pixels`` is refused before it is decoded
    (ImageTooLarge, naming the member)."""
    from PIL import Image, UnidentifiedImageError

    images: list[tuple[str, str, Any]] = []  # (class, member name, PIL image)
    empty_dirs: set[str] = set()
    for name, data in _members(Path(path)):
        parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
        if any(p.startswith(("__MACOSX", ".")) for p in parts):
            continue  # macOS resource forks, hidden files
        if len(parts) < 2:
            raise ValueError(f"{name}: images must lie in one folder per class "
                             "(class_name/image.png); this one is at the top level")
        cls = parts[-2]
        if not parts[-1].lower().endswith(EXTENSIONS):
            empty_dirs.add(cls)
            continue
        try:
            img = open_image(data, max_pixels)
            img.load()
        except ImageTooLarge as exc:
            raise ImageTooLarge(exc.pixels, exc.limit, exc.size, where=name) from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
            raise ValueError(f"{name}: not a readable PNG or JPEG image "
                             f"({why_unreadable(data, exc)})") from exc
        images.append((cls, name, img))
        if len(images) > MAX_IMAGES:
            raise ValueError(f"the archive holds more than {MAX_IMAGES} images")
    if not images:
        raise ValueError("the archive holds no .png or .jpg image in class folders "
                         "(class_name/image.png)")
    classes = sorted({c for c, _, _ in images} | empty_dirs)
    counts = {c: sum(1 for k, _, _ in images if k == c) for c in classes}
    small = [f"{c!r} ({n})" for c, n in counts.items() if n < MIN_PER_CLASS]
    if small:
        raise ValueError(f"every class needs at least {MIN_PER_CLASS} images (one for each split), "
                         f"but these have fewer: {', '.join(small)}")
    if len(classes) < 2:
        raise ValueError(f"the archive holds one class ({classes[0]!r}); at least 2 are needed")
    grey = all(img.mode in ("1", "L", "LA", "I", "I;16", "F") for _, _, img in images)
    channels = 1 if grey else 3
    if size is None:
        height = int(np.median([img.height for _, _, img in images]))
        width = int(np.median([img.width for _, _, img in images]))
        scale = min(1.0, MAX_SIDE / max(height, width))
        size = (max(8, round(height * scale)), max(8, round(width * scale)))
    height, width = size
    x = np.empty((len(images), channels, height, width), dtype=np.uint8)
    for i, (_, _, img) in enumerate(images):
        converted = img.convert("L" if channels == 1 else "RGB")
        if converted.size != (width, height):
            converted = converted.resize((width, height), Image.Resampling.BILINEAR)
        pixels = np.asarray(converted, dtype=np.uint8)
        x[i] = pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)
    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[c] for c, _, _ in images], dtype=np.int64)
    return {"x": x, "y": y, "class_names": classes, "size": (height, width), "channels": channels}
