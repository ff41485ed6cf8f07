"""Image folders through POST /datasets: a .zip (RGB, mixed sizes) and a .tar.gz (grey) of
class_name/*.png, trained by a real worker with the CNN and the FFNN, then served by
/embed and /predict; and bad archives, refused with a 422 naming the problem."""

from __future__ import annotations

import io
import tarfile
import zipfile

import numpy as np
import pytest
from PIL import Image

FAST = {"lr": 0.003, "batch_size": 16, "epochs": 6}
CLASSES = ("disc", "square", "stripes")


def _picture(kind: str, rng: np.random.Generator, size: tuple[int, int], grey: bool) -> Image.Image:
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w] / np.array([h, w])[:, None, None]
    if kind == "disc":
        base = ((yy - 0.5) ** 2 + (xx - 0.5) ** 2 < 0.1).astype(float)
    elif kind == "square":
        base = ((abs(yy - 0.5) < 0.3) & (abs(xx - 0.5) < 0.3)).astype(float)
    else:
        base = ((xx * 6).astype(int) % 2).astype(float)
    noisy = np.clip(base * 200 + rng.normal(0, 20, size), 0, 255).astype(np.uint8)
    if grey:
        return Image.fromarray(noisy, "L")
    tint = {"disc": (1.0, 0.4, 0.4), "square": (0.4, 1.0, 0.4), "stripes": (0.4, 0.4, 1.0)}[kind]
    return Image.fromarray(np.stack([(noisy * t).astype(np.uint8) for t in tint], -1), "RGB")


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _members(grey: bool, per_class: int = 14) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    out = {}
    for kind in CLASSES:
        for i in range(per_class):
            size = (20, 24) if i % 3 else (30, 36)  # mixed sizes: the median is 20 x 24
            out[f"shapes/{kind}/{i}.png"] = _png(_picture(kind, rng, size, grey))
    return out


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _targz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _upload(client, name: str, data: bytes):
    return client.post("/datasets", files={"file": (name, data)})


@pytest.fixture(scope="module")
def rgb_upload(client) -> dict:
    r = _upload(client, "shapes.zip", _zip(_members(grey=False)))
    assert r.status_code == 201, r.text
    return r.json()


def test_an_rgb_zip_is_read_at_its_median_size(rgb_upload):
    s = rgb_upload["summary"]
    assert rgb_upload["kind"] == "images"
    assert s["class_names"] == list(CLASSES) and s["class_counts"] == [14, 14, 14]
    assert s["channels"] == 3 and s["size"] == [20, 24]


@pytest.mark.parametrize(("members", "words"), [
    ({**_members(False, 4), "shapes/disc/broken.png": b"\x89PNG\r\n\x1a\n not really"},
     "shapes/disc/broken.png: not a readable PNG or JPEG image"),
    ({**_members(False, 4), "shapes/empty/README.txt": b"nothing here"},
     "every class needs at least 3 images (one for each split), but these have fewer: 'empty' (0)"),
    ({"loose.png": _png(Image.new("L", (8, 8)))}, "loose.png: images must lie in one folder per class"),
    ({"notes/readme.txt": b"x"}, "the archive holds no .png or .jpg image"),
    # Accepted before, with the climbing member dropped or read as a class named '..'.
    ({**_members(False, 4), "../escape/0.png": _png(Image.new("L", (8, 8)))},
     "the archive's member '../escape/0.png' lies outside its folder"),
    ({**_members(False, 4), "shapes/../../x.png": _png(Image.new("L", (8, 8)))}, "lies outside its folder"),
])
def test_bad_archives_are_refused_naming_the_problem(client, members, words):
    r = _upload(client, "bad.zip", _zip(members))
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"], r.json()["detail"]
    # Pillow's own words named the buffer it read: "<_io.BytesIO object at 0x7f...>".
    assert " at 0x" not in r.json()["detail"], r.json()["detail"]


def test_a_file_that_is_no_archive_is_a_422(client):
    r = _upload(client, "fake.tar.gz", b"this is not gzip")
    assert r.status_code == 422 and "not a readable .zip or .tar.gz archive" in r.json()["detail"]
    # A CSV sent as kind=images: said what it seems to be, not tarfile's list of the
    # compressions it tried ("- method gz: ReadError('not a gzip file') ...").
    r = client.post("/datasets", files={"file": ("table.csv", b"a,b\n1,2\n")}, data={"kind": "images"})
    detail = r.json()["detail"]
    assert r.status_code == 422 and "its first bytes are text, not an archive's" in detail, detail
    assert "method gz" not in detail and "ReadError" not in detail, detail
    r = _upload(client, "noise.tar.gz", bytes(range(256)) * 4)
    assert "a .zip begins with the bytes 50 4B ('PK'), a .tar.gz with 1F 8B" in r.json()["detail"], r.text
