"""What a transformer is made of: one frozen dataclass, built by hand or from a transformers config.

:meth:`TransformerConfig.from_hf` reads a transformers config (the object, or ``config.json`` as a
dict) of the families attnlab's transformer builds: BERT and RoBERTa (encoders, post-norm, learned
absolute positions), GPT-2 (causal decoder, pre-norm, learned positions), Llama (causal decoder,
pre-RMSNorm, rotary positions with Llama-3's "llama3" or "linear" scaling, grouped-query attention,
SwiGLU), Mistral (Llama with a sliding window on every layer), Qwen2 (biases on q, k and v; a
sliding window on the layers ``layer_types`` names when ``use_sliding_window``) and Gemma-2
(alternating sliding and global layers, softcapped attention scores and final logits, scores scaled
by ``query_pre_attn_scalar``, GeGLU, four (1 + w) RMSNorms per block, embeddings scaled by √d), and
the decoders of 2025: Qwen3 (QK-norm: each head's queries and keys RMS-normed before rotary),
Gemma-3 text (Gemma-2's block with QK-norm, ``layer_types`` of local and global layers, each kind
with its rotary base: ``rope_parameters`` per layer type, or ``rope_local_base_freq`` in older
configs) and gpt-oss (learned attention sinks, alternating window and full layers, YaRN rotary
scaling, routed experts with a clamped SwiGLU). Any other family, or an option of these that changes
the math (another rope type, a layer type such as a hybrid's linear attention, a relative position
type), is refused naming the key and its value rather than silently computed differently.

**Sliding windows** keep transformers' meaning: ``sliding_window = W`` lets a token see itself and
the W − 1 tokens before it (transformers' mask keeps key j for query i when i − W < j ≤ i). In
:func:`attnlab.attention` terms that is ``causal=True, mask=masks.sliding_window(W)`` (``window(W − 1, 0)``;
:meth:`TransformerConfig.attention_window`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnlab.transformer.config_rope import ROPE_TYPES, _rope
from attnlab.transformer.shapes import Latent, Routing, check_parts

POSITIONS = ("learned", "rotary", "none")
NORMS = ("layernorm", "rmsnorm")
# up → act → down; SwiGLU-style act(gate)·up → down; gpt-oss's routed experts (clamped SwiGLU); attention only
FFNS = ("mlp", "gated", "experts", "none")
ACTIVATIONS = ("gelu", "gelu_new", "relu", "silu")  # gelu_new: the tanh approximation (transformers' gelu_pytorch_tanh)
FAMILIES = ("bert", "roberta", "gpt2", "llama", "mistral", "qwen2", "gemma2", "qwen3", "gemma3_text", "gpt_oss",
            "deepseek_v3", "qwen3_moe")
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' names
# transformers' rotary scaling of a gpt-oss config that names none (GptOssConfig's default)
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


@dataclass(frozen=True)
class TransformerConfig:
    """The shape and kind of a transformer.

    d_head defaults to d_model // num_heads, num_kv_heads to num_heads (fewer: grouped-query attention),
    d_ff to 4·d_model. ``post_norm`` puts the norm after each residual sum (BERT), else before each
    sublayer with a final norm (GPT-2, Llama). ``position_offset``: RoBERTa numbers real tokens from
    pad_token_id + 1. ``type_vocab_size``: BERT's segment embeddings (segment 0 is added).

    Decoders of today: ``sliding_window`` W (transformers' meaning, see the module) on the layers
    whose ``layer_types`` entry is "sliding_attention" (every layer when ``layer_types`` is None);
    ``rope_type`` "linear" divides the rotary frequencies by ``rope_factor``, "llama3" rescales the
    low ones (``rope_low_freq``, ``rope_high_freq``, ``rope_original_positions``); ``out_bias`` is
    the output projection's bias when it differs from q, k and v's (Qwen2: None = ``bias``);
    ``attn_scale`` replaces 1/√d_head (Gemma-2: query_pre_attn_scalar^−½); ``attn_softcap`` and
    ``final_softcap`` squash the attention scores and the final logits by c·tanh(x / c);
    ``norm_plus_one`` scales RMSNorm by (1 + w); ``sandwich_norm`` adds a norm after attention and
    after the FFN, before each residual sum (Gemma-2's four norms); ``embed_scale`` multiplies the
    token embeddings by √d_model.

    Decoders of 2025: ``qk_norm`` normalises each head's queries and keys (an RMSNorm over Dh, its own
    weights, (1 + w) where ``norm_plus_one``) before rotary (Qwen3, Gemma-3); ``rope_local_theta`` is
    the rotary base of the sliding layers, which then turn by plain rotary (Gemma-3's local base; the
    full layers keep ``rope_theta`` and the scaling); ``rope_type`` "yarn" (gpt-oss) blends scaled and
    unscaled frequencies between ``rope_beta_fast`` and ``rope_beta_slow`` rotations
    (``rope_truncate`` rounds the range out) and multiplies cos and sin by ``rope_attention_factor``;
    ``attn_sinks`` gives every query head a learned sink logit (``attnlab.attention(sink_logits=)``);
    ``ffn`` "experts" routes each token to ``experts_per_token`` of ``num_experts`` clamped-SwiGLU experts
    (gpt-oss: ``swiglu_limit``, ``swiglu_alpha``), or, with ``routing`` (:class:`Routing`), to SwiGLU
    experts picked as DeepSeek-V3 and Qwen3-MoE do; ``latent`` (:class:`Latent`): multi-head latent
    attention (DeepSeek-V3's MLA; ``d_head`` is then a head's query and key width, nope + rope).
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
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq: float = 1.0
    rope_high_freq: float = 4.0
    rope_original_positions: int | None = None
    out_bias: bool | None = None
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    norm_plus_one: bool = False
    sandwich_norm: bool = False
    embed_scale: bool = False
    qk_norm: bool = False
    rope_local_theta: float | None = None
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True
    rope_attention_factor: float = 1.0
    attn_sinks: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    latent: Latent | None = None
    routing: Routing | None = None

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
        self._check_decoder_fields()
        self._check_experts()

    def _check_decoder_fields(self) -> None:
        w = self.sliding_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"sliding_window must be an int >= 1 (keys a token sees, itself included) or None, got {w!r}")
        if self.layer_types is not None:
            if not isinstance(self.layer_types, tuple) or len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types must be a tuple of {self.num_layers} entries (one per layer), "
                                 f"got {self.layer_types!r}")
            bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if bad:
                raise ValueError(f"layer_types entries must be one of {', '.join(LAYER_TYPES)}, got {', '.join(bad)}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {', '.join(ROPE_TYPES)}, got {self.rope_type!r}")
        if self.rope_type in ("llama3", "yarn") and not self.rope_original_positions:
            raise ValueError(f"rope_type {self.rope_type!r} needs rope_original_positions (the pre-scaling context length)")
        if not self.rope_factor > 0:
            raise ValueError(f"rope_factor must be > 0, got {self.rope_factor!r}")
        for name in ("attn_scale", "attn_softcap", "final_softcap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or None, got {value!r}")
        if self.norm_plus_one and self.norm != "rmsnorm":
            raise ValueError("norm_plus_one scales an RMSNorm by (1 + w); it needs norm='rmsnorm'")
        if self.sandwich_norm and self.post_norm:
            raise ValueError("sandwich_norm adds norms to a pre-norm block; it cannot go with post_norm=True")

    def _check_experts(self) -> None:
        if (self.ffn == "experts") != (self.num_experts > 0):
            raise ValueError(f"ffn='experts' goes with num_experts >= 1 (and only it), got ffn={self.ffn!r}, "
                             f"num_experts={self.num_experts!r}")
        if self.ffn == "experts" and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts_per_token must be in 1..num_experts={self.num_experts}, "
                             f"got {self.experts_per_token!r}")
        check_parts(self)

    def routed(self, layer: int) -> bool:
        """Layer ``layer``'s FFN is routed experts (not one of the routing's dense layers)."""
        return self.ffn == "experts" and (self.routing is None or layer not in self.routing.dense_layers)

    def layer_window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window W (keys a token sees, itself included), or None (every key before it)."""
        if self.sliding_window is None:
            return None
        if self.layer_types is not None and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    def local_rope(self, layer: int) -> bool:
        """Layer ``layer`` turns by the local rotary base (Gemma-3's sliding layers), not the global one."""
        return self.rope_local_theta is not None and self.layer_window(layer) is not None

    def attention_window(self, layer: int) -> Any:
        """Layer ``layer``'s window as attnlab.masks says it (``masks.sliding_window(W)``, with causal), or None."""
        from attnlab import masks

        w = self.layer_window(layer)
        return None if w is None else masks.sliding_window(w)

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.num_heads

    @property
    def value_dim(self) -> int:
        """A head's value (and ``hook_z``) width: head_dim, or latent attention's v_dim."""
        return self.head_dim if self.latent is None else self.latent.v_dim

    @property
    def rotary_dim(self) -> int:
        """The dims rotary turns: a head's (latent attention: its rotary part only)."""
        return self.head_dim if self.latent is None else self.latent.rope_dim

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
        if family in ("deepseek_v3", "qwen3_moe"):  # rotary decoders with their own fields, read there
            from attnlab.transformer import config_moe

            c, fields = getattr(config_moe, family)(c)
            return _rotary_decoder(c, **fields)
        if family not in FAMILIES:
            raise ValueError(f"model_type must be one of {', '.join(FAMILIES)} for attnlab's transformer, got {family!r}")
        return {"bert": _bert, "roberta": _bert, "gpt2": _gpt2, "llama": _llama, "mistral": _mistral,
                "qwen2": _qwen2, "gemma2": _gemma2, "qwen3": _qwen3, "gemma3_text": _gemma3,
                "gpt_oss": _gpt_oss}[family](c)


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


def _rotary_decoder(c: dict, act_key: str = "hidden_act", act: str = "silu", **fields: Any) -> TransformerConfig:
    """Llama and its descendants: pre-RMSNorm, rotary positions, grouped-query attention, a gated FFN."""
    if c.get(act_key, act) != act:
        raise ValueError(f"{act_key} must be {act!r}, got {c.get(act_key)!r}")
    rope = _rope(c)
    kw = dict(
        vocab_size=c["vocab_size"], d_model=c["hidden_size"], num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"], num_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
        d_head=c.get("head_dim"), d_ff=c["intermediate_size"], max_positions=c.get("max_position_embeddings", 2048),
        positions="rotary", norm="rmsnorm", norm_eps=c.get("rms_norm_eps", 1e-6), ffn="gated", activation="silu",
        bias=bool(c.get("attention_bias", False)), ffn_bias=bool(c.get("mlp_bias", False)), causal=True,
        tie_embeddings=c.get("tie_word_embeddings", False), pad_token_id=c.get("pad_token_id"), family=c["model_type"],
        **rope,
    )
    return TransformerConfig(**(kw | fields))


def _llama(c: dict) -> TransformerConfig:
    return _rotary_decoder(c)


def _mistral(c: dict) -> TransformerConfig:
    return _rotary_decoder(c, sliding_window=c.get("sliding_window"))


def _layer_types(c: dict, default: list[str]) -> tuple[str, ...]:
    """``layer_types`` (or the family's default), refused by its first entry attnlab does not compute
    (a hybrid's linear attention, say), never run as another kind."""
    types = tuple(c.get("layer_types") or default)
    for i, kind in enumerate(types):
        if kind not in LAYER_TYPES:
            raise ValueError(f"layer_types[{i}] must be one of {', '.join(LAYER_TYPES)} (the layer kinds attnlab's "
                             f"transformer computes), got {kind!r}")
    return types


def _qwen2(c: dict) -> TransformerConfig:
    n = c["num_hidden_layers"]
    window = c.get("sliding_window") if c.get("use_sliding_window", False) else None
    start = c.get("max_window_layers", n)  # transformers: layers from max_window_layers on slide
    types = _layer_types(c, ["sliding_attention" if i >= start else "full_attention" for i in range(n)])
    return _rotary_decoder(c, bias=True, out_bias=False, sliding_window=window,
                           layer_types=types if window is not None else None)


def _gemma2(c: dict) -> TransformerConfig:
    if c.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=True is not supported by attnlab's transformer (a decoder)")
    n = c["num_hidden_layers"]
    types = _layer_types(c, ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)])
    return _rotary_decoder(
        c, act_key="hidden_activation", act="gelu_pytorch_tanh", activation="gelu_new",
        tie_embeddings=c.get("tie_word_embeddings", True), sliding_window=c.get("sliding_window"), layer_types=types,
        attn_scale=float(c.get("query_pre_attn_scalar", 256)) ** -0.5, attn_softcap=c.get("attn_logit_softcapping"),
        final_softcap=c.get("final_logit_softcapping"), norm_plus_one=True, sandwich_norm=True, embed_scale=True,
    )


def _qwen3(c: dict) -> TransformerConfig:
    """Qwen2 with QK-norm, no q/k/v bias unless ``attention_bias`` (the output's follows it)."""
    n = c["num_hidden_layers"]
    window = c.get("sliding_window") if c.get("use_sliding_window", False) else None
    start = c.get("max_window_layers", n)
    types = _layer_types(c, ["sliding_attention" if i >= start else "full_attention" for i in range(n)])
    return _rotary_decoder(c, qk_norm=True, sliding_window=window, layer_types=types if window is not None else None)


def _gemma3(c: dict) -> TransformerConfig:
    """Gemma-2's block with QK-norm, five local layers to a global one, and a rotary base per layer type."""
    if c.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=True is not supported by attnlab's transformer (a decoder)")
    n, every = c["num_hidden_layers"], c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6))
    types = _layer_types(c, ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)])
    full, local = _gemma3_rope(c)
    fields = dict(
        act_key="hidden_activation", act="gelu_pytorch_tanh", activation="gelu_new",
        tie_embeddings=c.get("tie_word_embeddings", True), sliding_window=c.get("sliding_window", 4096),
        layer_types=types, attn_scale=float(c.get("query_pre_attn_scalar", 256)) ** -0.5,
        attn_softcap=c.get("attn_logit_softcapping"), final_softcap=c.get("final_logit_softcapping"),
        norm_plus_one=True, sandwich_norm=True, embed_scale=True, qk_norm=True, rope_local_theta=local,
        pad_token_id=c.get("pad_token_id", 0),
    )
    return _rotary_decoder({k: v for k, v in c.items() if k not in ("rope_parameters", "rope_scaling")}, **full, **fields)


def _gemma3_rope(c: dict) -> tuple[dict, float]:
    """The global layers' rotary fields and the local layers' base: ``rope_parameters`` per layer type
    (transformers 5), or ``rope_theta`` + ``rope_scaling`` (global) and ``rope_local_base_freq`` (older configs)."""
    params, glob = c.get("rope_parameters") or {}, c.get("rope_theta", 1e6)  # transformers' default global base
    if "full_attention" in params or "sliding_attention" in params:
        full = _rope(c, {"rope_theta": glob} | dict(params.get("full_attention") or {}), "rope_parameters.full_attention")
        local = dict(params.get("sliding_attention") or {})
    else:
        full = _rope(c | {"rope_theta": glob})
        local = {"rope_theta": c.get("rope_local_base_freq", 10000.0)}
    kind = local.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"rope_parameters.sliding_attention.rope_type must be 'default' (plain rotary on the local "
                         f"layers), got {kind!r}")
    return full, float(local.get("rope_theta", 10000.0))


def _gpt_oss(c: dict) -> TransformerConfig:
    """Learned sinks, alternating window and full layers, YaRN and routed experts (clamped SwiGLU)."""
    n = c["num_hidden_layers"]
    types = _layer_types(c, ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)])
    if not (c.get("rope_parameters") or c.get("rope_scaling")):  # none named: transformers' default, YaRN
        c = c | {"rope_parameters": GPT_OSS_ROPE | {"rope_theta": c.get("rope_theta", 150000.0)}}
    return _rotary_decoder(
        c, bias=bool(c.get("attention_bias", True)), sliding_window=c.get("sliding_window", 128), layer_types=types,
        attn_sinks=True, ffn="experts", num_experts=c.get("num_local_experts", 128),
        experts_per_token=c.get("num_experts_per_tok", 4),
        swiglu_limit=float(c.get("swiglu_limit", 7.0)), swiglu_alpha=float(c.get("swiglu_alpha", 1.702)),
        norm_eps=c.get("rms_norm_eps", 1e-5),
    )
