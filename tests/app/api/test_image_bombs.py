"""Decompression bombs: a small PNG that declares far more pixels than it holds is refused
with a 413 naming its size and the limit (COREL_MAX_IMAGE_PIXELS), before it is decoded, on
every route that opens an image; none answers a 500."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import numpy as np
import pytest
from PIL import Image

from corel.data.image_folders import MAX_PIXELS, ImageTooLarge, open_image, read_image_folder


def declared_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` grey pixels, followed by a few
    hundred bytes of image data: what a decompression bomb's first bytes look like."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * 100_000, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


BOMB = declared_png(20_000, 20_000)  # 400 million pixels: past Pillow's own refusal
BIG = declared_png(8_000, 8_000)  # 64 million: under Pillow's bound, over corel's


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize(("data", "size"), [(BOMB, "20,000 x 20,000"), (BIG, "8,000 x 8,000")])
def test_the_library_refuses_an_image_past_the_bound_before_decoding(data, size):
    with pytest.raises(ImageTooLarge, match=f"declares {size} pixels") as caught:
        open_image(data)
    assert caught.value.limit == MAX_PIXELS and f"at most {MAX_PIXELS:,} pixels" in str(caught.value)
    small = _png(np.zeros((8, 8), np.uint8))
    assert open_image(small).size == (8, 8)
    with pytest.raises(ImageTooLarge, match="8 x 8 pixels \\(64\\); at most 63"):
        open_image(small, max_pixels=63)
    with pytest.raises(ValueError, match="max_pixels must be positive"):
        open_image(small, max_pixels=0)


def folder_with_a_bomb(root: str, bomb_in: str) -> bytes:
    """A zipped image folder of two classes of three 8 x 8 PNGs, and BOMB in ``bomb_in``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for cls in ("a", "b"):
            for i in range(3):
                zf.writestr(f"{root}{cls}/{i}.png", _png(np.full((8, 8), 40 * i, np.uint8)))
        zf.writestr(f"{root}{bomb_in}/bomb.png", BOMB)
    return buf.getvalue()


def test_an_image_folder_names_the_member_that_is_too_large(tmp_path):
    path = tmp_path / "folder.zip"
    path.write_bytes(folder_with_a_bomb("", "b"))
    with pytest.raises(ImageTooLarge, match=r"b/bomb\.png declares 20,000 x 20,000 pixels"):
        read_image_folder(path)


def _check(r, size: str = "20,000 x 20,000") -> None:
    assert r.status_code == 413, (r.status_code, r.text)
    detail = r.json()["detail"]
    assert f"declares {size} pixels" in detail and f"at most {MAX_PIXELS:,} pixels" in detail, detail
    assert "COREL_MAX_IMAGE_PIXELS" in detail, detail


def test_an_image_folder_upload_with_a_bomb_is_a_413_and_stores_nothing(client):
    before = client.get("/datasets").json()["total"]
    r = client.post("/datasets", files={"file": ("shapes.zip", folder_with_a_bomb("shapes/", "a"))})
    _check(r)
    assert "shapes/a/bomb.png" in r.json()["detail"], r.text
    assert client.get("/datasets").json()["total"] == before
