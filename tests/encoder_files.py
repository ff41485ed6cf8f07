"""Small encoders of a user's own, made offline for the tests: a sentence-transformers
folder (a 2-layer BERT of width 32 with all-MiniLM-L6-v2's tokenizer, random weights) and
timm weights files (``test_efficientnet``: 99k parameters)."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import torch

TOPICS = {
    "sport": ["the team won the final match", "a striker scored twice in the cup game",
              "the coach praised his players after the league win", "the tennis champion lost in five sets"],
    "markets": ["shares fell as investors sold bank stocks", "the central bank raised interest rates",
                "oil prices climbed on supply fears", "the company reported higher quarterly profits"],
    "science": ["astronomers found a new planet orbiting a star", "the vaccine trial showed strong results",
                "researchers sequenced the genome of a rare plant", "a probe landed on the surface of mars"],
}
"""Sentences of three topics, four each: the tests' small text tables repeat them."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def tiny_sentence_transformer(folder: Path, seed: int = 0) -> Path:
    """A sentence-transformers model saved in ``folder``: BERT (2 layers, width 32), mean
    pooling, normalisation."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel

    from corel.encoders.files import installed

    bert = folder.parent / f"{folder.name}-bert"
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    minilm = installed("minilm", "text")
    model = BertModel(config)
    # Its word vectors: MiniLM's, projected to 32 dimensions (a fixed random projection), so
    # that texts on one topic come out near each other as with a real encoder.
    from safetensors.torch import load_file

    words = load_file(str(minilm / "model.safetensors"))
    key = next(k for k in words if k.endswith("word_embeddings.weight"))
    projection = torch.randn(words[key].shape[1], 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.copy_(words[key] @ projection)
    model.save_pretrained(bert)
    for name in TOKENIZER_FILES:
        if (minilm / name).is_file():
            shutil.copy(minilm / name, bert / name)
    word = models.Transformer(str(bert), max_seq_length=64)
    model = SentenceTransformer(modules=[word, models.Pooling(32, "mean")], device="cpu")
    model.save(str(folder))
    shutil.rmtree(bert)
    return folder


def zipped(folder: Path, into: Path, top: str | None = None) -> Path:
    """``folder`` as a .zip (its files at the root, or under ``top``)."""
    with zipfile.ZipFile(into, "w", zipfile.ZIP_DEFLATED) as z:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                rel = file.relative_to(folder).as_posix()
                z.write(file, f"{top}/{rel}" if top else rel)
    return into


def timm_weights(path: Path, arch: str = "test_efficientnet", fmt: str = "safetensors",
                 seed: int = 0) -> Path:
    """A timm architecture's weights (with its classifier, as timm saves them), random, in
    ``fmt``: safetensors or torch (a state dict saved with torch.save)."""
    import timm

    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path
