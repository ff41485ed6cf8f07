"""Datasets on real files: IDX parsing, fixed stratified splits, and serve-time preprocessing
that reproduces the training inputs bit for bit."""

import csv
import gzip
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from corel import data
from corel.data import tables
from corel.spec import DATASETS, ExperimentSpec
from tests.conftest import FASHION_DIR, SHARED_DATASETS

# make test runs the tests marked KERNELS once more on other kernels (torch's non-vectorised
# ones, MKL's reproducible path): those whose figures are sums (a text's word vectors
# averaged). The others read files, split rows and divide pixels by their maximum (one
# correctly rounded operation an element, the same on any kernels): they run once.
KERNELS = pytest.mark.kernels

SHARED = SHARED_DATASETS
AG_NEWS_CSV = SHARED / "ag_news" / "test.csv"


def require(path: Path) -> Path:
    """Real data must be there in CI; elsewhere a missing copy skips the test."""
    if not path.exists():
        message = f"real data not found: {path}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def rows_as_bytes(x: torch.Tensor, scale: float) -> list[bytes]:
    """Each sample back as its raw uint8 pixels, for multiset comparisons."""
    raw = torch.round(x * scale).to(torch.uint8).numpy()
    return [r.tobytes() for r in raw.reshape(len(raw), -1)]


def ag_rows(path: Path) -> list[tuple[int, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [(int(r[0]), r[1] + " " + r[2]) for r in csv.reader(f)]


@pytest.fixture(scope="module")
def fashion() -> data.Dataset:
    require(FASHION_DIR)
    return data.load_dataset(ExperimentSpec(dataset="fashion-mnist"))


@pytest.fixture(scope="module")
def ag_news_ffnn() -> data.Dataset:
    spec = ExperimentSpec(dataset="ag-news", dataset_path=str(require(AG_NEWS_CSV)))
    return data.load_dataset(spec)


# ---------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("name", ["a-idx3-ubyte", "a-idx3-ubyte.gz"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip(tmp_path, name, dtype):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal((4, 3, 5)) * 50).astype(dtype)
    data.write_idx(tmp_path / name, array)
    back = data.read_idx(tmp_path / name)
    assert back.dtype == np.dtype(dtype) and back.dtype.isnative
    np.testing.assert_array_equal(back, array)


def test_idx_header_is_the_canonical_layout(tmp_path):
    data.write_idx(tmp_path / "labels", np.array([7, 2, 1], dtype=np.uint8))
    raw = (tmp_path / "labels").read_bytes()
    assert raw == bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 1])  # magic 0x00000801, n=3, data


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x00\x00\x42\x01\x00\x00\x00\x01\x07", "bad magic number"),
        (b"\x00\x00\x08\x03\x00\x00", "truncated inside its header"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "header announces shape"),
        (gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x01\x07", mtime=0)[:-6], "corrupt gzip"),
    ],
)
def test_idx_rejects_corrupt_files(tmp_path, content, message):
    path = tmp_path / "broken-idx1-ubyte.gz"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as info:
        data.read_idx(path)
    assert str(path) in str(info.value)


def test_corrupt_idx_file_fails_load(tmp_path):
    for stem in data.idx._IDX_FILES.values():
        data.write_idx(tmp_path / stem, np.zeros((2, 28, 28) if "images" in stem else 2, np.uint8))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x09")
    with pytest.raises(ValueError, match="header announces shape"):
        data.load_dataset(ExperimentSpec(dataset="mnist"), tmp_path)


# ---------------------------------------------------------------------------- MNIST, Fashion


def test_fashion_mnist_from_debian_folder(fashion):
    sizes = (len(fashion.y_train), len(fashion.y_val), len(fashion.y_test))
    assert sizes == (55_000, 5_000, 10_000)
    assert fashion.x_train.shape == (55_000, 1, 28, 28) and fashion.input_shape == (1, 28, 28)
    assert fashion.x_train.dtype == torch.float32 and fashion.y_train.dtype == torch.int64
    for x in (fashion.x_train, fashion.x_val, fashion.x_test):
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    for y in (fashion.y_train, fashion.y_val, fashion.y_test):
        assert int(y.min()) == 0 and int(y.max()) == 9
    assert fashion.num_classes == 10 and fashion.class_names[0] == "T-shirt/top"
    assert fashion.class_names[9] == "Ankle boot" and int(fashion.y_test[0]) == 9
    # Stratified: Fashion-MNIST's 6,000 per class become 5,500 + 500.
    assert fashion.y_val.bincount().tolist() == [500] * 10
    assert fashion.y_train.bincount().tolist() == [5_500] * 10
    json.dumps(fashion.preprocessing)


def test_split_is_fixed_and_ignores_spec_seed(fashion):
    other = data.load_dataset(
        ExperimentSpec(dataset="fashion-mnist", seed=7, train_subset=1_000, model="cnn")
    )
    assert torch.equal(other.x_val, fashion.x_val) and torch.equal(other.y_val, fashion.y_val)
    assert torch.equal(other.x_test, fashion.x_test)
    # train_subset keeps the first N of the same training order; val and test stay whole.
    assert torch.equal(other.x_train, fashion.x_train[:1_000])
    assert torch.equal(other.y_train, fashion.y_train[:1_000])


def test_train_and_val_partition_the_training_file(fashion):
    raw = data.read_idx(FASHION_DIR / "train-images-idx3-ubyte.gz")
    split = rows_as_bytes(fashion.x_train, 255) + rows_as_bytes(fashion.x_val, 255)
    assert sorted(split) == sorted(r.tobytes() for r in raw.reshape(len(raw), -1))
    train = set(rows_as_bytes(fashion.x_train, 255))
    overlap = [r for r in rows_as_bytes(fashion.x_val, 255) if r in train]
    # Fashion-MNIST has a handful of byte-identical images; a leak would show thousands.
    assert len(overlap) < 10


def test_prepare_images_reproduces_training_inputs(fashion):
    raw = data.read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")
    pre = fashion.preprocessing
    assert torch.equal(data.prepare_images(raw, pre), fashion.x_test)
    assert torch.equal(data.prepare_images(raw[:5, None], pre), fashion.x_test[:5])
    assert torch.equal(data.prepare_images(torch.from_numpy(raw[:5]), pre), fashion.x_test[:5])
    assert torch.equal(data.prepare_images(raw[:5].astype(np.float64), pre), fashion.x_test[:5])


@pytest.mark.parametrize(
    "images, message",
    [
        (np.zeros((28, 28), np.uint8), "batch dimension"),
        (np.zeros((2, 3, 28, 28), np.uint8), "one channel"),
        (np.zeros((2, 8, 8), np.uint8), r"\(N, 28, 28\)"),
        (np.full((2, 28, 28), 300.0), r"\[0, 255\]"),
        (np.full((2, 28, 28), np.nan), "NaN"),
        (np.full((2, 28, 28), "a"), "dtype"),
    ],
)
def test_prepare_images_rejects_bad_input(fashion, images, message):
    with pytest.raises(ValueError, match=message):
        data.prepare_images(images, fashion.preprocessing)


def test_a_wrong_image_size_is_named_as_such(fashion):
    """It used to say "a single image needs a batch dimension" for any wrong shape."""
    with pytest.raises(ValueError) as info:
        data.prepare_images(np.zeros((2, 8, 8), np.uint8), fashion.preprocessing)
    assert "8 x 8 pixels, the model takes 28 x 28" in str(info.value)
    assert "batch dimension" not in str(info.value)


@pytest.mark.parametrize(("raw_shape", "names", "words"), [
    ([4], None, "each input must be 4 numbers; got 3 (inputs of shape (2, 3))"),
    ([4], ["a", "b", "c", "d"], "each input must be 4 numbers (the columns 'a', 'b', 'c', 'd')"),
    ([2, 2], None, "each input must be 4 numbers or an array of shape (2, 2); got 3 (inputs of shape (2, 3))"),
])
def test_a_vector_of_the_wrong_width_says_the_width(raw_shape, names, words):
    """It said "x must have shape (N, 4) or (N, *(4,))": Python's unpacking, not a shape."""
    pre = {"modality": "vector", "dataset": "npz", "input_shape": [4], "raw_shape": raw_shape,
           **({"feature_names": names} if names else {})}
    with pytest.raises(ValueError) as info:
        data.prepare_vectors(np.zeros((2, 3)), pre)
    assert words in str(info.value) and "*(" not in str(info.value)


def test_a_text_file_named_npz_is_called_text(tmp_path):
    path = tmp_path / "mine.npz"
    path.write_text("x,y\n1,2\n")
    with pytest.raises(ValueError) as info:
        data.load_dataset(ExperimentSpec(dataset="npz", dataset_path=str(path)))
    assert "mine.npz is not an .npz file" in str(info.value) and "looks like text" in str(info.value)
    assert "allow_pickle" not in str(info.value)


def test_prepare_images_rejects_text_preprocessing():
    with pytest.raises(ValueError, match="prepare_texts"):
        data.prepare_images(np.zeros((1, 28, 28)), {"modality": "text"})


def test_mnist_from_shared_data_dir():
    require(SHARED / "mnist")
    spec = ExperimentSpec(dataset="mnist", train_subset=200)
    mnist = data.load_dataset(spec, data_dir=SHARED)
    assert (len(mnist.y_train), len(mnist.y_val), len(mnist.y_test)) == (200, 5_000, 10_000)
    assert mnist.x_test.shape == (10_000, 1, 28, 28)
    assert mnist.class_names == [str(d) for d in range(10)]
    assert int(mnist.y_test[0]) == 7  # MNIST's first test digit
    # A data_dir holding the IDX files directly is taken as the requested dataset.
    direct = data.load_dataset(spec, data_dir=SHARED / "mnist")
    assert torch.equal(direct.x_val, mnist.x_val) and torch.equal(direct.x_train, mnist.x_train)


def test_fashion_is_never_taken_from_the_mnist_folder():
    require(SHARED / "mnist")
    require(FASHION_DIR)
    spec = ExperimentSpec(dataset="fashion-mnist", train_subset=10)
    ds = data.load_dataset(spec, data_dir=SHARED, download=False)
    assert int(ds.y_test[0]) == 9  # Ankle boot: Debian's Fashion-MNIST, not MNIST's 7


def test_missing_dataset_names_every_place_looked(tmp_path):
    (tmp_path / "mnist").mkdir()
    data.write_idx(tmp_path / "mnist" / "train-labels-idx1-ubyte.gz", np.zeros(3, np.uint8))
    elsewhere = tmp_path / "elsewhere"
    spec = ExperimentSpec(dataset="mnist", dataset_path=str(elsewhere))
    with pytest.raises(data.DatasetNotFoundError) as info:
        data.load_dataset(spec, data_dir=tmp_path)
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    for place in (tmp_path / "mnist", tmp_path / "MNIST" / "raw", tmp_path, elsewhere):
        assert f"  {place} (" in message
    assert "missing train-images-idx3-ubyte, t10k-images" in message
    assert "download=True" in message and "data_dir" in message


def test_download_needs_a_data_dir():
    with pytest.raises(ValueError, match="download=True needs data_dir"):
        data.load_dataset(ExperimentSpec(dataset="mnist"), download=True)


# ---------------------------------------------------------------------------- digits


def test_digits_split_and_scaling():
    from sklearn.datasets import load_digits

    ds = data.load_dataset(ExperimentSpec(dataset="digits"))
    assert (len(ds.y_train), len(ds.y_val), len(ds.y_test)) == (1_257, 270, 270)
    assert ds.x_train.shape[1:] == (1, 8, 8) == ds.input_shape
    assert float(ds.x_train.min()) == 0.0 and float(ds.x_train.max()) == 1.0
    for y in (ds.y_train, ds.y_val, ds.y_test):
        counts = y.bincount(minlength=10)
        assert counts.min() >= 0.9 * counts.float().mean()  # stratified
    # The three splits partition the 1,797 images, each prepared exactly as at serve time.
    raw = load_digits().images
    everything = data.prepare_images(raw, ds.preprocessing)
    splits = torch.cat([ds.x_train, ds.x_val, ds.x_test])
    assert sorted(rows_as_bytes(splits, 16)) == sorted(rows_as_bytes(everything, 16))
    expected = torch.from_numpy(raw[:3, None] / 16.0).float()
    assert torch.equal(data.prepare_images(raw[:3], ds.preprocessing), expected)


# ---------------------------------------------------------------------------- npz


def make_npz(tmp_path, name="data.npz", n_per_class=20, labels=(-1, 5, 7), **arrays):
    """x encodes each sample's original label in x[:, 0, 0], so the mapping can be checked."""
    rng = np.random.default_rng(1)
    y = np.repeat(np.asarray(labels), n_per_class)
    x = rng.standard_normal((len(y), 3, 2))
    x[:, 0, 0] = y
    content = {"x": x, "y": y, **arrays}
    path = tmp_path / name
    np.savez(path, **{k: v for k, v in content.items() if v is not None})
    return path


def test_npz_happy_path(tmp_path):
    path = make_npz(tmp_path)
    ds = data.load_dataset(ExperimentSpec(dataset="npz", dataset_path=str(path)))
    assert ds.modality == "vector" and ds.input_shape == (6,)
    assert ds.class_names == ["-1", "5", "7"]
    assert (len(ds.y_train), len(ds.y_val), len(ds.y_test)) == (42, 9, 9)
    assert ds.y_val.bincount().tolist() == [3, 3, 3] == ds.y_test.bincount().tolist()
    for x, y in ((ds.x_train, ds.y_train), (ds.x_val, ds.y_val), (ds.x_test, ds.y_test)):
        assert x.dtype == torch.float32
        assert [ds.class_names[i] for i in y] == [str(int(v)) for v in x[:, 0]]
    raw = np.load(path)["x"]
    assert torch.equal(
        data.prepare_vectors(raw, ds.preprocessing), torch.from_numpy(raw.reshape(60, 6)).float()
    )
    assert data.validate_npz(path) == {
        "n": 60,
        "shape": [3, 2],
        "num_features": 6,
        "num_classes": 3,
        "class_names": ["-1", "5", "7"],
        "class_counts": [20, 20, 20],
    }


def test_npz_class_names_array_and_relative_path(tmp_path):
    make_npz(tmp_path, class_names=np.array(["cat", "dog", "eel"]))
    spec = ExperimentSpec(dataset="npz", dataset_path="data.npz", train_subset=5)
    ds = data.load_dataset(spec, data_dir=tmp_path)  # relative to data_dir
    assert ds.class_names == ["cat", "dog", "eel"] and len(ds.y_train) == 5


def test_a_train_subset_above_the_training_split_is_a_value_error_naming_the_limit(tmp_path):
    make_npz(tmp_path)
    rows = len(data.load_dataset(ExperimentSpec(dataset="npz", dataset_path="data.npz"),
                                 data_dir=tmp_path).y_train)
    spec = ExperimentSpec(dataset="npz", dataset_path="data.npz", train_subset=rows + 1)
    with pytest.raises(ValueError, match=f"train_subset is {rows + 1}, but npz's training split "
                                         f"holds {rows} rows; ask for at most {rows}"):
        data.load_dataset(spec, data_dir=tmp_path)
    exact = ExperimentSpec(dataset="npz", dataset_path="data.npz", train_subset=rows)
    assert len(data.load_dataset(exact, data_dir=tmp_path).y_train) == rows


def test_the_training_split_rows_of_built_in_datasets_are_those_the_loaders_give():
    for spec in (ExperimentSpec(dataset="digits"),):
        assert data.training_split_rows(spec.dataset) == len(data.load_dataset(spec).y_train)
    require(SHARED / "ag_news")
    texts = data.ag_news_texts(ExperimentSpec(dataset="ag-news"), SHARED)
    assert data.training_split_rows("ag-news", SHARED) == len(texts.train[1])
    assert data.training_split_rows("npz") is None


NPZ_BAD_CASES = {
    "missing x": (dict(x=None), "lacks array"),
    "missing y": (dict(y=None), "lacks array"),
    "mismatched lengths": (dict(y=np.zeros(59, int)), "x has 60 samples but y has 59"),
    "non-finite": (dict(x=np.full((60, 2), np.inf)), "NaN or infinite"),
    "one class": (dict(y=np.zeros(60, int)), "at least 2 classes"),
    "class too small": (dict(y=np.r_[np.zeros(58, int), 1, 1]), "too few samples"),
    "object array": (dict(x=np.array([[1], "a"] * 30, dtype=object)), "object array"),
    "string x": (dict(x=np.full((60, 2), "a")), "must be numeric"),
    "2-d y": (dict(y=np.zeros((60, 1), int)), "must be 1-D"),
    "float y": (dict(y=np.linspace(0, 1, 60)), "integer labels"),
    "class_names length": (dict(class_names=np.array(["a", "b"])), "class_names has 2"),
}


@pytest.mark.parametrize("case", NPZ_BAD_CASES)
def test_npz_rejects_bad_files(tmp_path, case):
    arrays, message = NPZ_BAD_CASES[case]
    path = make_npz(tmp_path, **arrays)
    with pytest.raises(ValueError, match=message):
        data.validate_npz(path)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_x_is_checked_in_pieces_to_its_last_value(tmp_path, monkeypatch, save):
    """validate_npz reads x through in pieces (a large upload is never held whole): the
    pieces cover all of it, compressed or not, and a truncated x is refused."""
    from corel.data import npz

    monkeypatch.setattr(npz._StreamedX, "PIECE", 64)  # 8 float64 values a piece
    x = np.random.default_rng(0).normal(size=(60, 3))
    y = np.repeat(np.arange(3), 20)
    save(tmp_path / "ok.npz", x=x, y=y)
    assert data.validate_npz(tmp_path / "ok.npz")["n"] == 60
    x[-1, -1] = np.nan  # in the very last piece
    save(tmp_path / "nan.npz", x=x, y=y)
    with pytest.raises(ValueError, match="holds 1 NaN"):
        data.validate_npz(tmp_path / "nan.npz")
    blob = (tmp_path / "ok.npz").read_bytes()
    if save is np.savez:  # x's data cut short inside the archive
        (tmp_path / "cut.npz").write_bytes(blob[:200] + blob[400:])
        with pytest.raises(ValueError):
            data.validate_npz(tmp_path / "cut.npz")


def test_npz_rejects_unreadable_and_missing_files(tmp_path):
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match=r"text\.npz is not an \.npz file.*looks like text"):
        data.validate_npz(tmp_path / "text.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(ValueError, match="single array"):
        data.validate_npz(tmp_path / "single.npy")
    spec = ExperimentSpec(dataset="npz", dataset_path=str(tmp_path / "absent.npz"))
    with pytest.raises(data.DatasetNotFoundError, match=r"absent\.npz does not exist"):
        data.load_dataset(spec)


# ---------------------------------------------------------------------------- word vectors


def test_default_glove_package():
    wv = data.load_word_vectors()
    assert wv is data.load_word_vectors()  # cached
    assert (len(wv), wv.dim) == (400_000, 50) and wv.source == data.DEFAULT_WORD_VECTORS
    assert wv.index["the"] == 0 and "'s" in wv and "n't" in wv
    np.testing.assert_allclose(wv["the"][:3], [0.418, 0.24968, -0.41242], rtol=1e-6)


def write_glove(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


TINY_GLOVE = ["the 1 0 0", "cat 0 2 0", "sat 0 0 4", "mat 1 1 1", "do 2 2 2", "n't 3 0 3"]


def test_glove_text_file(tmp_path):
    path = write_glove(tmp_path / "v.txt", ["3 2", "a 1 2", "b c 3 4", "a 5 6"])
    wv = data.load_word_vectors(str(path))
    assert (len(wv), wv.dim) == (3, 2) and wv.source == str(path.resolve())
    assert wv["a"].tolist() == [1, 2]  # word2vec header skipped, first duplicate wins
    assert wv["b c"].tolist() == [3, 4]  # words with spaces, as in GloVe 840B
    write_glove(path, ["a 7 8 9"])
    assert data.load_word_vectors(path)["a"].tolist() == [7, 8, 9]  # a changed file is re-read


@pytest.mark.parametrize(
    "lines, message",
    [
        (["a 1 2", "b 3"], "expected a word and 2 numbers"),
        (["a 1 x"], "not a number"),
        (["a 1 inf"], "not finite"),
        (["a"], "a word without numbers"),
        ([""], "holds no word vectors"),
    ],
)
def test_glove_text_file_errors(tmp_path, lines, message):
    with pytest.raises(ValueError, match=message):
        data.load_word_vectors(write_glove(tmp_path / "bad.txt", lines))


def test_missing_word_vector_file(tmp_path):
    with pytest.raises(data.DatasetNotFoundError, match="GloVe-format text file"):
        data.load_word_vectors(tmp_path / "absent.txt")


def test_tokenize_follows_glove():
    text = "Don't panic: it's the U.S. #39;s $1,000 well-known 'quote' &lt;b&gt;N.Korea\\Line"
    assert data.tokenize(text) == [
        "do", "n't", "panic", "it", "'s", "the", "u.s.", "'s", "1,000", "well-known",
        "quote", "n", "korea", "line",
    ]  # fmt: skip


# ---------------------------------------------------------------------------- AG News


@KERNELS
def test_ag_news_single_file_ffnn(ag_news_ffnn):
    ds = ag_news_ffnn
    assert ds.modality == "text" and ds.class_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert (len(ds.y_train), len(ds.y_val), len(ds.y_test)) == (5_320, 1_140, 1_140)
    assert ds.x_train.shape == (5_320, 50) and ds.input_shape == (50,)
    assert ds.y_train.bincount().tolist() == [1_330] * 4
    assert ds.y_val.bincount().tolist() == [285] * 4 == ds.y_test.bincount().tolist()
    assert torch.isfinite(ds.x_train).all() and (ds.x_train.abs().sum(1) > 0).float().mean() > 0.99
    pre = ds.preprocessing
    assert pre["representation"] == "mean" and pre["word_vectors"]["dim"] == 50
    assert pre["word_vectors"]["source"] == data.DEFAULT_WORD_VECTORS
    json.dumps(pre)


@KERNELS
def test_ag_news_cnn_sequences_match_the_means(ag_news_ffnn):
    spec = ExperimentSpec(
        dataset="ag-news", model="cnn", dataset_path=str(AG_NEWS_CSV), train_subset=100
    )
    ds = data.load_dataset(spec)
    assert ds.x_train.shape == (100, 64, 50) and ds.x_val.shape == (1_140, 64, 50)
    assert ds.input_shape == (64, 50) and ds.preprocessing["max_len"] == 64
    assert torch.equal(ds.y_val, ag_news_ffnn.y_val)  # the same split for either model
    known = (ds.x_val.abs().sum(2) > 0).sum(1)
    short = (known > 0) & (known < 64)  # not truncated: the mean covers the same words
    means = ds.x_val.sum(1)[short] / known[short, None]
    torch.testing.assert_close(means, ag_news_ffnn.x_val[short], rtol=1e-5, atol=1e-6)
    # Padding sits at the end: once a row is zero, the rest of that sequence is too.
    nonzero = ds.x_val.abs().sum(2) > 0
    assert torch.equal(nonzero, torch.arange(64) < known[:, None])


@pytest.fixture
def ag_news_dir(tmp_path):
    with open(require(AG_NEWS_CSV), newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    for name, part in (("train.csv", rows[:2_000]), ("test.csv", rows[2_000:2_400])):
        with open(tmp_path / name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(part)
    shutil.copy(AG_NEWS_CSV.parent / "classes.txt", tmp_path / "classes.txt")
    return tmp_path


@KERNELS
@pytest.mark.parametrize("model", ["ffnn", "cnn"])
def test_ag_news_folder_and_prepare_texts(ag_news_dir, model):
    spec = ExperimentSpec(dataset="ag-news", model=model, dataset_path=str(ag_news_dir))
    ds = data.load_dataset(spec)
    assert (len(ds.y_train), len(ds.y_val), len(ds.y_test)) == (1_800, 200, 400)
    assert ds.class_names[3] == "Sci/Tech"
    test_rows = ag_rows(ag_news_dir / "test.csv")  # test.csv keeps its order
    assert ds.y_test.tolist() == [label - 1 for label, _ in test_rows]
    texts = [text for _, text in test_rows]
    served = data.prepare_texts(texts, json.loads(json.dumps(ds.preprocessing)))
    assert torch.equal(served, ds.x_test)
    assert torch.equal(data.prepare_texts(texts[7:9], ds.preprocessing), ds.x_test[7:9])


@KERNELS
def test_ag_news_with_a_tiny_glove_file(tmp_path):
    vectors = write_glove(tmp_path / "tiny.txt", TINY_GLOVE)
    folder = tmp_path / "news"
    folder.mkdir()
    (folder / "train.csv").write_text("1,the cat,sat\n1,cat,cat\n2,mat,x\n2,do,mat\n")
    (folder / "test.csv").write_text(
        '1,The Cat sat,"on mat"\n2,Nothing known,here\n2,Don\'t,"cat\\mat"\n'
    )
    for model in ("ffnn", "cnn"):
        spec = ExperimentSpec(
            dataset="ag-news", model=model, dataset_path=str(folder), word_vectors=str(vectors)
        )
        ds = data.load_dataset(spec)
        assert ds.class_names == ["1", "2"] and ds.y_test.tolist() == [0, 1, 1]
        assert ds.preprocessing["word_vectors"]["source"] == str(vectors.resolve())
        if model == "ffnn":
            expected = [[2 / 4, 3 / 4, 5 / 4], [0, 0, 0], [6 / 4, 5 / 4, 6 / 4]]
            assert ds.x_test.tolist() == expected
        else:
            assert ds.x_test.shape == (3, 64, 3)
            assert ds.x_test[2, :4].tolist() == [[2, 2, 2], [3, 0, 3], [0, 2, 0], [1, 1, 1]]
            assert not ds.x_test[2, 4:].any() and not ds.x_test[1].any()
        texts = ["The Cat sat on mat", "Nothing known here", "Don't cat\\mat"]
        assert torch.equal(data.prepare_texts(texts, ds.preprocessing), ds.x_test)
    with pytest.raises(ValueError, match="differ from those used in training"):
        data.prepare_texts(["cat"], ds.preprocessing, word_vectors=data.DEFAULT_WORD_VECTORS)


def test_prepare_texts_rejects_bad_input(tmp_path):
    vectors = write_glove(tmp_path / "tiny.txt", TINY_GLOVE)
    wv = data.load_word_vectors(vectors)
    pre = data.text._text_preprocessing(wv, "ffnn", 64)
    with pytest.raises(ValueError, match="not one string"):
        data.prepare_texts("the cat", pre)
    with pytest.raises(ValueError, match="must be strings"):
        data.prepare_texts(["the", 3], pre)
    with pytest.raises(ValueError, match="tokenizer version"):
        data.prepare_texts(["cat"], {**pre, "tokenizer": {"version": 0}})
    with pytest.raises(ValueError, match="prepare_images"):
        data.prepare_texts(["cat"], {"modality": "image"})
    assert data.prepare_texts([], pre).shape == (0, 3)


def test_text_warnings_name_empty_texts_and_texts_of_unknown_words(tmp_path):
    """Such a text was prepared as the all-zero input and predicted with no word of it."""
    vectors = write_glove(tmp_path / "tiny.txt", TINY_GLOVE)
    pre = data.text._text_preprocessing(data.load_word_vectors(vectors), "ffnn", 64)
    got = data.text_warnings(["The cat sat", "", " ?! ", "Nothing known here", "the zzz"], pre)
    assert got[0] is None and got[4] is None  # one known word is something to go on
    assert "the text holds no words" in got[1] and "the text holds no words" in got[2]
    assert "none of its 3 words is in the model's vocabulary of 6 words" in got[3]
    assert data.text_warnings([], pre) == []


@pytest.mark.parametrize(("rows", "column", "texts"), [
    ([{"headline": "a b", "topic": "x"}], None, ["a b"]),  # the one column that is no label
    ([{"id": "1", "text": "a b"}], None, ["a b"]),  # the one named like a text
    ([{"Title": "a", "Description": "b c", "Class Index": "3"}], None, ["a b c"]),  # AG News's
    ([{"headline": "a", "id": "7"}], "headline", ["a"]),  # the column the model trained from
    ([{"text": None}, {"text": ""}], None, ["", ""]),  # empty cells are empty texts
])
def test_texts_of_rows_takes_the_text_column(rows, column, texts):
    assert tables.texts_of_rows(rows, column) == texts


@pytest.mark.parametrize(("rows", "words"), [
    ([{"a": "x", "b": "y"}], "cannot tell which column holds the texts (columns: 'a', 'b')"),
    ([{"text": "x"}, {"other": "y"}], "input 1: no column 'text'"),
    ([{"text": 5}], "input 0, column 'text': 5 is not a text"),
])
def test_texts_of_rows_says_what_is_wrong(rows, words):
    with pytest.raises(ValueError) as info:
        tables.texts_of_rows(rows)
    assert words in str(info.value), str(info.value)


def test_validate_ag_news_csv(tmp_path):
    summary = data.validate_ag_news_csv(require(AG_NEWS_CSV))
    assert summary == {"n": 7_600, "num_classes": 4, "class_counts": [1_900] * 4}
    cases = {
        "class_index,title,description\n1,a,b\n": "not an integer (the file must not have a header",
        "0,a,b\n": "must be 1 or more",
        "1,a,b\n1\n": "line 2: expected class_index,title,description",
        "1,a,b\n1,a,b\n1,a,b\n2,a,b\n": "too few samples",
        "": "holds no rows",
    }
    for content, message in cases.items():
        path = tmp_path / "upload.csv"
        path.write_text(content, encoding="utf-8")
        with pytest.raises(ValueError, match=re.escape(message)):
            data.validate_ag_news_csv(path)
    path.write_bytes(b"1,caf\xe9,b\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        data.validate_ag_news_csv(path)


def test_ag_news_not_found_names_the_places(tmp_path):
    with pytest.raises(data.DatasetNotFoundError) as info:
        data.load_dataset(ExperimentSpec(dataset="ag-news"), data_dir=tmp_path)
    assert str(tmp_path / "ag_news") in str(info.value) and "dataset_path" in str(info.value)


# ---------------------------------------------------------------------------- registry


def test_registry_and_entry_point_validation():
    assert data.available_datasets() == list(DATASETS)
    with pytest.raises(ValueError, match="needs an ExperimentSpec"):
        data.load_dataset({"dataset": "digits"})  # type: ignore[arg-type]


def test_digits_are_scikit_learn_s_to_the_bit_and_its_loader_stands_in_where_the_file_is_not(monkeypatch):
    """corel reads digits' file as ``load_digits`` does, without importing sklearn.datasets
    (tests/test_start_up.py); the same images and labels, bit for bit, in both ways."""
    from sklearn.datasets import load_digits

    from corel.data import digits

    want = load_digits()
    images, labels = digits.digits_arrays()
    assert images.dtype == want.images.dtype and images.shape == (1797, 8, 8)
    assert np.array_equal(images, want.images) and np.array_equal(labels, want.target)
    assert labels.dtype == np.int64
    assert np.array_equal(data.training_images("digits"),
                          np.rint(want.images * (255.0 / 16.0)).astype(np.uint8))
    # No file where scikit-learn keeps it (another layout of the package): its loader.
    monkeypatch.setattr(digits, "_digits_file", lambda: None)
    again, again_labels = digits.digits_arrays()
    assert np.array_equal(again, want.images) and np.array_equal(again_labels, want.target)
