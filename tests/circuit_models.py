"""Tiny random float64 models of the three pre-norm styles the circuit tools are proven on, built from
attnlab's config (nothing loaded): GPT-2 (LayerNorm, learned positions, biases, tied unembedding),
Llama (RMSNorm, rotary, grouped-query attention: 4 query heads on 2 k/v heads, SwiGLU, an LM head) and
Gemma-2 (Llama's parts with (1 + w) norms, the post-attention and post-MLP norms, √d embeddings,
softcapped scores and logits, alternating sliding and global layers)."""

from __future__ import annotations

V = 50
STYLES = ("gpt2", "llama", "gemma2")


def config(style: str, layers: int = 3):
    from attnlab.transformer import TransformerConfig

    base = {"vocab_size": V, "d_model": 32, "num_layers": layers, "num_heads": 4, "max_positions": 32, "family": style}
    if style == "gpt2":
        return TransformerConfig(**base)
    llama = dict(base, num_kv_heads=2, positions="rotary", norm="rmsnorm", ffn="gated", activation="silu", bias=False,
                 ffn_bias=False, tie_embeddings=False)
    if style == "llama":
        return TransformerConfig(**llama)
    kinds = tuple("sliding_attention" if l % 2 == 0 else "full_attention" for l in range(layers))
    return TransformerConfig(**dict(llama, tie_embeddings=True, d_head=8, activation="gelu_new", norm_plus_one=True,
                                    sandwich_norm=True, embed_scale=True, attn_softcap=5.0, final_softcap=3.0,
                                    sliding_window=4, layer_types=kinds, attn_scale=8 ** -0.5))


def model(style: str, layers: int = 3, seed: int = 0):
    """A random model of ``style`` in float64, its weights drawn wide (std 0.3) so that heads matter."""
    import torch

    from attnlab.transformer import Transformer

    torch.manual_seed(seed)
    m = Transformer(config(style, layers), dtype="float64").eval().requires_grad_(False)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return m


def pair(batch: int = 2, t: int = 9, seed: int = 0):
    """Random clean and corrupted ids (batch, t): the corrupted ones differ at every other position."""
    import torch

    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, V, (batch, t), generator=g)
    corrupted = clean.clone()
    corrupted[:, ::2] = torch.randint(0, V, (batch, (t + 1) // 2), generator=g)
    return clean, corrupted


def logit_diff(logits):
    """The metric of the tests: logit of token 3 minus token 7 at the last position, one per sequence."""
    return logits[:, -1, 3] - logits[:, -1, 7]


def ids_of(decoder, text: str):
    """A text's token ids as the decoder's tokenizer gives them, (1, T)."""
    import torch

    return torch.tensor([decoder.tokenizer(text)["input_ids"]])


def one_id(decoder, text: str) -> int:
    """The id of a text that is one token (unpacking fails otherwise)."""
    (i,) = decoder.tokenizer(text, add_special_tokens=False)["input_ids"]
    return i


def gpt2_by_hand(m, ids, swap=None):
    """GPT-2's forward written out from its weights (no hook point, no attnlab.attention): logits (B, T, V) in
    the model's dtype. ``swap`` = (layer, head, z (B, T, Dh), positions) puts z in that head's output at those
    positions before the output projection. The one hand-written reference of the hook and patching tests."""
    import torch
    import torch.nn.functional as F

    c = m.config
    B, T = ids.shape
    H, Dh, d = c.num_heads, c.head_dim, c.d_model
    act = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}[c.activation]
    ln = lambda x, n: F.layer_norm(x, (d,), n.weight, n.bias, c.norm_eps)  # noqa: E731
    x = m.tok_emb.weight[ids] + m.pos_emb.weight[:T]  # (B, T, d)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for layer, blk in enumerate(m.blocks):
        a = blk.attn
        h = ln(x, blk.norm1)
        q, k, v = ((h @ p.weight.T + p.bias).view(B, T, H, Dh).transpose(1, 2) for p in (a.q, a.k, a.v))  # (B, H, T, Dh)
        w = torch.softmax((q @ k.transpose(-1, -2) / Dh ** 0.5).masked_fill(~causal, -torch.inf), -1)  # (B, H, T, T)
        z = w @ v  # (B, H, T, Dh)
        if swap is not None and swap[0] == layer:
            z = z.clone()
            z[:, swap[1], swap[3]] = swap[2][:, swap[3]]
        x = x + z.transpose(1, 2).reshape(B, T, H * Dh) @ a.o.weight.T + a.o.bias
        x = x + act(ln(x, blk.norm2) @ blk.ffn.up.weight.T + blk.ffn.up.bias) @ blk.ffn.down.weight.T + blk.ffn.down.bias
    return ln(x, m.final_norm) @ m.tok_emb.weight.T
