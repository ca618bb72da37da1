"""Two parts of a transformer's config that only some families have, each one frozen record:
:class:`Latent`, multi-head latent attention's widths (DeepSeek-V3's MLA), and :class:`Routing`, how a
mixture of routed SwiGLU experts picks and weighs them (DeepSeek-V3, Qwen3-MoE). They sit on
:class:`~attnlab.transformer.config.TransformerConfig` as ``latent`` and ``routing`` (None: the family
has none). No torch here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCORES = ("softmax", "sigmoid")  # the router's score of every expert: Qwen3-MoE's softmax, DeepSeek-V3's sigmoid


def _positive(owner: str, **values: object) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{owner}.{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention (DeepSeek-V2/V3; transformers' names in brackets).

    Each token's keys and values come from one latent c of ``kv_rank`` [kv_lora_rank] (RMS-normed) and
    one rotary key of ``rope_dim`` [qk_rope_head_dim] shared by every head; head h's key is
    (W_UK,h c, k_rope) of ``nope_dim`` + ``rope_dim`` [qk_nope_head_dim], its value W_UV,h c of ``v_dim``
    [v_head_dim]. Queries go through a low-rank ``q_rank`` [q_lora_rank] with its RMSNorm, or one
    projection when None. ``interleave`` [rope_interleave]: the rotary dims are turned in adjacent pairs
    (x0, x1), (x2, x3), … rather than Llama's halves. What the cache keeps of a token: c and k_rope,
    ``kv_rank + rope_dim`` numbers per layer (:attr:`cached`), for every head at once.
    """

    kv_rank: int
    rope_dim: int
    nope_dim: int
    v_dim: int
    q_rank: int | None = None
    interleave: bool = True

    def __post_init__(self) -> None:
        _positive("latent", kv_rank=self.kv_rank, rope_dim=self.rope_dim, nope_dim=self.nope_dim, v_dim=self.v_dim)
        if self.q_rank is not None:
            _positive("latent", q_rank=self.q_rank)
        if self.rope_dim % 2:
            raise ValueError(f"latent.rope_dim must be even (rotary turns pairs of dims), got {self.rope_dim}")

    @property
    def qk_dim(self) -> int:
        """One head's query and key width: nope_dim + rope_dim."""
        return self.nope_dim + self.rope_dim

    @property
    def cached(self) -> int:
        """Numbers the cache keeps per token and layer: the latent and the rotary key."""
        return self.kv_rank + self.rope_dim


@dataclass(frozen=True)
class Routing:
    """A mixture of routed experts, each a SwiGLU down(silu(gate x) · up x) of width ``d_ff``
    [moe_intermediate_size], without biases (transformers' names in brackets).

    The router scores every expert (``score``: "softmax" of its logits, or "sigmoid" of each);
    the choice may add a per-expert ``score_bias`` [e_score_correction_bias, noaux_tc] and be limited to
    the ``top_groups`` [topk_group] best of ``groups`` [n_group] groups of experts (a group's score: the
    sum of its two best); the chosen experts weigh by their scores (without the bias), renormalised
    to add up to 1 when ``normalize`` [norm_topk_prob], times ``scale`` [routed_scaling_factor].
    ``shared_d_ff`` > 0: a shared SwiGLU of that width every token goes through too [n_shared_experts ·
    moe_intermediate_size]. ``dense_layers``: the layers whose FFN is one dense SwiGLU of the config's
    d_ff instead [DeepSeek's first_k_dense_replace; Qwen3-MoE's mlp_only_layers, decoder_sparse_step].
    """

    d_ff: int
    score: str = "softmax"
    normalize: bool = True
    scale: float = 1.0
    groups: int = 1
    top_groups: int = 1
    score_bias: bool = False
    shared_d_ff: int = 0
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _positive("routing", d_ff=self.d_ff, groups=self.groups, top_groups=self.top_groups)
        if self.score not in SCORES:
            raise ValueError(f"routing.score must be one of {', '.join(SCORES)}, got {self.score!r}")
        if self.top_groups > self.groups:
            raise ValueError(f"routing.top_groups must be at most groups={self.groups}, got {self.top_groups}")
        if not self.scale > 0:
            raise ValueError(f"routing.scale must be > 0, got {self.scale!r}")
        if isinstance(self.shared_d_ff, bool) or not isinstance(self.shared_d_ff, int) or self.shared_d_ff < 0:
            raise ValueError(f"routing.shared_d_ff must be an int >= 0 (0: no shared expert), got {self.shared_d_ff!r}")
        if not isinstance(self.dense_layers, tuple):
            raise ValueError(f"routing.dense_layers must be a tuple of layer indices, got {self.dense_layers!r}")


def check_parts(c: Any) -> None:
    """A TransformerConfig's ``routing`` and ``latent`` fit the rest of it: else a ValueError naming the fields."""
    r = c.routing
    if r is not None and (c.ffn != "experts" or c.num_experts % r.groups or not set(r.dense_layers) <= set(range(c.num_layers))):
        raise ValueError(f"routing goes with ffn='experts', num_experts (got {c.num_experts}) a multiple of "
                         f"routing.groups={r.groups} and dense_layers in 0..{c.num_layers - 1}, "
                         f"got ffn={c.ffn!r}, dense_layers={r.dense_layers}")
    if c.latent is not None and (c.head_dim != c.latent.qk_dim or c.positions != "rotary"):
        raise ValueError(f"latent attention needs rotary positions and d_head = nope_dim + rope_dim = "
                         f"{c.latent.qk_dim}, got positions={c.positions!r}, d_head={c.d_head!r}")
