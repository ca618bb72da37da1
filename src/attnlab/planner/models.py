"""What the planner needs to know of a model: its shapes, as data, from a config.

A model is given as a path to a transformers ``config.json`` (the file, or a folder holding it),
the name of a bundled architecture (:data:`BUNDLED`), or attnlab's own
:class:`~attnlab.transformer.TransformerConfig`. Nothing is fetched from the hub.

Every number is read from the config, never derived when the config says otherwise: the head
dimension (``head_dim``: Gemma-2's 256 is not 3584 / 16), the grouped k/v heads, and each layer's
attention window: Mistral's ``sliding_window``; Qwen2's, only where ``use_sliding_window`` is true
and for the layers from ``max_window_layers`` on (as transformers reads it); Gemma-2's alternating
local and global layers (``layer_types`` where the config lists them, else every even layer local,
as transformers' Gemma-2 does; Gemma-3's five local layers to a global one; gpt-oss's alternation).

The models of 2025 add what changes the counts: **latent attention** (DeepSeek-V3's MLA: the cache holds
``kv_lora_rank + qk_rope_head_dim`` numbers per token and layer, one row for every head, replicated on
every device under tensor parallelism), a **mixture of experts** (``num_experts`` of width
``expert_size``, ``experts_per_token`` of them active, a shared expert of ``shared_size``, the first
``dense_layers`` layers dense: a decode step reads the experts its tokens chose, a prefill computes
``experts_per_token`` of them per token), and **weights in their published formats**, read from
``quantization_config``: gpt-oss's experts in MXFP4 (4-bit values, an 8-bit scale per 32: 4.25 bits),
DeepSeek-V3's linear layers in FP8 with a float32 scale per 128 × 128 block
(:data:`WEIGHT_FORMATS`). The cache's dtype stays the plan's ``dtype``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.planner.models_2025 import BUNDLED_2025, extra_fields, transformer_fields

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "fp8": 1}
# Bytes per weight of the published quantized formats, scales included: MXFP4 (OCP microscaling: 4-bit
# values, one 8-bit exponent per 32), FP8 e4m3 with one float32 scale per 128 × 128 block (DeepSeek-V3).
WEIGHT_FORMATS = {"mxfp4": (4 + 8 / 32) / 8, "fp8-block128": 1 + 4 / (128 * 128)}


@dataclass(frozen=True)
class Architecture:
    """The shapes that set a model's cost. ``windows``: per layer, the keys a query sees (None: all)."""

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    windows: tuple[int | None, ...]
    gated: bool = True  # SwiGLU / GeGLU feed-forward: gate, up and down matrices
    tied: bool = False  # the LM head is the embedding matrix
    learned_positions: bool = False  # GPT-2's position table
    qkv_bias: bool = False
    dtype: str = "bfloat16"  # the dtype the weights are published in
    source: str = ""  # where the numbers come from
    kv_lora_rank: int = 0  # latent attention (MLA): the latent's width (0: per-head keys and values) ...
    rope_dim: int = 0  # ... the rotary key's, cached beside it (head_dim is a head's query/key width)
    q_lora_rank: int = 0  # MLA's low-rank query (0: one projection)
    v_head_dim: int = 0  # a head's value width when it differs from head_dim (MLA)
    num_experts: int = 0  # a mixture of experts (0: a dense FFN of intermediate_size in every layer) ...
    experts_per_token: int = 0
    expert_size: int = 0  # ... each expert's width
    shared_size: int = 0  # the shared expert's width (DeepSeek-V3)
    dense_layers: int = 0  # layers of a mixture whose FFN is dense (DeepSeek-V3's first 3)
    expert_format: str = ""  # the experts' published format (WEIGHT_FORMATS; "": dtype)
    linear_format: str = ""  # every linear layer's published format, experts included unless expert_format

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size",
                     "vocab_size", "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{self.name}: {name} must be an int >= 1, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads={self.num_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_kv_heads}")
        if len(self.windows) != self.num_layers:
            raise ValueError(f"{self.name}: windows has {len(self.windows)} entries, expected one per layer "
                             f"({self.num_layers})")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"{self.name}: dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        for name in ("expert_format", "linear_format"):
            if getattr(self, name) not in ("", *WEIGHT_FORMATS):
                raise ValueError(f"{self.name}: {name} must be one of {', '.join(WEIGHT_FORMATS)} or '', "
                                 f"got {getattr(self, name)!r}")
        if self.num_experts and not (1 <= self.experts_per_token <= self.num_experts and self.expert_size >= 1):
            raise ValueError(f"{self.name}: a mixture needs 1 <= experts_per_token <= num_experts={self.num_experts} "
                             f"and expert_size >= 1, got {self.experts_per_token}, {self.expert_size}")

    @property
    def latent(self) -> bool:
        """Latent attention (MLA): the cache holds one latent row per token and layer for every head."""
        return self.kv_lora_rank > 0

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def routed_layers(self) -> int:
        return self.num_layers - self.dense_layers if self.num_experts else 0

    @property
    def windowed(self) -> bool:
        return any(w is not None for w in self.windows)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return dict(asdict(self), windows=list(self.windows))


@dataclass(frozen=True)
class Bundled:
    """A well-known architecture: its ``config.json`` numbers, where they are published, which version."""

    config: dict[str, Any]
    source: str
    version: str
    aliases: tuple[str, ...] = field(default=())


# Written from the published config.json files (the hub cannot be reached here: transcribed, not
# downloaded); the URL and revision say where each can be checked.
BUNDLED: dict[str, Bundled] = {
    "gpt2": Bundled(
        {"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257,
         "n_inner": None, "tie_word_embeddings": True, "torch_dtype": "float32"},
        "https://huggingface.co/openai-community/gpt2/blob/main/config.json", "main (2019 release)", ("gpt-2",)),
    "llama-3.1-8b": Bundled(
        {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "head_dim": 128, "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
         "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
        "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json", "Llama 3.1, July 2024",
        ("meta-llama/llama-3.1-8b", "llama-3.1-8b-instruct")),
    "llama-3.1-70b": Bundled(
        {"model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
         "head_dim": 128, "hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 128256,
         "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
        "https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json", "Llama 3.1, July 2024",
        ("meta-llama/llama-3.1-70b",)),
    "mistral-7b-v0.1": Bundled(
        {"model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768,
         "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
        "https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json", "v0.1, September 2023",
        ("mistralai/mistral-7b-v0.1",)),
    "qwen2.5-7b": Bundled(
        {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
         "hidden_size": 3584, "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 131072,
         "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
        "https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json", "Qwen2.5, September 2024",
        ("qwen/qwen2.5-7b",)),
    "gemma-2-9b": Bundled(
        {"model_type": "gemma2", "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
         "head_dim": 256, "hidden_size": 3584, "intermediate_size": 14336, "vocab_size": 256000,
         "max_position_embeddings": 8192, "sliding_window": 4096, "tie_word_embeddings": True,
         "torch_dtype": "float32"},
        "https://huggingface.co/google/gemma-2-9b/blob/main/config.json", "Gemma 2, June 2024",
        ("google/gemma-2-9b",)),
}
BUNDLED.update({name: Bundled(*entry) for name, entry in BUNDLED_2025.items()})
FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "gemma", "gemma2", "qwen3", "qwen3_moe", "gemma3_text", "gpt_oss",
            "deepseek_v3")  # model_type values read


def _need(c: dict, *names: str, where: str) -> Any:
    """The first of ``names`` present in the config, an int >= 1, or an error naming the field."""
    for n in names:
        if c.get(n) is not None:
            return _count(c, n, where)
    raise ValueError(f"{where}: the config has no {' or '.join(repr(n) for n in names)}, which the planner needs")


def _count(c: dict, name: str, where: str, default: Any = None) -> Any:
    """``c[name]`` checked to be an int >= 1 (``default`` when absent or null), or an error naming the key:
    a config is the user's file, so a string or a fraction there is their mistake, said as such."""
    value = c.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name} must be an int >= 1, got {value!r}")
    return value


def _head_dim(c: dict, d: int, heads: int, where: str, keys: tuple[str, str]) -> int:
    """The config's ``head_dim`` (Gemma: 256 with d = 3072), else d / heads, which must divide evenly: a
    hidden size the heads do not split (250 over 8) is a config no model has, not heads of 31."""
    explicit = _count(c, "head_dim", where)
    if explicit is not None:
        return explicit
    if d % heads:
        raise ValueError(f"{where}: {keys[0]}={d} is not a multiple of {keys[1]}={heads}, so the heads' width is "
                         f"not whole; give head_dim, or a {keys[0]} that {keys[1]} divides")
    return d // heads


def _windows(c: dict, layers: int, where: str) -> tuple[int | None, ...]:
    """Each layer's window, as transformers reads the config of this family."""
    kind = c.get("model_type")
    w = None if c.get("sliding_window") == 0 else _count(c, "sliding_window", where)  # 0, as null: no window
    if c.get("layer_types"):  # newer configs list them: "sliding_attention" / "full_attention"
        types = c["layer_types"]
        if not isinstance(types, list) or len(types) != layers:
            raise ValueError(f"{where}: layer_types must list one entry per layer (num_hidden_layers = {layers}), "
                             f"got {types!r}")
        return tuple(w if t == "sliding_attention" else None for t in types)
    if not w:
        return (None,) * layers
    if kind == "gemma3_text":  # five local layers to a global one (sliding_window_pattern)
        every = c.get("sliding_window_pattern", 6)
        return tuple(w if (i + 1) % every else None for i in range(layers))
    if kind == "gpt_oss":  # window and full layers alternate, the first windowed
        return tuple(w if i % 2 == 0 else None for i in range(layers))
    if kind in ("qwen2", "qwen3", "qwen3_moe"):  # the window is on only when switched on, and only from max_window_layers on
        if not c.get("use_sliding_window", False):
            return (None,) * layers
        start = c.get("max_window_layers", layers)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"{where}: max_window_layers must be an int >= 0, got {start!r}")
        return tuple(w if i >= start else None for i in range(layers))
    if kind == "gemma2":  # local (windowed) and global layers alternate, the first local
        return tuple(w if i % 2 == 0 else None for i in range(layers))
    return (w,) * layers


def from_config(c: dict, name: str = "config.json", source: str = "") -> Architecture:
    """An :class:`Architecture` from a transformers ``config.json`` dict (Gemma-3's multimodal one: its text model)."""
    if c.get("model_type") == "gemma3" and isinstance(c.get("text_config"), dict):  # the language model is what is served
        c = {"torch_dtype": c.get("torch_dtype")} | c["text_config"] | {"model_type": "gemma3_text"}
    kind = c.get("model_type")
    if kind not in FAMILIES:
        raise ValueError(f"{name}: model_type must be one of {', '.join(FAMILIES)} for the planner, got {kind!r}")
    where = f"{name} ({kind})"
    if kind == "gpt2":
        d, heads = _need(c, "n_embd", where=where), _need(c, "n_head", where=where)
        layers = _need(c, "n_layer", where=where)
        return Architecture(
            name, layers, heads, heads, _head_dim({}, d, heads, where, ("n_embd", "n_head")), d,
            _count(c, "n_inner", where, 4 * d), _need(c, "vocab_size", where=where),
            _need(c, "n_positions", "n_ctx", where=where), (None,) * layers, gated=False,
            tied=c.get("tie_word_embeddings", True), learned_positions=True, qkv_bias=True,
            dtype=_dtype(c, where, "float32"), source=source)
    d = _need(c, "hidden_size", where=where)
    heads = _need(c, "num_attention_heads", where=where)
    layers = _need(c, "num_hidden_layers", where=where)
    kv = _count(c, "num_key_value_heads", where, heads)
    if heads % kv:
        raise ValueError(f"{where}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    head_dim = _head_dim(c, d, heads, where, ("hidden_size", "num_attention_heads"))
    more = extra_fields(c, kind, where, layers)
    return Architecture(
        name, layers, heads, kv, more.pop("head_dim", head_dim), d,
        _need(c, "intermediate_size", where=where), _need(c, "vocab_size", where=where),
        _need(c, "max_position_embeddings", where=where), _windows(c, layers, where),
        gated=True, tied=c.get("tie_word_embeddings", kind.startswith("gemma")),
        qkv_bias=bool(c.get("attention_bias", kind in ("qwen2", "gpt_oss"))), dtype=_dtype(c, where, "bfloat16"),
        source=source, **more)


def _dtype(c: dict, where: str, default: str) -> str:
    value = c.get("torch_dtype") or default
    if value not in DTYPE_BYTES:
        raise ValueError(f"{where}: torch_dtype must be one of {', '.join(DTYPE_BYTES)}, got {value!r}")
    return value


def _field(cfg: Any, *names: str) -> Any:
    """A TransformerConfig field under either of its names (``num_layers`` or the older ``n_layers``)."""
    for n in names:
        if hasattr(cfg, n):
            return getattr(cfg, n)
    raise TypeError(f"model: a TransformerConfig without {' or '.join(names)}")


def from_transformer_config(cfg: Any) -> Architecture:
    """From attnlab's own :class:`~attnlab.transformer.TransformerConfig` (it computes in float32)."""
    layers = _field(cfg, "num_layers", "n_layers")
    window = getattr(cfg, "layer_window", None)  # a config with sliding windows says each layer's
    windows = tuple(window(i) for i in range(layers)) if callable(window) else (None,) * layers
    return Architecture(
        f"attnlab transformer ({getattr(cfg, 'family', 'custom')})", layers, _field(cfg, "num_heads", "n_heads"),
        cfg.heads_kv, cfg.head_dim, cfg.d_model, cfg.hidden_ff, cfg.vocab_size, cfg.max_positions, windows,
        gated=cfg.ffn in ("gated", "experts"), tied=cfg.tie_embeddings, learned_positions=cfg.positions == "learned",
        qkv_bias=cfg.bias, dtype="float32", source="attnlab TransformerConfig", **transformer_fields(cfg))


def bundled_key(name: str) -> str | None:
    key = name.strip().lower()
    for k, b in BUNDLED.items():
        if key == k or key in b.aliases:
            return k
    return None


def load_model(model: Any) -> Architecture:
    """``model``: a config.json path (file or folder), a bundled name, ``"attnlab:decoder"`` or
    ``"attnlab:decoder-long"`` (the decoders that ship with attnlab), an Architecture or a TransformerConfig."""
    if isinstance(model, Architecture):
        return model
    if hasattr(model, "d_model") and hasattr(model, "heads_kv"):
        return from_transformer_config(model)
    if isinstance(model, dict):
        return from_config(model)
    if not isinstance(model, (str, Path)) or not str(model).strip():
        raise TypeError(f"model must be a config.json path, a bundled name or a TransformerConfig, got {model!r}")
    from attnlab.locate.folder import BUNDLED_DECODERS, decoder_folder

    # the decoders that ship with attnlab
    path = decoder_folder(model) if model in BUNDLED_DECODERS else Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"model {str(model)!r}: cannot read {path} as JSON ({e})") from None
        if not isinstance(config, dict):
            raise ValueError(f"model {str(model)!r}: {path} holds no JSON object")
        # a model folder's config.json is named by its folder; any other JSON file by its own name
        name = (path.parent.name if path.name == "config.json" else path.stem) or str(path)
        return from_config(config, name=name, source=str(path))
    key = bundled_key(str(model))
    if key is None:
        raise ValueError(f"model {str(model)!r} is neither a config.json (file or folder) nor a bundled model; "
                         f"bundled: {', '.join(BUNDLED)}")
    b = BUNDLED[key]
    return from_config(b.config, name=key, source=f"{b.source} ({b.version})")
