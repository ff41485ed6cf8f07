"""The CLI's service commands against a live HTTP server."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from corel.cli import main
from corel.data import read_idx
from tests.app.conftest import finished, wait_for
from tests.conftest import FASHION_DIR, assert_rows_close


@pytest.fixture(scope="module")
def experiment(client, worker, workers):
    r = client.post("/experiments", json={"dataset": "fashion-mnist", "loss": "cosine", "lam": 0.8,
                                          "lr": 1e-3, "train_subset": 2000, "epochs": 1})
    body = wait_for(client, r.json()["id"], finished, workers=workers)
    assert body["status"] == "succeeded", body
    return body


def test_embed_writes_npy_matching_the_api(live_url, experiment, client, tmp_path, capsys):
    images = read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")[:7]
    np.save(tmp_path / "x.npy", images)
    out = tmp_path / "emb.npy"
    code = main(["embed", "--url", live_url, "--experiment", str(experiment["id"]),
                 "--npy", str(tmp_path / "x.npy"), "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "inputs" in printed and " 7 " in printed and "128" in printed
    saved = np.load(out)
    api = client.post("/embed", json={"experiment_id": experiment["id"], "arrays": images.tolist()})
    assert_rows_close(saved, api.json()["embeddings"])


def test_embed_sends_any_number_of_rows_in_batches(live_url, experiment, client, tmp_path, capsys):
    images = read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")[:5000]
    too_many = {"dtype": "uint8", "shape": [5000, 28, 28], "data": ""}
    assert client.post("/embed", json={"experiment_id": experiment["id"], "binary": too_many}
                       ).status_code == 413  # more than one request may carry
    np.save(tmp_path / "x.npy", images)
    out = tmp_path / "emb.npy"
    assert main(["embed", "--url", live_url, "--experiment", str(experiment["id"]),
                 "--npy", str(tmp_path / "x.npy"), "--out", str(out)]) == 0
    assert " 5000 " in capsys.readouterr().out
    saved = np.load(out)
    assert saved.shape == (5000, 128)
    for start in (0, 2500):
        r = client.post("/embed", params={"experiment_id": experiment["id"], "dtype": "uint8",
                                          "shape": "2500,28,28"},
                        content=np.ascontiguousarray(images[start:start + 2500]).tobytes(),
                        headers={"content-type": "application/octet-stream",
                                 "accept": "application/octet-stream"})
        assert_rows_close(saved[start:start + 2500],
                          np.frombuffer(r.content, "<f4").reshape(2500, 128))


def test_embed_returns_the_layer_asked_for(live_url, client, worker, workers, tmp_path, capsys):
    """--layer encoder: a run on a pretrained encoder (WordLlama) gives the encoder's own
    features, as /embed's layer encoder does; the default, the head's h."""
    from tests.encoder_files import TOPICS

    lines = ["text,topic"] + [f"{text} ({i}),{topic}" for topic, texts in TOPICS.items()
                              for i, text in enumerate(texts * 8)]
    upload = client.post("/datasets", files={"file": ("topics.csv", "\n".join(lines).encode())},
                         data={"kind": "text"})
    assert upload.status_code == 201, upload.text
    r = client.post("/experiments", json={"dataset": "text", "dataset_id": upload.json()["id"],
                                          "encoder": "wordllama", "loss": "cosine", "lam": 0.85,
                                          "epochs": 2, "lr": 0.003, "batch_size": 8, "hidden": 16})
    assert r.status_code == 202, r.text
    body = wait_for(client, r.json()["id"], finished, workers=workers)
    assert body["status"] == "succeeded", body
    texts = ["the striker scored in the final", "bond yields rose"]
    for layer, width in (("encoder", 256), ("head", 16)):
        out = tmp_path / f"{layer}.npy"
        assert main(["embed", "--url", live_url, "--experiment", str(body["id"]), "--text", *texts,
                     "--layer", layer, "--out", str(out)]) == 0
        api = client.post("/embed", json={"experiment_id": body["id"], "texts": texts, "layer": layer})
        assert np.load(out).shape == (2, width)
        assert_rows_close(np.load(out), api.json()["embeddings"])
    capsys.readouterr()


def test_predict_from_npy_in_small_batches(live_url, experiment, client, tmp_path, capsys):
    images = read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")[:5]
    np.save(tmp_path / "x.npy", images)
    assert main(["predict", "--url", live_url, "--experiment", str(experiment["id"]),
                 "--npy", str(tmp_path / "x.npy"), "--batch", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    api = client.post("/predict", json={"experiment_id": experiment["id"], "arrays": images.tolist()})
    names = [p["class_name"] for p in api.json()["predictions"]]
    assert len(lines) == 2 + 5
    for i, (line, name) in enumerate(zip(lines[2:], names, strict=True)):
        assert line.split()[0] == str(i) and name in line
    with pytest.raises(SystemExit):
        main(["predict", "--url", live_url, "--experiment", str(experiment["id"]),
              "--npy", str(tmp_path / "x.npy"), "--batch", "0"])


def test_predict_prints_a_table(live_url, experiment, client, tmp_path, capsys):
    images = read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")[:3]
    paths = []
    for i, im in enumerate(images):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(im).save(paths[-1])
    assert main(["predict", "--url", live_url, "--experiment", str(experiment["id"]),
                 "--images", *map(str, paths)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "max cosine similarity" in lines[0] and len(lines) == 2 + 3
    api = client.post("/predict", json={"experiment_id": experiment["id"], "arrays": images.tolist()})
    names = [p["class_name"] for p in api.json()["predictions"]]
    for line, name, path in zip(lines[2:], names, paths, strict=True):
        assert name in line
        assert line.split()[0] == str(path), line  # the file, not its position ("0", "1", ...)
    # neighbors names its inputs the same way, and each neighbour by the id its image_url uses.
    assert main(["neighbors", "--url", live_url, "--experiment", str(experiment["id"]),
                 "--images", *map(str, paths), "-k", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "nearest (id:class)" in lines[1], lines
    api = client.post(f"/experiments/{experiment['id']}/neighbors",
                      json={"arrays": images.tolist(), "k": 2}).json()
    for line, path, r in zip(lines[3:], paths, api["results"], strict=True):
        assert line.split()[0] == str(path), line
        assert all(f"{n['id']}:{n['class_name']}" in line for n in r["neighbors"]), (line, r)
        assert all(n["image_url"].endswith(f"/rows/{n['id']}/image") for n in r["neighbors"])


def test_neighbors_prints_and_saves_what_the_api_answers(live_url, experiment, client, tmp_path, capsys):
    images = read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")[:5]
    np.save(tmp_path / "q.npy", images)
    out = tmp_path / "nn.npz"
    assert main(["neighbors", "--url", live_url, "--experiment", str(experiment["id"]),
                 "--npy", str(tmp_path / "q.npy"), "-k", "4", "--batch", "2", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "the 4 nearest rows, cosine geometry" in lines[0] and len(lines) == 3 + 5 + 1
    api = client.post(f"/experiments/{experiment['id']}/neighbors",
                      json={"arrays": images.tolist(), "k": 4}).json()
    saved = np.load(out)
    assert saved["rows"].tolist() == [[n["row"] for n in r["neighbors"]] for r in api["results"]]
    assert saved["ids"].tolist() == [[n["id"] for n in r["neighbors"]] for r in api["results"]]
    np.testing.assert_allclose(saved["distances"], [[n["distance"] for n in r["neighbors"]]
                                                     for r in api["results"]], atol=1e-5)
    for line, r in zip(lines[3:8], api["results"], strict=True):
        assert r["knn_prediction"]["class_name"] in line


def test_index_builds_and_neighbors_searches_it(live_url, experiment, client, tmp_path, capsys):
    assert main(["index", "--url", live_url, "--experiment", str(experiment["id"]), "--kind", "hnsw",
                 "--wait"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    index_id = int(lines[2].split()[0])
    built = client.get(f"/indexes/{index_id}").json()
    assert built["status"] == "succeeded" and built["kind"] == "hnsw"
    assert lines[2].split()[1:4] == ["succeeded", "hnsw", "cosine"] and f"{built['recall']:.3f}" in lines[2]
    images = read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")[:3]
    np.save(tmp_path / "q.npy", images)
    assert main(["neighbors", "--url", live_url, "--experiment", str(experiment["id"]),
                 "--npy", str(tmp_path / "q.npy"), "-k", "3", "--index", str(index_id)]) == 0
    assert f"index {index_id})" in capsys.readouterr().out.splitlines()[0]


def test_reproduce_runs_a_sweep_and_prints_the_tables(live_url, worker, capsys, tmp_path):
    out = tmp_path / "report.md"
    code = main(["reproduce", "--url", live_url, "--dataset", "digits", "--losses", "cce,gaussian",
                 "--lambdas", "0.5,0.9", "--seeds", "2", "--epochs", "1", "--lr", "0.003",
                 "--no-clustering", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Lambda tuning" in printed and "Test accuracy at the best-validation epoch" in printed
    assert "| Gaussian-COREL | 0.5" in printed and "| CCE | -" in printed
    assert "Paired two-tailed t-test, " in printed
    assert "Command: corel reproduce --dataset digits" in printed and "wall time" in printed
    assert out.read_text() == printed.rstrip("\n") + "\n"
