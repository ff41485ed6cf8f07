"""A frozen encoder's features on the fastest CPU path that keeps the ranking
(corel.encoders.precision): the parity gate on held-out rows, a path that fails it never
used by ``auto``, an asked-for path used with a warning, the recorded path used by a served
model and by a resumed run, and the spec's ``precision: int8`` refused where the encoder or
the CPU cannot."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

import corel.encoder_catalog as catalog
from corel.data import load_dataset
from corel.encoders import load, precision
from corel.encoders import text_transformers as tt
from corel.serving import ServedModel
from corel.spec import ExperimentSpec
from corel.train import Callback, checkpoint_from_bytes, checkpoint_to_bytes, fit
from tests.conftest import SHARED_DATASETS, assert_rows_close, require


@pytest.fixture(scope="module")
def news(tmp_path_factory):
    """136 AG News rows as a text table: 34 held out for validation (the gate's rows, over its
    minimum of 32)."""
    require((SHARED_DATASETS / "ag_news" / "test.csv").exists(), "AG News test split")
    with open(SHARED_DATASETS / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[:136]
    path = tmp_path_factory.mktemp("news") / "news.npz"
    np.savez(path, texts=np.array([f"{r[1]} {r[2]}" for r in rows]),
             y=np.array([int(r[0]) - 1 for r in rows]),
             class_names=np.array(["World", "Sports", "Business", "Sci/Tech"]))
    return path


@pytest.fixture(autouse=True)
def _fresh_verdicts(monkeypatch):
    """Each test's gate judges anew (no verdict kept from another test's)."""
    monkeypatch.setattr(precision, "_CHOICES", {})


@pytest.fixture
def judged(monkeypatch) -> dict[str, bool]:
    """The paths the gate judges: this CPU's offers, or where it offers no faster path (an
    AVX2 CPU, or torch's kernels capped below AVX-512) int8
    all the same: ONNX Runtime computes int8 on any x86-64 CPU (without VNNI, slowly), so
    the gate's verdicts are judged on every machine. ``auto`` takes int8 only if it passes
    the gate and is faster, which the figures decide."""
    offers = catalog.cpu_offers()
    if not (offers["bf16"] or offers["int8"]):
        offers = {**offers, "int8": True}
        monkeypatch.setattr(precision, "cpu_offers", lambda: offers)
    return offers


def spec(news, **fields) -> ExperimentSpec:
    return ExperimentSpec(**{"dataset": "text", "dataset_path": str(news), "encoder": "minilm",
                             "val_fraction": 0.25, "test_fraction": 0.25, "loss": "cosine", "lam": 0.85,
                             "epochs": 2, "batch_size": 32, "lr": 1e-3, "hidden": 32, **fields})


_FP32: dict[str, torch.Tensor] = {}


def split_texts(news, data) -> list[str]:
    """The test split's texts in the loader's order, found by their features (whatever the
    path, a row's nearest fp32 vector is its own text's); every text's fp32 vector computed
    once for the file (torch's fp32 path is no path a test here changes)."""
    with np.load(news) as table:
        texts = [str(t) for t in table["texts"]]
    if str(news) not in _FP32:
        _FP32[str(news)] = computed(data, "fp32", texts)
    fp32 = _FP32[str(news)]
    found = torch.nn.functional.normalize(data.x_test, dim=1) @ torch.nn.functional.normalize(fp32, dim=1).T
    return [texts[int(i)] for i in found.argmax(1)]


def computed(data, path_name: str, texts: list[str], served: bool = False) -> torch.Tensor:
    """``texts``' features on path ``path_name``, as a run keeps them (torch), or, ``served``,
    as a request's are computed: through the path's served engine (ONNX Runtime for int8, and
    for fp32 where the model exports; torch for bf16)."""
    enc = load(data.preprocessing)
    if served:
        return tt._encode(enc.path, texts, enc.name, path_name, report=False,
                          engine=tt.served_engine(enc.path, path_name))
    return enc.family.compute(path_name, texts, enc)


def test_auto_takes_the_fastest_path_that_passes_the_gate_and_computes_the_data_on_it(news, judged):
    data = load_dataset(spec(news))
    record = data.preprocessing["encoder"]["features_path"]
    gate = record["gate"]
    assert set(gate) == {"fp32"} | {p for p in ("bf16", "int8") if judged[p]}
    assert record["gate_rows"] == len(data.y_val) == 34
    fast = [p for p, row in gate.items() if p != "fp32" and row["passed"]
            and row["rows_per_s"] >= precision.FASTER * gate["fp32"]["rows_per_s"]]
    want = max(fast, key=lambda p: gate[p]["rows_per_s"]) if fast else "fp32"
    assert record["precision"] == want
    for row in gate.values():  # the verdicts follow from the figures
        assert row["passed"] == (row["cos_p1"] >= precision.GATE_COSINE
                                 and abs(row["map_at_r"] - gate["fp32"]["map_at_r"]) <= precision.GATE_MAP)
    # The data went through the recorded path: its test rows are that path's features of
    # the test texts (computed as the loader did, in one list), and no other path's.
    texts = split_texts(news, data)
    assert torch.equal(data.x_test, computed(data, want, texts))
    for other in set(gate) - {want}:
        assert not torch.equal(data.x_test, computed(data, other, texts))


def test_a_path_that_fails_the_gate_is_never_used_and_the_warnings_say_why(news, monkeypatch, judged):
    monkeypatch.setattr(precision, "GATE_COSINE", 0.9999999)  # stricter than bf16 or int8 can be
    data = load_dataset(spec(news))
    record = data.preprocessing["encoder"]["features_path"]
    assert record["precision"] == "fp32"
    failed = [p for p in record["gate"] if p != "fp32"]
    assert failed, "this CPU offers no bf16 or int8 path to judge"
    for name in failed:
        assert not record["gate"][name]["passed"]
        assert "cosine to fp32" in record["gate"][name]["why"]
        assert any(w.startswith(f"features: {name} failed the parity gate") and w.endswith("not used")
                   for w in record["warnings"])
    assert torch.equal(data.x_test, computed(data, "fp32", split_texts(news, data)))


def test_an_asked_path_is_used_even_when_it_fails_and_the_warnings_say_so(news, monkeypatch):
    if not catalog.cpu_offers()["bf16"]:
        data = load_dataset(spec(news, precision="bf16"))  # the head's training precision all the same
        record = data.preprocessing["encoder"]["features_path"]
        assert record["precision"] == "fp32" and "this CPU cannot compute it natively" in record["warnings"][0]
        return
    monkeypatch.setattr(precision, "GATE_COSINE", 0.9999999)
    data = load_dataset(spec(news, precision="bf16"))
    record = data.preprocessing["encoder"]["features_path"]
    assert (record["asked"], record["precision"]) == ("bf16", "bf16")
    assert set(record["gate"]) == {"fp32", "bf16"}
    assert record["warnings"] == [f"features: bf16 failed the parity gate ({record['gate']['bf16']['why']}); "
                                  "used all the same, as asked"]


def test_a_served_model_and_a_resumed_run_compute_on_the_recorded_path(news, monkeypatch):
    saved: list[bytes] = []

    class StopAfterOne(Callback):
        def on_epoch_end(self, metrics, run):
            saved.append(checkpoint_to_bytes(run.checkpoint()))
            return True

    first = fit(spec(news), [StopAfterOne()], chance_epochs=0)
    chosen = first.run.data.preprocessing["encoder"]["features_path"]["precision"]
    served = ServedModel.from_bytes(saved[-1])
    texts = ["Stocks fell as the central bank raised rates", "The striker scored twice in the final"]
    # Served texts compute on the recorded path through its served engine (fp32 is the path
    # chosen on a CPU with no bf16 or faster int8, such as the AVX2-only EPYC: ONNX Runtime's).
    assert torch.equal(served.prepare(texts), computed(first.run.data, chosen, texts, served=True))
    # A gate that would now refuse every faster path: the resumed run keeps the one it began on.
    monkeypatch.setattr(precision, "GATE_COSINE", 0.9999999)
    monkeypatch.setattr(precision, "_CHOICES", {})
    resumed = fit(spec(news), checkpoint=checkpoint_from_bytes(saved[-1]), chance_epochs=0)
    assert resumed.run.data.preprocessing["encoder"]["features_path"]["precision"] == chosen
    assert torch.equal(resumed.run.data.x_val, first.run.data.x_val)
    fresh = load_dataset(spec(news))
    assert fresh.preprocessing["encoder"]["features_path"]["precision"] == "fp32"


def test_too_few_held_out_rows_stay_on_fp32(news):
    data = load_dataset(spec(news, val_fraction=0.05))  # 10 rows
    record = data.preprocessing["encoder"]["features_path"]
    if not any(catalog.cpu_offers()[p] for p in ("bf16", "int8")):
        assert record["gate"] == {}
        return
    assert record["precision"] == "fp32" and record["gate"] == {}
    assert "too few" in record["note"]


def test_bf16_asked_for_image_features_is_used_where_the_cpu_computes_it():
    from corel.data import Dataset

    data = load_dataset(ExperimentSpec(dataset="digits", encoder="efficientnet-lite0", precision="bf16",
                                       train_subset=40))
    assert isinstance(data, Dataset)
    record = data.preprocessing["encoder"]["features_path"]
    assert record["asked"] == "bf16"
    assert record["precision"] == ("bf16" if catalog.cpu_offers()["bf16"] else "fp32")


@pytest.mark.parametrize(("fields", "words"), [
    ({"dataset": "ag-news", "encoder": "wordllama", "precision": "int8"},
     "encoder 'wordllama' does not compute int8 features (it offers auto, fp32)"),
    ({"dataset": "fashion-mnist", "encoder": "efficientnet-lite0", "precision": "int8"},
     "encoder 'efficientnet-lite0' does not compute int8 features (it offers auto, fp32, bf16)"),
    ({"dataset": "ag-news", "precision": "int8"}, "precision 'int8' applies to a frozen pretrained"),
    ({"dataset": "ag-news", "encoder": "minilm", "encoder_mode": "finetune", "precision": "int8"},
     "applies to a frozen encoder's features"),
    ({"dataset": "ag-news", "encoder": "minilm", "precision": "fp16"}, "precision"),
])
def test_a_precision_the_encoder_cannot_compute_is_refused(fields, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ExperimentSpec(**fields)


def test_int8_on_a_cpu_without_int8_is_refused_and_bf16_still_trains(monkeypatch):
    monkeypatch.setattr(catalog, "cpu_offers", lambda: {"bf16": False, "int8": False, "amx": False})
    with pytest.raises(ValueError, match="this CPU cannot compute int8 natively"):
        ExperimentSpec(dataset="ag-news", encoder="minilm", precision="int8")
    assert ExperimentSpec(dataset="ag-news", encoder="minilm", precision="bf16").precision == "bf16"
    assert ExperimentSpec(dataset="digits").precision == "auto"


def test_served_fp32_texts_run_on_onnx_runtime_and_equal_torch_s(news, tmp_path):
    """A served request's texts (not kept) on the fp32 path compute through ONNX Runtime's
    fp32 kernels, faster at the few texts a pass holds; a run's kept features stay torch's.
    Both are float32 arithmetic: rows within 1e-5 of their scale, cosine within 1e-9."""
    from corel.encoders import model_inputs

    data = load_dataset(spec(news, precision="fp32"))
    assert data.preprocessing["encoder"]["features_path"]["precision"] == "fp32"
    enc = load(data.preprocessing)
    assert tt.served_engine(enc.path, "fp32") == "onnx"
    texts = split_texts(news, data)[:12]
    kept = model_inputs(texts, data.preprocessing, tmp_path, keep=True)
    # torch's, as the run's own features are: the test split's rows, looked up by text
    assert torch.equal(kept, tt._encode(enc.path, texts, enc.name, "fp32", report=False))
    served = [model_inputs(texts[i:i + n], data.preprocessing) for i, n in ((0, 1), (1, 2), (3, 9))]
    got = torch.cat(served).double()
    assert_rows_close(got.numpy(), kept.numpy())
    cos = torch.nn.functional.cosine_similarity(got, kept.double(), dim=1)
    assert float(cos.min()) > 1 - 1e-9, cos
    # And what the service serves is ONNX Runtime's, not torch's under another name.
    assert torch.equal(served[0], torch.from_numpy(tt._run_onnx(enc.path, texts[:1], "fp32")))


def test_an_encoder_that_does_not_export_serves_its_texts_on_torch(tmp_path, caplog):
    """A user's sentence-transformers model that cannot be exported (it lower-cases texts
    before its tokenizer, which an exported tokenizer would not) is served on torch as
    before: logged once, its answers torch's own."""
    import json

    from tests.encoder_files import tiny_sentence_transformer

    folder = tiny_sentence_transformer(tmp_path / "lower")
    config = folder / "sentence_bert_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "do_lower_case": True}))
    texts = ["Shares FELL as the bank raised rates", "The striker scored twice"]
    with caplog.at_level("WARNING", logger="corel.features"):
        assert tt.served_engine(folder, "fp32") == "torch"
        assert tt.served_engine(folder, "fp32") == "torch"
    refused = [r for r in caplog.records if "ONNX export failed" in r.getMessage()]
    assert len(refused) == 1 and "lower-cases" in refused[0].error, caplog.records
    served = tt._encode(folder, texts, "lower", "fp32", report=False, engine=tt.served_engine(folder, "fp32"))
    assert torch.equal(served, tt._encode(folder, texts, "lower", "fp32", report=False))
