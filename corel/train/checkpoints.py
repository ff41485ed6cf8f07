"""The checkpoint format: what a run writes after each epoch (to resume it, alone or in a
stacked group, on this machine or another) and what a served model is rebuilt from.

A checkpoint is a dict of tensors and plain values, loadable with ``weights_only=True``:
``format``, ``spec`` (JSON), ``epoch``, ``input_shape``, ``num_classes``,
``class_names``, ``preprocessing`` (JSON), ``model`` (a state dict on the CPU),
``optimizer``, ``rng`` (``torch``, ``shuffle``, and ``cuda`` when trained on a GPU),
``history`` and ``best``. A serving checkpoint (``Run.best_checkpoint``) has the best
epoch's weights and no optimizer or RNG state.

A fine-tuned model's state leaves out its tower's frozen part (:func:`model_state`): the
embeddings and blocks below ``trainable_blocks`` never change, and the model built from the
checkpoint's spec loads them from the encoder's own files, which the preprocessing names by
their content digest (check_same_encoder). A MiniLM run training 2 of its 6 blocks stored
the whole 91 MB encoder in every checkpoint.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import torch

from corel.device import pick_device
from corel.encoders.record import EncoderRecord
from corel.models import Classifier, build_classifier
from corel.spec import ExperimentSpec

CHECKPOINT_FORMAT = 1
# Where files are, not what they hold: a run resumed on another machine reads the same
# data, and the same encoder (a worker keeps an uploaded one in its own data directory),
# from another path. What an encoder's files hold is its content digest, which the
# checkpoint's preprocessing records (check_same_encoder).
LOCATIONS = ("dataset_path", "word_vectors", "encoder_path")


def optimizer_state(saved: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's optimizer state to load, its tensors copied. ``Optimizer.load_state_dict``
    keeps a given tensor whose dtype and device already fit, and Adam then steps it in
    place: loading the checkpoint's own tensors would change the checkpoint, and a second
    resume from it would start from the first one's later state."""
    return {
        "state": {index: {name: value.clone() if isinstance(value, torch.Tensor) else value
                          for name, value in entry.items()}
                  for index, entry in saved["state"].items()},
        "param_groups": [dict(group) for group in saved["param_groups"]],
    }


def cpu_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of a state dict on the CPU (what a checkpoint holds)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def frozen_keys(model: torch.nn.Module) -> set[str]:
    """The state-dict keys of a fine-tuned tower's frozen part (its ``frozen`` modules'
    parameters, which never train, and buffers, which stay as pretrained): empty for any
    other model."""
    frozen = [m for tower in model.modules() for m in getattr(tower, "frozen", None) or []
              if isinstance(m, torch.nn.Module)]
    if not frozen:
        return set()
    held = {id(t) for m in frozen for t in m.state_dict(keep_vars=True).values()}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}  # a tensor shared with
    return {k for k, t in model.state_dict(keep_vars=True).items()      # a trainable part stays
            if id(t) in held and id(t) not in trainable}


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of ``model``: its state on the CPU, but a fine-tuned tower's
    frozen part (:func:`frozen_keys`), which the model built from the checkpoint has already."""
    leave = frozen_keys(model)
    return cpu_state({k: v for k, v in model.state_dict().items() if k not in leave})


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a checkpoint's model state (a whole one, or one without the frozen part) into
    ``model``, built from the checkpoint's spec; ValueError where it lacks more than that."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    lacking = set(missing) - frozen_keys(model)
    if lacking or unexpected:
        raise ValueError(f"the checkpoint's model does not fit its spec's: missing "
                         f"{sorted(lacking)[:5]}, unexpected {sorted(unexpected)[:5]}")


def check_resumable(checkpoint: dict[str, Any], spec: ExperimentSpec, what: str = "the checkpoint") -> None:
    """ValueError unless ``checkpoint`` is of this format and was made for ``spec``
    (up to where its files are)."""
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        prefix = "" if what == "the checkpoint" else f"{what}: "
        raise ValueError(f"{prefix}unsupported checkpoint format {checkpoint.get('format')!r}")
    where = set(LOCATIONS)
    saved = ExperimentSpec.model_validate_json(checkpoint["spec"])
    if saved.model_dump(exclude=where) != spec.model_dump(exclude=where):
        raise ValueError(f"{what} was made for a different spec; cannot resume from it")


def check_same_encoder(checkpoint: dict[str, Any], preprocessing: dict[str, Any],
                       what: str = "the checkpoint") -> None:
    """ValueError unless ``checkpoint`` was trained on the pretrained encoder (by its content
    digest) that the data now goes through (``preprocessing``: the data's), or on none."""
    before, record = EncoderRecord.of(str(checkpoint.get("preprocessing") or "")), EncoderRecord.of(preprocessing)
    saved, now = (before.digest if before else None), (record.digest if record else None)
    if saved != now:
        raise ValueError(f"{what} was made on another encoder ({str(saved)[:12]}) than the files given now "
                         f"hold ({str(now)[:12]}); cannot resume from it")


def recorded_features(checkpoint: dict[str, Any] | None) -> dict[str, Any] | None:
    """The features' CPU path a checkpoint's run computed on (its preprocessing's
    ``encoder.features_path``; None: none recorded), which a resumed run computes on again."""
    if checkpoint is None:
        return None
    record = EncoderRecord.of(str(checkpoint.get("preprocessing") or ""))
    return dict(record.features_path) if record is not None and record.features_path is not None else None


def rng_state(shuffle: torch.Generator, device: torch.device,
              dropout: torch.Generator | None = None) -> dict[str, Any]:
    """The random state a checkpoint carries: the global one, the data order's, the run's
    dropout stream (a model with dropout: corel.encoders.paper.dropout_stream), and the GPU's
    when the run is on one."""
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "shuffle": shuffle.get_state()}
    if dropout is not None:
        rng["dropout"] = dropout.get_state()
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def restore_rng(checkpoint: dict[str, Any], shuffle: torch.Generator, device: torch.device,
                dropout: torch.Generator | None = None) -> None:
    """Set the random state :func:`rng_state` saved (the GPU's only on a GPU; the dropout
    stream where the checkpoint has one: one written before the streams has none, and its
    run goes on from the stream's start)."""
    torch.set_rng_state(checkpoint["rng"]["torch"])
    shuffle.set_state(checkpoint["rng"]["shuffle"])
    if dropout is not None and "dropout" in checkpoint["rng"]:
        dropout.set_state(checkpoint["rng"]["dropout"])
    if "cuda" in checkpoint["rng"] and device.type == "cuda":
        torch.cuda.set_rng_state(checkpoint["rng"]["cuda"], device)


def checkpoint_to_bytes(checkpoint: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    return buf.getvalue()


def checkpoint_from_bytes(blob: bytes) -> dict[str, Any]:
    """Load a checkpoint without unpickling arbitrary objects (``weights_only=True``)."""
    ckpt: dict[str, Any] = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    return ckpt


def model_from_checkpoint(
    checkpoint: dict[str, Any], device: str | torch.device | None = None,
    encoder_path: str | os.PathLike[str] | None = None,
) -> tuple[ExperimentSpec, Classifier]:
    """Rebuild the classifier a checkpoint holds, in eval mode, for serving.

    The model has the precision it was trained in (the checkpoint's ``head.W``).
    ``encoder_path``: where this machine holds the files of the user's own encoder the model
    was trained over (else where the training machine held them, the spec's).
    """
    spec = ExperimentSpec.model_validate_json(checkpoint["spec"])
    if encoder_path is not None:
        spec = spec.model_copy(update={"encoder_path": str(encoder_path)})
    model = build_classifier(spec, tuple(checkpoint["input_shape"]), int(checkpoint["num_classes"]),
                             checkpoint.get("preprocessing") and json.loads(checkpoint["preprocessing"]))
    dtype = checkpoint["model"]["head.W"].dtype
    if dtype != torch.float32:
        model = model.to(dtype)
    load_model_state(model, checkpoint["model"])
    return spec, model.to(pick_device(device)).eval()
