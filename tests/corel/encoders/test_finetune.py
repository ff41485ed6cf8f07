"""Pretrained encoders fine-tuned with the head (corel.encoders.finetune), on a small sentence-
transformers model (tests.encoder_files): the tower trains at its own learning rate, only
its last blocks when asked, a checkpoint holds the fine-tuned weights, a run resumes bit for
bit in float64, and a served run embeds raw texts as the trained model does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corel.data import load_dataset
from corel.serving import ServedModel
from corel.spec import ExperimentSpec
from corel.train import Callback, checkpoint_from_bytes, checkpoint_to_bytes, fit, group_specs
from tests.encoder_files import TOPICS, tiny_sentence_transformer

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finetune")
    texts, y = [], []
    for k, sentences in enumerate(TOPICS.values()):
        for i in range(20):
            texts.append(f"{sentences[i % 4]} ({i})")
            y.append(k)
    np.savez(tmp / "t.npz", texts=np.array(texts), y=np.array(y), class_names=np.array(list(TOPICS)))
    return tmp / "t.npz", tiny_sentence_transformer(tmp / "st")


def spec(files, **fields) -> ExperimentSpec:
    table, folder = files
    return ExperimentSpec(**{"dataset": "text", "dataset_path": str(table), "encoder": "sentence-transformers",
                             "encoder_path": str(folder), "encoder_mode": "finetune", "loss": "cosine",
                             "lam": 0.85, "epochs": 2, "lr": 0.01, "batch_size": 8, "hidden": 16, **fields})


def test_the_last_blocks_train_at_the_encoder_s_rate_and_the_rest_stays_pretrained(files):
    from sentence_transformers import SentenceTransformer

    result = fit(spec(files, trainable_blocks=1, encoder_lr=0.001), chance_epochs=0)
    groups = result.run.optimizer.param_groups
    assert [g["lr"] for g in groups] == [0.001, 0.01]
    trained = result.model.encoder.tower.steps[0].auto_model.state_dict()
    original = SentenceTransformer(str(files[1]), device="cpu", local_files_only=True)[0].auto_model.state_dict()
    changed = {k for k in original if not torch.equal(original[k], trained[k])}
    assert changed and all(k.startswith("encoder.layer.1.") for k in changed), sorted(changed)[:5]
    assert any(k.startswith("encoder.layer.1.attention") for k in changed)
    assert result.run.data.x_train.shape[1:] == (2, 64)  # ids and mask, to the encoder's max length


def test_a_checkpoint_holds_the_fine_tuned_weights_and_serves_raw_texts(files):
    result = fit(spec(files), chance_epochs=0)
    ckpt = checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    assert any(k.startswith("encoder.tower.steps.0.model.encoder.layer.0.") for k in ckpt["model"])
    served = ServedModel.from_checkpoint(ckpt)
    texts = ["the goalkeeper saved a penalty", "bond yields rose again"]
    x = served.prepare(texts)
    with torch.no_grad():
        result.model.eval()
        want = result.model.encoder(x)
        tower = result.model.encoder.tower(x)
    torch.testing.assert_close(served.embed(x), want)
    torch.testing.assert_close(served.embed(x, "encoder"), tower)
    assert served.embed(x, "encoder").shape == (2, 32)


def test_a_checkpoint_leaves_out_the_frozen_blocks_and_serves_and_resumes_as_the_whole_one(files):
    """With trainable_blocks, a checkpoint holds the trained blocks and the head alone: the
    embeddings and the blocks below come from the encoder's files (named by their digest in
    the preprocessing) when the model is built. It served and resumed as the whole one did;
    it held the whole encoder (91 MB for MiniLM training 2 of its 6 blocks)."""
    result = fit(spec(files, trainable_blocks=1), chance_epochs=0)
    best = result.run.best_checkpoint()
    whole = result.model.state_dict()
    kept = set(best["model"])
    assert kept < set(whole)
    left_out = set(whole) - kept
    assert left_out and all(".embeddings." in k or ".encoder.layer.0." in k for k in left_out), sorted(left_out)[:5]
    assert any(".encoder.layer.1." in k for k in kept) and "head.W" in kept
    blob = checkpoint_to_bytes(best)
    assert len(blob) < 0.8 * len(checkpoint_to_bytes({**best, "model": {k: v for k, v in whole.items()}}))
    served = ServedModel.from_checkpoint(checkpoint_from_bytes(blob))
    x = served.prepare(["the goalkeeper saved a penalty", "bond yields rose again"])
    with torch.no_grad():
        result.model.eval()
        want = result.model.encoder(x)
    torch.testing.assert_close(served.embed(x), want, atol=0, rtol=0)
    # The resume checkpoint too (a run resumed from one ends bit for bit as the whole run:
    # test_a_run_keeping_its_frozen_outputs_resumes_bit_for_bit_in_float64).
    assert set(result.run.checkpoint()["model"]) == kept
    # A checkpoint that lacks more than the frozen part is refused, saying so.
    broken = {**best, "model": {k: v for k, v in best["model"].items() if ".encoder.layer.1." not in k}}
    with pytest.raises(ValueError, match=r"missing \['encoder\.tower\..*layer\.1\."):
        ServedModel.from_checkpoint(broken)


def test_the_first_epoch_reports_the_frozen_blocks_outputs_as_it_computes_them(files):
    """A fine-tune's first epoch computes every row's frozen lower output (200 s over MiniLM
    on 2 cores), and showed no phase meanwhile: the engine reports it to ``on_features``, one
    count over all the rows; later epochs find them kept and report nothing."""
    from corel.encoders.finetune import FROZEN_OUTPUTS
    from corel.train import EngineOptions

    FROZEN_OUTPUTS.clear()
    heard: list[tuple[str, int, int, int]] = []

    class Epochs(Callback):
        epoch = 0

        def on_epoch_end(self, metrics, run) -> bool:
            self.epoch = metrics.epoch
            return False

    epochs = Epochs()
    options = EngineOptions(on_features=lambda name, done, total: heard.append((name, done, total, epochs.epoch)))
    result = fit(spec(files, trainable_blocks=1, epochs=3), [epochs], options=options, chance_epochs=0)
    data = result.run.data
    total = len(data.y_train) + len(data.y_val) + len(data.y_test)
    frozen = [h for h in heard if h[0].endswith("(its frozen blocks)")]
    assert frozen and all(t == total for _, _, t, _ in frozen), frozen
    assert {e for *_, e in frozen} == {0}  # the first epoch alone: the others found them kept
    done = [d for _, d, _, _ in frozen]
    assert done == sorted(done) and done[-1] == total, done


def test_an_evaluation_groups_texts_by_length_and_gives_each_row_its_own(files):
    """In eval mode a large batch of texts runs in groups of like length (not padded to its
    longest text): every row gets what it gets alone, in its own place."""
    from tests.conftest import assert_rows_close

    result = fit(spec(files, epochs=1), chance_epochs=0)
    model = result.model.eval()
    rng = np.random.default_rng(0)
    words = " ".join(s for sentences in TOPICS.values() for s in sentences).split()
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(1, 40, size=150)]
    served = ServedModel.from_checkpoint(result.run.best_checkpoint())
    x = served.prepare(texts)
    assert len(x) > model.encoder.tower.EVAL_ROWS
    with torch.no_grad():
        together = model.encoder(x)
        alone = torch.cat([model.encoder(x[i:i + 1]) for i in range(len(x))])
    assert_rows_close(together.numpy(), alone.numpy())


def test_a_fine_tuned_run_resumed_from_its_checkpoint_ends_bit_for_bit_in_float64(files):
    data = load_dataset(spec(files)).astype(torch.float64)
    whole = fit(spec(files, epochs=4), data=data, chance_epochs=0)
    saved: list[bytes] = []

    class StopAfterTwo(Callback):
        def on_epoch_end(self, metrics, run):
            saved.append(checkpoint_to_bytes(run.checkpoint()))
            return metrics.epoch == 2

    stopped = fit(spec(files, epochs=4), [StopAfterTwo()], data=data, chance_epochs=0)
    assert stopped.stopped and len(saved) == 2
    resumed = fit(spec(files, epochs=4), checkpoint=checkpoint_from_bytes(saved[-1]), data=data,
                  chance_epochs=0)
    assert next(whole.run.model.parameters()).dtype == torch.float64
    for key, value in whole.run.model.state_dict().items():
        assert torch.equal(value, resumed.run.model.state_dict()[key]), key
    assert [m.val_accuracy for m in resumed.history] == [m.val_accuracy for m in whole.history]


def test_fine_tuned_runs_are_not_stacked(files):
    specs = [spec(files, seed=s) for s in range(3)]
    assert group_specs(specs) == [[0], [1], [2]]


@pytest.mark.parametrize(("fields", "words"), [
    ({"dataset": "ag-news", "encoder": "minilm", "encoder_lr": 1e-5}, "encoder_lr applies to encoder_mode finetune"),
    ({"dataset": "ag-news", "trainable_blocks": 2}, "trainable_blocks applies to a pretrained encoder"),
    ({"dataset": "ag-news", "encoder": "minilm", "warmup": 0.2}, "warmup applies to encoder_mode finetune"),
    ({"dataset": "ag-news", "encoder": "minilm", "encoder_mode": "finetune", "warmup": 1.0}, "less than 1"),
    ({"dataset": "ag-news", "encoder": "minilm", "encoder_mode": "finetune", "trainable_blocks": 9},
     "encoder 'minilm' has 6 blocks"),
    ({"dataset": "digits", "encoder": "efficientnet-lite0", "encoder_mode": "finetune", "trainable_blocks": 8},
     "has 7 blocks"),
])
def test_a_bad_fine_tuning_spec_says_what_is_allowed(fields, words):
    with pytest.raises(ValueError, match=words):
        ExperimentSpec(**fields)


def test_more_blocks_than_a_user_s_encoder_has_are_refused_when_it_loads(files):
    with pytest.raises(ValueError, match="this encoder has 2 blocks"):
        fit(spec(files, trainable_blocks=3), chance_epochs=0)


def test_an_image_encoder_fine_tunes_from_pixels_and_serves_raw_images(tmp_path):
    from tests.encoder_files import timm_weights

    file = timm_weights(tmp_path / "w.safetensors", arch="test_convnext")
    image = ExperimentSpec(dataset="digits", encoder="timm:test_convnext", encoder_path=str(file),
                           encoder_mode="finetune", trainable_blocks=1, loss="gaussian", lam=0.8, epochs=1,
                           lr=0.01, train_subset=64, batch_size=16, hidden=16)
    data = load_dataset(image)
    data = type(data)(**{**data.__dict__, "x_val": data.x_val[:32], "y_val": data.y_val[:32],
                         "x_test": data.x_test[:32], "y_test": data.y_test[:32]})
    assert data.x_train.shape[1:] == (1, 8, 8)  # the pixels: the tower resizes them
    result = fit(image, data=data, chance_epochs=0)
    served = ServedModel.from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    raw = (data.x_test[:3] * 16).round().numpy()  # digits as stored: 0..16
    with torch.no_grad():
        result.model.eval()
        torch.testing.assert_close(served.embed(served.prepare(raw)), result.model.encoder(data.x_test[:3]),
                                   atol=1e-5, rtol=1e-5)


def test_a_frozen_lower_part_is_computed_once_per_row_and_shared_by_later_runs(files):
    from corel.encoders.finetune import FROZEN_OUTPUTS
    from corel.train import EngineOptions

    FROZEN_OUTPUTS.clear()
    data = load_dataset(spec(files, trainable_blocks=1)).astype(torch.float64)
    before = FROZEN_OUTPUTS.computed
    kept = fit(spec(files, trainable_blocks=1, epochs=3), data=data, chance_epochs=0)
    rows = len({bytes(r) for r in torch.cat([data.x_train, data.x_val, data.x_test])[:, 0].numpy()})
    assert FROZEN_OUTPUTS.computed - before == rows  # each distinct row once, over three epochs
    again = fit(spec(files, trainable_blocks=1, epochs=3, seed=1), data=data, chance_epochs=0)
    assert FROZEN_OUTPUTS.computed - before == rows  # a second run (a sweep's member) computes none
    assert again.history[-1].train_loss != kept.history[-1].train_loss
    every_step = fit(spec(files, trainable_blocks=1, epochs=3), data=data, chance_epochs=0,
                     options=EngineOptions(keep_frozen_outputs=False))
    for key, value in kept.run.model.state_dict().items():  # equal to rounding, not bit for bit
        torch.testing.assert_close(value, every_step.run.model.state_dict()[key], rtol=1e-9, atol=1e-11)


def test_a_run_keeping_its_frozen_outputs_resumes_bit_for_bit_in_float64(files):
    from corel.encoders.finetune import FROZEN_OUTPUTS

    data = load_dataset(spec(files)).astype(torch.float64)
    whole = fit(spec(files, trainable_blocks=1, epochs=3), data=data, chance_epochs=0)
    saved: list[bytes] = []

    class StopAfterOne(Callback):
        def on_epoch_end(self, metrics, run):
            saved.append(checkpoint_to_bytes(run.checkpoint()))
            return metrics.epoch == 1

    fit(spec(files, trainable_blocks=1, epochs=3), [StopAfterOne()], data=data, chance_epochs=0)
    FROZEN_OUTPUTS.clear()  # a new worker: nothing kept
    resumed = fit(spec(files, trainable_blocks=1, epochs=3), checkpoint=checkpoint_from_bytes(saved[-1]),
                  data=data, chance_epochs=0)
    for key, value in whole.run.model.state_dict().items():
        assert torch.equal(value, resumed.run.model.state_dict()[key]), key


@pytest.mark.parametrize("arch", ["test_efficientnet", "test_convnext"])
def test_an_image_encoder_s_frozen_stages_are_kept_and_give_what_the_whole_network_gives(tmp_path, arch):
    from corel.encoders.finetune import FrozenOutputs, frozen_outputs_kept
    from tests.encoder_files import timm_weights

    file = timm_weights(tmp_path / "w.safetensors", arch=f"{arch}")
    image = ExperimentSpec(dataset="digits", encoder=f"timm:{arch}", encoder_path=str(file),
                           encoder_mode="finetune", trainable_blocks=1, loss="cosine", lam=0.8, epochs=1,
                           lr=0.01, train_subset=16, batch_size=8, hidden=16)
    from corel.encoders import build_encoder

    model = build_encoder(image, (1, 8, 8)).double()
    tower = model.tower
    assert tower.lower == tower.blocks - 1  # the network walks as its children, in order
    x = load_dataset(image).x_train[:8].double()
    model.eval()
    kept = FrozenOutputs()
    with torch.no_grad():
        whole = model(x)
        with frozen_outputs_kept(model, kept):
            first, second = model(x), model(x[:4])
    assert kept.computed == 8
    torch.testing.assert_close(first, whole, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(second, first[:4], rtol=0, atol=0)
    # A row's kept output is the same bits whatever rows were computed beside it, and wherever.
    for dtype in (torch.float64, torch.float32):
        model = model.to(dtype)
        x = x.to(dtype)
        alone, mixed = FrozenOutputs(), FrozenOutputs()
        others = torch.rand(40, *x.shape[1:], dtype=dtype, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            with frozen_outputs_kept(model, alone):
                model(x[:3])
            with frozen_outputs_kept(model, mixed):
                model(torch.cat([others[:30], x[2:3], others[30:], x[:2]]))
        a, m = next(iter(alone.tables.values())), next(iter(mixed.tables.values()))
        for row in x[:3]:
            assert torch.equal(a[row.numpy().tobytes()], m[row.numpy().tobytes()])


def test_the_encoder_s_rate_warms_up_over_the_given_share_of_the_steps_and_the_head_s_does_not(files):
    from corel.train import start_run, train_pass

    run = start_run(spec(files, epochs=2, warmup=0.25, encoder_lr=0.004), data=load_dataset(spec(files)))
    seen: list[tuple[float, float]] = []

    class Watch(Callback):
        def on_batch_end(self, step):
            seen.append((run.optimizer.param_groups[0]["lr"], run.optimizer.param_groups[1]["lr"]))
            return False

    train_pass(run, [Watch()])
    run.epoch += 1
    train_pass(run, [Watch()])
    steps = len(seen)  # 2 epochs of ceil(rows / 8) steps: the ramp covers a quarter of them
    ramp = 0.25 * steps
    assert [round(e, 12) for e, _ in seen] == [round(0.004 * min(1.0, (i + 1) / ramp), 12) for i in range(steps)]
    assert seen[0][0] < 0.004 and seen[-1][0] == 0.004 and {h for _, h in seen} == {0.01}


def test_a_fine_tuned_text_run_exports_with_its_trained_weights_and_gives_what_it_serves(files, tmp_path):
    import io
    import zipfile

    import onnxruntime as ort
    from transformers import AutoTokenizer

    from corel.export import export_file

    result = fit(spec(files, trainable_blocks=1), chance_epochs=0)
    ckpt = result.run.best_checkpoint()
    exported = export_file(ckpt, "onnx")
    assert exported.suffix == "zip"
    zipfile.ZipFile(io.BytesIO(exported.data)).extractall(tmp_path)
    texts = ["the goalkeeper saved a penalty in the cup final", "bond yields rose again"]
    served = ServedModel.from_checkpoint(ckpt)
    x = served.prepare(texts)
    want, want_encoder = served.embed(x).numpy(), served.embed(x, "encoder").numpy()
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer"), local_files_only=True)
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="np")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    names = {i.name for i in session.get_inputs()}
    got, encoder = session.run(["embeddings", "encoder"], {k: v.astype(np.int64) for k, v in batch.items()
                                                            if k in names})
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(encoder, want_encoder, atol=2e-5, rtol=1e-4)
    # The pretrained encoder's own weights would give other numbers: the export holds the trained ones.
    pretrained = export_file(fit(spec(files, trainable_blocks=1, epochs=1, encoder_lr=1e-9), chance_epochs=0)
                             .run.best_checkpoint(), "onnx")
    zipfile.ZipFile(io.BytesIO(pretrained.data)).extractall(tmp_path / "other")
    other = ort.InferenceSession(str(tmp_path / "other" / "model.onnx"))
    assert not np.allclose(other.run(["encoder"], {k: v.astype(np.int64) for k, v in batch.items()
                                                  if k in names})[0], encoder, atol=1e-4)


def test_a_fine_tuned_image_run_exports_as_torchscript_from_pixels(tmp_path):
    import io

    from corel.export import export_file
    from tests.encoder_files import timm_weights

    file = timm_weights(tmp_path / "w.safetensors")
    image = ExperimentSpec(dataset="digits", encoder="timm:test_efficientnet", encoder_path=str(file),
                           encoder_mode="finetune", trainable_blocks=1, loss="cosine", lam=0.8, epochs=1,
                           lr=0.01, train_subset=32, batch_size=16, hidden=16)
    data = load_dataset(image)
    data = type(data)(**{**data.__dict__, "x_val": data.x_val[:16], "y_val": data.y_val[:16],
                         "x_test": data.x_test[:16], "y_test": data.y_test[:16]})
    result = fit(image, data=data, chance_epochs=0)
    ckpt = result.run.best_checkpoint()
    module = torch.jit.load(io.BytesIO(export_file(ckpt, "torchscript").data))
    served = ServedModel.from_checkpoint(ckpt)
    raw = (data.x_test[:3] * 16).round().numpy()
    x = served.prepare(raw)
    h, _, encoder = module(x)
    torch.testing.assert_close(h, served.embed(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(encoder, served.embed(x, "encoder"), atol=1e-5, rtol=1e-5)


def test_rows_kept_under_bf16_autocast_serve_the_float32_evaluation_too(tmp_path):
    from tests.encoder_files import timm_weights

    file = timm_weights(tmp_path / "w.safetensors")
    image = ExperimentSpec(dataset="digits", encoder="timm:test_efficientnet", encoder_path=str(file),
                           encoder_mode="finetune", trainable_blocks=1, loss="supcon", epochs=1, lr=0.01,
                           train_subset=32, batch_size=16, hidden=16, precision="bf16")
    data = load_dataset(image)
    data = type(data)(**{**data.__dict__, "x_val": torch.cat([data.x_train[:8], data.x_val[:8]]),
                         "y_val": torch.cat([data.y_train[:8], data.y_val[:8]]),
                         "x_test": data.x_test[:8], "y_test": data.y_test[:8]})
    result = fit(image, data=data, chance_epochs=0)  # validation meets rows kept while training
    assert len(result.history) == 1 and 0.0 <= result.history[0].val_accuracy <= 1.0
