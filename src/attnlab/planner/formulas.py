"""The counts the planner's time and memory rest on: parameters, FLOPs, bytes. Pure arithmetic.

A multiply-add is 2 FLOPs. n is the number of tokens in a pass, t the tokens already in the cache,
B the batch; w_l is layer l's window (None: the whole context). Each function states its formula.
"""

from __future__ import annotations

from attnlab.planner.models import Architecture


def layer_matmul_params(a: Architecture) -> dict[str, int]:
    """Weights of one layer's matmuls, by matrix (each a (d_in, d_out) matrix that every token multiplies)."""
    d, q, kv = a.hidden_size, a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    ffn = {"gate": d * a.intermediate_size} if a.gated else {}
    return {"q": d * q, "k": d * kv, "v": d * kv, "o": q * d, **ffn, "up": d * a.intermediate_size,
            "down": a.intermediate_size * d}


def matmul_shapes(a: Architecture) -> list[tuple[int, int, int]]:
    """The distinct (d_in, d_out, how many per layer) of one layer's matmuls: what calibration times."""
    d, q, kv, ff = a.hidden_size, a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.intermediate_size
    shapes: dict[tuple[int, int], int] = {}
    for d_in, d_out in ((d, q), (d, kv), (d, kv), (q, d), *([(d, ff)] * (2 if a.gated else 1)), (ff, d)):
        shapes[(d_in, d_out)] = shapes.get((d_in, d_out), 0) + 1
    return [(i, o, m) for (i, o), m in shapes.items()]


def weight_params(a: Architecture) -> dict[str, int]:
    """Every parameter, by part: the layers' matmuls, their norms and biases, embeddings, the LM head."""
    d = a.hidden_size
    layer = sum(layer_matmul_params(a).values())
    small = 2 * d + ((a.num_heads + 2 * a.num_kv_heads) * a.head_dim if a.qkv_bias else 0)  # two norms, q/k/v biases
    return {
        "layers": a.num_layers * layer,
        "norms_and_biases": a.num_layers * small + d,
        "embedding": a.vocab_size * d + (a.max_positions * d if a.learned_positions else 0),
        "lm_head": 0 if a.tied else a.vocab_size * d,
    }


def weight_bytes(a: Architecture, nbytes: int) -> int:
    return sum(weight_params(a).values()) * nbytes


def decode_weight_bytes(a: Architecture, nbytes: int) -> int:
    """Bytes of weights one decode step reads: every layer's matrices and the LM head (the embedding
    matrix when tied); of the embedding only one row per token, which is left out."""
    p = weight_params(a)
    return (p["layers"] + p["norms_and_biases"] + a.vocab_size * a.hidden_size) * nbytes


def kv_layer_bytes(a: Architecture, tokens: int, batch: int, nbytes: int, window: int | None = None, *,
                   per_token: float | None = None, fixed: float = 0, budget: int | None = None) -> float:
    """One layer's k and v: H_kv · B · (min(T, w, budget) · per_token + fixed). ``per_token`` (bytes per token and
    k/v head, keys and values) is 2 · D · bytes unless a cache format says otherwise; ``fixed`` (bytes per
    sequence and k/v head whatever T: a quantized cache's residual or scales) 0; ``budget`` (an evicting cache's
    tokens) none (:mod:`attnlab.planner.cache_format`)."""
    per = 2 * a.head_dim * nbytes if per_token is None else per_token
    kept = min(x for x in (tokens, window, budget) if x is not None)
    return a.num_kv_heads * batch * (kept * per + fixed)


def kv_bytes(a: Architecture, tokens: int, batch: int, nbytes: int, **cache: float | None) -> float:
    """Σ_l 2 · H_kv · D · B · min(T, w_l) · bytes: the k and v of every layer, a window's layer keeping its last w
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
    """4 · B · H · D · pairs per layer: q·k and the weights times v, 2 FLOPs each per pair and dimension,
    over the causal pairs of each layer's window (causality halves the n² of full attention)."""
    return sum(4 * batch * a.num_heads * a.head_dim * causal_pairs(n, w, past) for w in a.windows)


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
