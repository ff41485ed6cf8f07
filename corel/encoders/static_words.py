"""The static family: static token embeddings, a text's features the mean of its tokens'
embeddings (no transformer). WordLlama is its packaged member: the PyPI package ``wordllama``
carries its weights (``weights/<config>_<dim>.safetensors``, float16) and its tokenizer
(``tokenizers/<config>_tokenizer_config.json``, Llama 2's) inside the wheel, read here
offline (the package's own loader looks for the tokenizer in a folder the wheel lacks and
then downloads it).

The features are WordLlama's ``embed`` (its default: no normalisation): the tokens without
special tokens, none cut, each text's embeddings averaged over its attention mask, computed
in float32 (the tests hold them to the package's own). Texts go in order of length, a few
hundred at a time, so that a batch pads little.
"""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from corel.encoder_catalog import EncoderDeclaration
from corel.encoders import features as cache
from corel.encoders.contract import TOKENIZER_FOLDER, ExportPart, Family, texts_of
from corel.encoders.record import Encoder

__all__ = ["CONFIG", "StaticEmbeddings", "StaticEncoder", "load"]

CONFIG = "l2_supercat"
"""WordLlama's model (its configuration's name)."""
DIM = 256
"""The width of its embeddings that corel reads (the package ships this one)."""
BATCH = 256
"""Texts tokenised and pooled at a time."""
PROGRESS_TEXTS = 4096
"""Texts a piece of the progress a run reports."""


def _weights_file(path: Path) -> Path:
    return path / "weights" / f"{CONFIG}_{DIM}.safetensors"


def _tokenizer_file(path: Path) -> Path:
    return path / "tokenizers" / f"{CONFIG}_tokenizer_config.json"


class StaticEncoder(nn.Module):
    """Token ids and attention mask (N, L) -> the mean of the tokens' embeddings over the mask
    (N, width), float32."""

    def __init__(self, weights: torch.Tensor) -> None:
        super().__init__()
        self.embedding = nn.Embedding.from_pretrained(weights.float(), freeze=True)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        ids = input_ids.clamp(0, self.embedding.num_embeddings - 1)  # as WordLlama clips them
        mask = attention_mask.to(torch.float32).unsqueeze(-1)
        total = (self.embedding(ids) * mask).sum(dim=1)
        return total / mask.sum(dim=1).clamp(min=1.0)


class _Loaded:
    def __init__(self, path: Path) -> None:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.encoder = StaticEncoder(load_file(str(_weights_file(path)))["embedding.weight"]).eval()
        self.tokenizer = Tokenizer.from_file(str(_tokenizer_file(path)))
        self.tokenizer.enable_padding()
        self.tokenizer.no_truncation()
        self.lock = threading.Lock()  # a tokenizer's padding settings are its own state

    def tokens(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        with self.lock:
            encoded = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        ids = torch.tensor([e.ids for e in encoded], dtype=torch.int64)
        mask = torch.tensor([e.attention_mask for e in encoded], dtype=torch.int64)
        return ids, mask


_LOAD_LOCK = threading.Lock()


@functools.cache
def _load(path: str) -> _Loaded:
    return _Loaded(Path(path))


def load(path: Path) -> Any:
    """The embeddings and tokenizer in ``path`` (the wordllama package's folder), loaded once
    per process."""
    with _LOAD_LOCK:
        return _load(str(path))


def _encode(path: Path, texts: list[str], name: str) -> torch.Tensor:
    loaded = load(path)
    out = torch.empty(len(texts), loaded.encoder.embedding.embedding_dim)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # like lengths together
    progress = cache.progress()
    with torch.inference_mode():
        for start in range(0, len(texts), BATCH):
            rows = order[start:start + BATCH]
            ids, mask = loaded.tokens([texts[i] for i in rows])
            out[rows] = loaded.encoder(ids, mask)
            done = min(start + BATCH, len(texts))
            if progress is not None and (done % PROGRESS_TEXTS < BATCH or done == len(texts)):
                progress(name, done, len(texts))
    cache.COMPUTED["texts"] += len(texts)
    return out


class StaticEmbeddings(Family):
    """Static token embeddings (WordLlama): frozen only."""

    name = "static"
    modality = "text"

    def check_files(self, path: Path) -> None:
        for file in (_weights_file(path), _tokenizer_file(path)):
            if not file.is_file():
                raise ValueError(f"{path} holds no static embeddings ({file.name} is missing)")

    def preprocessing(self, decl: EncoderDeclaration, name: str, path: Path, digest: str, *, mode: str,
                      pixels: dict[str, Any] | None = None) -> dict[str, Any]:
        if mode != "frozen":
            raise ValueError(f"encoder {name!r} is frozen only: its features are a mean of token "
                             "embeddings, with no blocks to fine-tune")
        width = int(decl.features or DIM)
        return {"modality": "text", "input_shape": [width],
                "encoder": {"name": name, "mode": "frozen", "digest": digest, "features": width},
                "input": "one string per sample; for AG News rows, title + ' ' + description; the "
                         "encoder's own tokenizer (Llama 2's), no special tokens, none cut"}

    def features(self, raw: Any, enc: Encoder, cache_dir: str | Path | None = None, *,
                 keep: bool = True) -> torch.Tensor:
        texts = texts_of(raw)
        return cache.of_texts(texts, enc.record, cache_dir, keep, lambda: _encode(enc.path, texts, enc.name))

    def inputs(self, raw: Any, enc: Encoder) -> torch.Tensor:
        raise ValueError("static embeddings are frozen only: a model takes their features")

    def tower(self, enc: Encoder, trainable_blocks: int | None) -> nn.Module:
        raise ValueError(f"encoder {enc.decl.name!r} is frozen only")

    def export_part(self, enc: Encoder, fmt: str, tuned: nn.Module | None = None) -> ExportPart:
        from tokenizers import Tokenizer

        path = enc.path
        loaded = load(path)
        sample = ["a", "an example of the texts this model reads, longer than the first"]
        ids, mask = loaded.tokens(sample)
        # tokenizer.json as the features are made: no special tokens (no post-processor),
        # none cut, each batch padded to its longest text.
        spec = json.loads(_tokenizer_file(path).read_text())
        spec["post_processor"] = None
        backend = Tokenizer.from_str(json.dumps(spec))
        backend.enable_padding()
        backend.no_truncation()
        files = {"tokenizer.json": backend.to_str().encode(),
                 "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                      "add_bos_token": False, "add_eos_token": False,
                                                      "pad_token": "<unk>"}, indent=2).encode()}
        about = {
            "folder": TOKENIZER_FOLDER, "files": sorted(files), "max_length": None,
            "truncation": "none: every token of a text counts",
            "padding": "each batch padded to its longest text (attention_mask 0 there)",
            "use": f"tokenizers.Tokenizer.from_file('{TOKENIZER_FOLDER}/tokenizer.json').encode_batch(texts) "
                   "(its ids and attention_mask)",
            "modules": ["StaticEncoder"],
        }
        return ExportPart(StaticEncoder(loaded.encoder.embedding.weight.detach().clone()), (ids, mask),
                          ["input_ids", "attention_mask"], files, about)

    def check_upload(self, path: Path, architecture: str | None = None) -> dict[str, Any]:
        raise ValueError("static embeddings are not uploaded: wordllama is installed with corel")


FAMILY = StaticEmbeddings()
