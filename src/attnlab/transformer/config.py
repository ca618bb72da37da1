"""What a transformer is made of: one frozen dataclass, built by hand or from a transformers config.

:meth:`TransformerConfig.from_hf` reads a transformers config (the object, or ``config.json`` as a
dict) of the four families attnlab's transformer builds: BERT and RoBERTa (encoders, post-norm,
learned absolute positions), GPT-2 (causal decoder, pre-norm, learned positions) and Llama (causal
decoder, pre-RMSNorm, rotary positions, grouped-query attention, SwiGLU). Any other family, or an
option of these that changes the math (a rope scaling, a relative position type), is refused by
name rather than silently computed differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POSITIONS = ("learned", "rotary", "none")
NORMS = ("layernorm", "rmsnorm")
FFNS = ("mlp", "gated", "none")  # up → act → down; SwiGLU-style act(gate)·up → down; attention only
ACTIVATIONS = ("gelu", "gelu_new", "relu", "silu")
FAMILIES = ("bert", "roberta", "gpt2", "llama")


@dataclass(frozen=True)
class TransformerConfig:
    """The shape and kind of a transformer.

    d_head defaults to d_model // num_heads, num_kv_heads to num_heads (fewer: grouped-query attention),
    d_ff to 4·d_model. ``post_norm`` puts the norm after each residual sum (BERT), else before each
    sublayer with a final norm (GPT-2, Llama). ``position_offset``: RoBERTa numbers real tokens from
    pad_token_id + 1. ``type_vocab_size``: BERT's segment embeddings (segment 0 is added).
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int | None = None
    d_head: int | None = None
    d_ff: int | None = None
    max_positions: int = 512
    positions: str = "learned"
    rope_theta: float = 10000.0
    type_vocab_size: int = 0
    position_offset: int = 0
    pad_token_id: int | None = None
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    post_norm: bool = False
    embed_norm: bool = False
    ffn: str = "mlp"
    activation: str = "gelu"
    bias: bool = True
    ffn_bias: bool = True
    causal: bool = True
    tie_embeddings: bool = True
    family: str = "custom"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name, allowed in (("positions", POSITIONS), ("norm", NORMS), ("ffn", FFNS), ("activation", ACTIVATIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.d_head is None and self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not a multiple of num_heads={self.num_heads}; give d_head")
        if self.heads_kv < 1 or self.num_heads % self.heads_kv:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.positions == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even d_head, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.num_heads

    @property
    def heads_kv(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def hidden_ff(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @classmethod
    def from_hf(cls, config: Any) -> TransformerConfig:
        """From a transformers config object or its ``config.json`` dict (BERT, RoBERTa, GPT-2, Llama)."""
        c = config if isinstance(config, dict) else config.to_dict()
        family = c.get("model_type")
        if family not in FAMILIES:
            raise ValueError(f"model_type must be one of {', '.join(FAMILIES)} for attnlab's transformer, got {family!r}")
        return {"bert": _bert, "roberta": _bert, "gpt2": _gpt2, "llama": _llama}[family](c)


def _bert(c: dict) -> TransformerConfig:
    kind = c.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"position_embedding_type must be 'absolute', got {kind!r}")
    act = c.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ValueError(f"hidden_act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    roberta = c["model_type"] == "roberta"
    pad = c.get("pad_token_id", 1 if roberta else 0)
    return TransformerConfig(
        vocab_size=c["vocab_size"], d_model=c["hidden_size"], num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"], d_ff=c["intermediate_size"], max_positions=c["max_position_embeddings"],
        positions="learned", type_vocab_size=c.get("type_vocab_size", 2), position_offset=pad + 1 if roberta else 0,
        pad_token_id=pad, norm="layernorm", norm_eps=c.get("layer_norm_eps", 1e-12), post_norm=True, embed_norm=True,
        ffn="mlp", activation=act, causal=False, family=c["model_type"],
    )


def _gpt2(c: dict) -> TransformerConfig:
    act = c.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise ValueError(f"activation_function must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    for name in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if c.get(name):
            raise ValueError(f"{name}=True is not supported by attnlab's transformer")
    if not c.get("scale_attn_weights", True):
        raise ValueError("scale_attn_weights=False is not supported by attnlab's transformer")
    d = c["n_embd"]
    return TransformerConfig(
        vocab_size=c["vocab_size"], d_model=d, num_layers=c["n_layer"], num_heads=c["n_head"], d_ff=c.get("n_inner") or 4 * d,
        max_positions=c["n_positions"], positions="learned", norm="layernorm", norm_eps=c.get("layer_norm_epsilon", 1e-5),
        ffn="mlp", activation=act, causal=True, tie_embeddings=c.get("tie_word_embeddings", True), family="gpt2",
    )


def _llama(c: dict) -> TransformerConfig:
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope type must be 'default' (plain rotary positions), got {rope_type!r}")
    if c.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act must be 'silu' (SwiGLU), got {c.get('hidden_act')!r}")
    return TransformerConfig(
        vocab_size=c["vocab_size"], d_model=c["hidden_size"], num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"], num_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
        d_head=c.get("head_dim"), d_ff=c["intermediate_size"], max_positions=c.get("max_position_embeddings", 2048),
        positions="rotary", rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))), norm="rmsnorm",
        norm_eps=c.get("rms_norm_eps", 1e-6), ffn="gated", activation="silu", bias=c.get("attention_bias", False),
        ffn_bias=c.get("mlp_bias", False), causal=True, tie_embeddings=c.get("tie_word_embeddings", False),
        family="llama",
    )
