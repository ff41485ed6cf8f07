"""What a run records of its pretrained encoder, as a type, and that encoder loaded.

A run's checkpoint keeps its preprocessing as JSON; a run on a pretrained encoder records it
under ``"encoder"``: its name, mode (``frozen`` or ``finetune``), content digest, features'
width, the CPU path its features are computed on, and what its family needs to prepare
inputs again (a text model's ``max_length``, an image network's size, mean and std).
:class:`EncoderRecord` is that record read once; :class:`Encoder` is it resolved on this
machine (its declaration, family and files, checked against the digest), which every family
method takes. Resolve it once per request or dataset (:func:`load`) and hand it on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corel.encoder_catalog import EncoderDeclaration

if TYPE_CHECKING:
    from corel.encoders.contract import Family

__all__ = ["Encoder", "EncoderRecord"]

_KNOWN = ("name", "mode", "digest", "features", "features_path")


@dataclass(frozen=True)
class EncoderRecord:
    """A run's record of its pretrained encoder (its preprocessing's ``"encoder"``), typed.

    ``extra`` holds what the family records beside (``max_length``; ``image_size``, ``mean``,
    ``std``); ``pixels`` an image run's own pixels' preprocessing, recorded beside the
    encoder; ``modality`` the run's (``text`` or ``image``)."""

    name: str
    mode: str
    digest: str
    features: int
    modality: str
    features_path: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    pixels: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, preprocessing: Mapping[str, Any] | str | None) -> EncoderRecord | None:
        """The record a run's ``preprocessing`` holds (a mapping, or a checkpoint's JSON of
        it); None where the run has no pretrained encoder. ValueError names what is missing."""
        whole: Mapping[str, Any] = (json.loads(preprocessing or "{}") if isinstance(preprocessing, str)
                                    else preprocessing or {})
        meta = whole.get("encoder")
        if not meta:
            return None
        missing = [k for k in ("name", "digest") if not meta.get(k)]
        if missing:
            raise ValueError(f"the run's encoder record lacks {', '.join(missing)}: {dict(meta)}")
        found = meta.get("features_path")
        return cls(name=str(meta["name"]), mode=str(meta.get("mode") or "frozen"), digest=str(meta["digest"]),
                   features=int(meta.get("features") or 0),
                   modality="text" if whole.get("modality") == "text" else "image",
                   features_path=dict(found) if isinstance(found, Mapping) else None,
                   extra={k: v for k, v in meta.items() if k not in _KNOWN},
                   pixels=dict(whole.get("pixels") or {}))

    @property
    def fine_tuned(self) -> bool:
        """Whether the model's inputs are what comes before the encoder (a fine-tuned run's)
        rather than its features (a frozen one's)."""
        return self.mode == "finetune"

    @property
    def precision(self) -> str:
        """The CPU path the features are computed on (``fp32`` where none was recorded: runs
        made before the choice existed)."""
        return str((self.features_path or {}).get("precision") or "fp32")

    @property
    def cache_name(self) -> str:
        """The features cache's name of the encoder and its features' path: its digest (fp32,
        the files of runs made before the path was chosen), else digest:path."""
        return self.digest if self.precision == "fp32" else f"{self.digest}:{self.precision}"

    def field(self, key: str) -> Any:
        """A field the family records beside the common ones; ValueError if it did not."""
        if key not in self.extra:
            raise ValueError(f"encoder {self.name!r}'s record has no {key!r} (it holds "
                             f"{', '.join(sorted(self.extra)) or 'nothing more'})")
        return self.extra[key]

    def to_dict(self) -> dict[str, Any]:
        """The record as a checkpoint's preprocessing holds it under ``"encoder"``."""
        out: dict[str, Any] = {"name": self.name, "mode": self.mode, "digest": self.digest,
                               "features": self.features, **self.extra}
        if self.features_path is not None:
            out["features_path"] = dict(self.features_path)
        return out


@dataclass(frozen=True)
class Encoder:
    """A recorded encoder resolved on this machine: its record, declaration, family and
    files (checked against the record's digest)."""

    record: EncoderRecord
    decl: EncoderDeclaration
    family: Family
    path: Path

    @property
    def name(self) -> str:
        return self.record.name
