"""The counts the planner's time and memory rest on: parameters, FLOPs, bytes. Pure arithmetic.

A multiply-add is 2 FLOPs. n is the number of tokens in a pass, t the tokens already in the cache,
B the batch; w_l is layer l's window (None: the whole context). Each function states its formula.
"""

from __future__ import annotations

from attnlab.planner.models import WEIGHT_FORMATS, Architecture


def attention_params(a: Architecture) -> dict[str, int]:
    """One layer's attention matrices, by matrix: q, k, v, o; latent attention's q (or q_a and q_b), kv_a
    (x → latent and rotary key), kv_b (latent → every head's key and value part) and o."""
    d, H = a.hidden_size, a.num_heads
    if not a.latent:
        q, kv = H * a.head_dim, a.num_kv_heads * a.head_dim
        return {"q": d * q, "k": d * kv, "v": d * kv, "o": q * d}
    nope = a.head_dim - a.rope_dim
    q = {"q_a": d * a.q_lora_rank, "q_b": a.q_lora_rank * H * a.head_dim} if a.q_lora_rank else {"q": d * H * a.head_dim}
    return {**q, "kv_a": d * (a.kv_lora_rank + a.rope_dim), "kv_b": a.kv_lora_rank * H * (nope + a.value_dim),
            "o": H * a.value_dim * d}


def _ffn(a: Architecture, width: int) -> dict[str, int]:
    d = a.hidden_size
    return {**({"gate": d * width} if a.gated else {}), "up": d * width, "down": width * d}


def layer_matmul_params(a: Architecture) -> dict[str, float]:
    """Weights of one layer's matmuls that every token multiplies, by matrix. A mixture of experts: its dense
    layers' FFN and its routed layers' (the router, ``experts_per_token`` experts, the shared one) averaged
    over the layers, so that L times the sum is a token's matmul weights through the model."""
    attn = attention_params(a)
    if not a.num_experts:
        return {**attn, **_ffn(a, a.intermediate_size)}
    share, dense = a.routed_layers / a.num_layers, a.dense_layers / a.num_layers
    out: dict[str, float] = {**attn, "router": share * a.hidden_size * a.num_experts}
    out.update({f"dense_{k}": dense * v for k, v in _ffn(a, a.intermediate_size).items()})
    out.update({f"experts_{k}": share * a.experts_per_token * v for k, v in _ffn(a, a.expert_size).items()})
    if a.shared_size:
        out.update({f"shared_{k}": share * v for k, v in _ffn(a, a.shared_size).items()})
    return out


def matmul_shapes(a: Architecture) -> list[tuple[int, int, int]]:
    """The distinct (d_in, d_out, how many per layer) of one layer's matmuls: what calibration times (a mixture:
    a routed layer's, its active experts and shared expert)."""
    d = a.hidden_size
    pairs = {"q": (d, None), "k": (d, None), "v": (d, None), "q_a": (d, a.q_lora_rank), "q_b": (a.q_lora_rank, None),
             "kv_a": (d, a.kv_lora_rank + a.rope_dim), "kv_b": (a.kv_lora_rank, None), "o": (None, d)}
    shapes: dict[tuple[int, int], int] = {}
    for name, count in attention_params(a).items():
        d_in, d_out = pairs[name]
        d_in, d_out = d_in or count // d_out, d_out or count // d_in
        shapes[(d_in, d_out)] = shapes.get((d_in, d_out), 0) + 1
    width, many = (a.intermediate_size, 1) if not a.num_experts else (a.expert_size, a.experts_per_token)
    ffn = [(width, many), *([(a.shared_size, 1)] if a.num_experts and a.shared_size else [])]
    for w, m in ffn:
        for d_in, d_out in ((d, w), *([(d, w)] if a.gated else []), (w, d)):
            shapes[(d_in, d_out)] = shapes.get((d_in, d_out), 0) + m
    return [(i, o, m) for (i, o), m in shapes.items()]


def weight_params(a: Architecture) -> dict[str, int]:
    """Every parameter, by part: the layers' matmuls (attention, dense FFNs, routers, shared experts), the
    routed experts, the norms and biases, embeddings, the LM head."""
    d, L = a.hidden_size, a.num_layers
    attn = sum(attention_params(a).values())
    ffn = sum(_ffn(a, a.intermediate_size).values())
    layers = L * attn + (a.dense_layers if a.num_experts else L) * ffn
    experts = a.routed_layers * a.num_experts * sum(_ffn(a, a.expert_size).values()) if a.num_experts else 0
    if a.num_experts:
        layers += a.routed_layers * (d * a.num_experts + (sum(_ffn(a, a.shared_size).values()) if a.shared_size else 0))
    small = 2 * d + ((a.num_heads + 2 * a.num_kv_heads) * a.head_dim if a.qkv_bias else 0)  # two norms, q/k/v biases
    small += a.kv_lora_rank + a.q_lora_rank  # MLA's two low-rank norms
    return {
        "layers": layers,
        "experts": experts,
        "norms_and_biases": L * small + d,
        "embedding": a.vocab_size * d + (a.max_positions * d if a.learned_positions else 0),
        "lm_head": 0 if a.tied else a.vocab_size * d,
    }


def _part_bytes(a: Architecture, nbytes: float) -> tuple[float, float]:
    """Bytes per weight of the layers' matmuls and of the routed experts, in their published formats."""
    linear = WEIGHT_FORMATS[a.linear_format] if a.linear_format else nbytes
    return linear, WEIGHT_FORMATS[a.expert_format] if a.expert_format else linear


def weight_bytes(a: Architecture, nbytes: int) -> float:
    """Every weight's bytes: the linear layers and experts in their published formats (MXFP4, FP8 blocks, with
    their scales), the rest (embeddings, norms, LM head) in ``nbytes``."""
    p, (linear, expert) = weight_params(a), _part_bytes(a, nbytes)
    return p["layers"] * linear + p["experts"] * expert + (p["norms_and_biases"] + p["embedding"] + p["lm_head"]) * nbytes


def distinct_experts(a: Architecture, batch: int) -> float:
    """The expected number of distinct experts a routed layer's decode step reads for ``batch`` tokens under
    uniform routing: E · (1 − (1 − k/E)^B) (k at batch 1, at most E)."""
    if not a.num_experts:
        return 0.0
    return a.num_experts * (1 - (1 - a.experts_per_token / a.num_experts) ** batch)


def decode_weight_bytes(a: Architecture, nbytes: int, batch: int = 1) -> float:
    """Bytes of weights one decode step reads: every layer's matrices, the experts its ``batch`` tokens chose
    (:func:`distinct_experts`) and the LM head (the embedding matrix when tied); of the embedding only one row
    per token, which is left out."""
    p, (linear, expert) = weight_params(a), _part_bytes(a, nbytes)
    read = distinct_experts(a, batch) * a.routed_layers * sum(_ffn(a, a.expert_size).values()) if a.num_experts else 0
    return p["layers"] * linear + read * expert + (p["norms_and_biases"] + a.vocab_size * a.hidden_size) * nbytes


def kv_elements(a: Architecture) -> int:
    """Numbers one layer caches per token: 2 · H_kv · D (keys and values), or latent attention's latent and
    rotary key, kv_lora_rank + rope_dim, for every head at once."""
    return a.kv_lora_rank + a.rope_dim if a.latent else 2 * a.num_kv_heads * a.head_dim


def kv_layer_bytes(a: Architecture, tokens: int, batch: int, nbytes: int, window: int | None = None, *,
                   per_token: float | None = None, fixed: float = 0, budget: int | None = None) -> float:
    """One layer's cache: heads · B · (min(T, w, budget) · per_token + fixed), heads being H_kv (a latent cache:
    one row for every head). ``per_token`` (bytes per token and k/v head) is :func:`kv_elements` / heads · bytes
    unless a cache format says otherwise; ``fixed`` (bytes per sequence and k/v head whatever T: a quantized
    cache's residual or scales) 0; ``budget`` (an evicting cache's tokens) none
    (:mod:`attnlab.planner.cache_format`)."""
    heads = 1 if a.latent else a.num_kv_heads
    per = kv_elements(a) // heads * nbytes if per_token is None else per_token
    kept = min(x for x in (tokens, window, budget) if x is not None)
    return heads * batch * (kept * per + fixed)


def kv_bytes(a: Architecture, tokens: int, batch: int, nbytes: int, **cache: float | None) -> float:
    """Σ_l kv_elements · B · min(T, w_l) · bytes: every layer's cache, a window's layer keeping its last w
    (``cache``: :func:`kv_layer_bytes`'s per_token, fixed and budget)."""
    return sum(kv_layer_bytes(a, tokens, batch, nbytes, w, **cache) for w in a.windows)


def causal_pairs(n: int, window: int | None, past: int = 0) -> int:
    """Query-key pairs of n new queries after ``past`` cached tokens, causal, each seeing at most ``window``
    keys (itself included): Σ_{i=past+1}^{past+n} min(i, w)."""
    def upto(m: int) -> int:  # Σ_{i=1}^{m} min(i, w)
        if window is None or m <= window:
            return m * (m + 1) // 2
        return window * (window + 1) // 2 + (m - window) * window
    return upto(past + n) - upto(past)


def prefill_matmul_flops(a: Architecture, n: int, batch: int) -> int:
    """2 · B · n · (the layers' matmul weights) + 2 · B · d · V for the LM head on the last token only."""
    return 2 * batch * n * a.num_layers * sum(layer_matmul_params(a).values()) + 2 * batch * a.hidden_size * a.vocab_size


def attention_flops(a: Architecture, n: int, batch: int, past: int = 0) -> int:
    """2 · B · H · (D + Dv) · pairs per layer: q·k and the weights times v, 2 FLOPs each per pair and dimension,
    over the causal pairs of each layer's window (causality halves the n² of full attention)."""
    return sum(2 * batch * a.num_heads * (a.head_dim + a.value_dim) * causal_pairs(n, w, past) for w in a.windows)


def decode_matmul_flops(a: Architecture, batch: int) -> int:
    """One new token per sequence: 2 · B · (layers' weights + the LM head)."""
    return 2 * batch * (a.num_layers * sum(layer_matmul_params(a).values()) + a.hidden_size * a.vocab_size)


def prefill_activation_bytes(a: Architecture, n: int, batch: int, nbytes: int) -> dict[str, int]:
    """The prefill's largest live activations, by sublayer, per sequence of n tokens:

    - attention: the residual x and its normed copy (2·d), q, k, v after rotary with their pre-rotary
      copies (2·(H + 2·H_kv)·D) and the heads' output (H·D), per token; the kernels never hold n × n;
    - feed-forward: x, its normed copy (2·d), the gate, up and act(gate)·up (3·ff, 2·ff ungated) per token;
    - logits of the last token (V per sequence).
    The peak is the larger sublayer plus the logits.
    """
    d, hd = a.hidden_size, a.head_dim
    attn = (2 * d + 2 * (a.num_heads + 2 * a.num_kv_heads) * hd + a.num_heads * hd) * n
    ffn = (2 * d + (3 if a.gated else 2) * a.intermediate_size) * n
    return {"attention": attn * batch * nbytes, "feed_forward": ffn * batch * nbytes,
            "logits": a.vocab_size * batch * 4}


def elementwise_bytes(a: Architecture, n: int, batch: int, nbytes: int) -> int:
    """Bytes one layer's elementwise work moves for n tokens, unfused (as eager PyTorch runs it), per token:

    - two norms (square, scale by the reciprocal RMS, by the weight): 6·d each;
    - rotary on q and k (x·cos, the rotated half and its negation, ·sin, the sum): 12 per element of q and k;
    - the heads' reshapes into contiguous copies (q, k, v and the output): 2 per element;
    - the activation and the gate (act(gate), act(gate)·up): 5·ff (2·ff ungated);
    - two residual sums: 3·d each.
    It is what the matmul and attention terms leave out; on this machine it is a tenth to a fifth of a
    small model's prefill.
    """
    d, hd = a.hidden_size, a.head_dim
    q, kv = a.num_heads * hd, a.num_kv_heads * hd
    rotary = 12 * (q + kv) if not a.learned_positions else 0
    per_token = 12 * d + rotary + 2 * (2 * q + 2 * kv) + (5 if a.gated else 2) * a.intermediate_size + 6 * d
    return per_token * n * batch * nbytes


def allreduce_bytes(a: Architecture, tokens: int, batch: int, nbytes: int) -> int:
    """Tensor parallelism: per layer two all-reduces (after attention, after the feed-forward) of B · n · d."""
    return 2 * a.num_layers * batch * tokens * a.hidden_size * nbytes
