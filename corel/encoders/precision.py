"""The one place that chooses how a frozen encoder's features are computed on the CPU.

A family offers its paths (:meth:`corel.encoders.contract.Family.paths`): ``fp32`` always,
``bf16`` where this CPU computes bfloat16 natively (AVX-512 BF16 or AMX), ``int8`` where
the family can run an int8 model (sentence-transformers through ONNX Runtime). A run asks
for one (the spec's ``precision``) or for ``auto``; either way the candidates go
through the parity gate on held-out rows of the run's own data (its validation split):

* the first percentile of the cosine between each row and its fp32 vector at least
  :data:`GATE_COSINE`;
* MAP@R (half the rows as queries, the other half as reference) within :data:`GATE_MAP`
  of fp32's.

``auto`` takes the fastest path that passes, measured on those rows, where it is at least
:data:`FASTER` times fp32's speed (else fp32: exact). A path asked for explicitly is used
even when it fails the gate, and the run's warnings say so. The choice and the gate's
figures are recorded in the run's preprocessing (``encoder.features_path``): served models and
batch jobs compute with the recorded path, a resumed run is given it again
(:func:`fixed_features`), and the features cache keeps each path's features apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

from corel.encoder_catalog import cpu_offers
from corel.encoders import kept

__all__ = ["FASTER", "GATE_COSINE", "GATE_MAP", "GATE_MIN_ROWS", "GATE_ROWS", "choose", "fixed_features"]

GATE_COSINE = 0.99
GATE_MAP = 0.005
GATE_ROWS = 256
"""Held-out rows the gate computes on each path (the validation split's first)."""
GATE_MIN_ROWS = 32
"""Fewer held-out rows than this cannot judge a path: ``auto`` then stays on fp32."""
FASTER = 1.15
"""How much faster than fp32 a path must measure for ``auto`` to leave fp32's exactness."""

_FIXED: ContextVar[dict[str, Any] | None] = ContextVar("corel_fixed_features", default=None)
_CHOICES: dict[str, dict[str, Any]] = {}
_CHOICES_LOCK = threading.Lock()


@contextmanager
def fixed_features(record: dict[str, Any] | None) -> Iterator[None]:
    """Within the block, a frozen encoder's features use the path ``record`` (a checkpoint's
    ``encoder.features_path``) instead of choosing again: a resumed run computes as it did."""
    token = _FIXED.set(record)
    try:
        yield
    finally:
        _FIXED.reset(token)


def _map_at_r(h: torch.Tensor, y: torch.Tensor) -> float:
    from corel.retrieval import retrieval_metrics

    q, r = slice(0, None, 2), slice(1, None, 2)
    return float(retrieval_metrics(h[q], y[q], h[r], y[r], "cosine")["mean_average_precision_at_r"])


def _judge(name: str, out: torch.Tensor, ref: torch.Tensor, y: torch.Tensor, ref_map: float,
           rate: float) -> dict[str, Any]:
    cos = torch.nn.functional.cosine_similarity(out.double(), ref.double(), dim=1)
    row: dict[str, Any] = {"rows_per_s": round(rate, 1), "cos_p1": round(float(torch.quantile(cos, 0.01)), 5),
                           "cos_min": round(float(cos.min()), 5)}
    reasons = []
    if row["cos_p1"] < GATE_COSINE:
        reasons.append(f"the first percentile of its cosine to fp32 is {row['cos_p1']:.4f} < {GATE_COSINE}")
    if len(torch.unique(y)) > 1 and len(y) >= 4:
        row["map_at_r"] = round(_map_at_r(out, y), 5)
        if abs(row["map_at_r"] - ref_map) > GATE_MAP:
            reasons.append(f"its MAP@R {row['map_at_r']:.4f} is more than {GATE_MAP} from fp32's {ref_map:.4f}")
    row["passed"] = not reasons
    if reasons:
        row["why"] = "; ".join(reasons)
    return row


def choose(digest: str, offered: tuple[str, ...], asked: str, held_out: Any,
           labels: torch.Tensor, compute: Callable[[str, Any], torch.Tensor],
           cache_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The features' path of a run on the encoder of content ``digest`` asking for ``asked``
    (checked against the CPU before: corel.encoder_catalog.precision_problem), its family
    offering ``offered``: the recorded one within
    :func:`fixed_features`, else the gate's verdict on ``held_out`` raw rows (the first
    :data:`GATE_ROWS`; ``labels`` theirs), each path's features from ``compute(path, rows)``.
    The verdict is kept for this process, in ``cache_dir`` and in the shared store
    (:mod:`corel.encoders.kept`), by the rows' content."""
    fixed = _FIXED.get()
    if fixed is not None:
        return dict(fixed)
    candidates = [p for p in offered if p != "fp32" and cpu_offers().get(p)]
    if asked not in ("auto", "fp32") and asked not in candidates:
        why = "this encoder does not offer it" if asked not in offered else "this CPU cannot compute it natively"
        return {"asked": asked, "precision": "fp32", "gate": {}, "warnings": [
            f"features: {asked} is not used ({why}); computed in fp32"]}
    if asked == "fp32" or not candidates:
        return {"asked": asked, "precision": "fp32", "gate": {}, "warnings": []}
    if asked == "auto" and len(labels) < GATE_MIN_ROWS:
        return {"asked": asked, "precision": "fp32", "gate": {}, "gate_rows": len(labels),
                "note": f"{len(labels)} held-out rows are too few (under {GATE_MIN_ROWS}) to judge a "
                        "faster path; computed in fp32", "warnings": []}
    rows = held_out[:GATE_ROWS]
    y = labels[:GATE_ROWS]
    key = _verdict_key(digest, asked, candidates, rows)
    with _CHOICES_LOCK:
        if key in _CHOICES:
            return _CHOICES[key]
    name = f"gate-{key[:40]}.json"
    found = kept.read(name, cache_dir)  # this host's file, else the shared store's
    if found is not None:
        record: dict[str, Any] = json.loads(found)
    else:
        record = _gate(asked, candidates, rows, y, compute)
        kept.keep(name, cache_dir, json.dumps(record).encode())
    with _CHOICES_LOCK:
        _CHOICES[key] = record
    return record


def _verdict_key(digest: str, asked: str, candidates: list[str], rows: Any) -> str:
    h = hashlib.sha256(f"{digest}|{asked}|{','.join(candidates)}|{torch.__version__}".encode())
    if isinstance(rows, torch.Tensor):
        h.update(rows.detach().cpu().contiguous().numpy().tobytes())
    else:
        for r in rows:
            h.update(str(r).encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def _gate(asked: str, candidates: list[str], rows: Any, y: torch.Tensor,
          compute: Callable[[str, Any], torch.Tensor]) -> dict[str, Any]:
    def timed(path: str) -> tuple[torch.Tensor, float]:
        compute(path, rows[:4])  # its one-off work (a model's copy, an export) is not its speed
        started = time.perf_counter()
        out = compute(path, rows)
        return out, len(rows) / max(time.perf_counter() - started, 1e-9)

    ref, ref_rate = timed("fp32")
    ref_map = _map_at_r(ref, y) if len(torch.unique(y)) > 1 and len(y) >= 4 else float("nan")
    gate: dict[str, Any] = {"fp32": {"rows_per_s": round(ref_rate, 1), "cos_p1": 1.0, "cos_min": 1.0,
                                     "passed": True, **({} if ref_map != ref_map else {"map_at_r": round(ref_map, 5)})}}
    warnings = []
    for path in candidates if asked == "auto" else [asked]:
        try:
            out, rate = timed(path)
        except Exception as exc:  # a model this path cannot run (an upload that does not export)
            gate[path] = {"passed": False, "why": f"it could not run ({type(exc).__name__}: {str(exc)[:200]})"}
            warnings.append(f"features: {path} is not used: {gate[path]['why']}; computed with torch")
            continue
        gate[path] = _judge(path, out, ref, y, ref_map, rate)
        if not gate[path]["passed"]:
            warnings.append(f"features: {path} failed the parity gate ({gate[path]['why']})"
                            + ("; used all the same, as asked" if asked == path else "; not used"))
    if asked != "auto":
        chosen = asked if gate.get(asked, {}).get("rows_per_s") is not None else "fp32"
    else:
        fast = [p for p in candidates if gate.get(p, {}).get("passed")
                and gate[p]["rows_per_s"] >= FASTER * gate["fp32"]["rows_per_s"]]
        chosen = max(fast, key=lambda p: gate[p]["rows_per_s"]) if fast else "fp32"
    return {"asked": asked, "precision": chosen, "gate_rows": len(y), "gate": gate, "warnings": warnings}
