"""Section 4 of the lesson: several heads cost about what one head of d_model costs.

The multiply-adds of one attention layer are counted from the shapes of a real
:class:`MultiHeadAttention` (its W^Q, W^K, W^V, W^O and its heads), not from a formula typed in
separately, for h = 1 and h = 8 at d_model = 512 (Vaswani et al.'s base model) and for BERT base
(12 layers of 12 heads of 64). The default model's own layers × heads come from its config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attnlab.reference.multihead import MultiHeadAttention
from attnlab.lesson.fmt import big, compact
from attnlab.lesson.section import Section, table

N_TOKENS = 128  # the sequence length the counts are made for; every term scales with it as shown

SEED_HEADS = {
    "transformer_base": {"h": 8, "d_model": 512, "d_k": 64},
    "bert_base": {"layers": 12, "heads": 12, "hidden": 768, "d_head": 64, "total_heads": 144},
}


@dataclass(frozen=True)
class LayerCost:
    """Multiply-adds (and softmax exponentials) of one attention layer over n tokens."""

    heads: int
    d_model: int
    d_head: int
    n: int
    projections: int  # Q, K, V = X W: 3 · n · d_model · H·d_head
    scores: int  # Q Kᵀ per head: H · n · n · d_head
    weighted_sum: int  # α V per head: H · n · n · d_v
    output: int  # Concat(heads) W^O: n · H·d_v · d_model
    exponentials: int  # softmax: H · n · n

    @property
    def total(self) -> int:
        return self.projections + self.scores + self.weighted_sum + self.output

    def to_dict(self) -> dict:
        return dict(asdict(self), total=self.total)


def layer_cost(layer: MultiHeadAttention, n: int) -> LayerCost:
    """Count the multiply-adds of self-attention over ``n`` tokens from the layer's own shapes."""
    h = layer.num_heads
    return LayerCost(
        heads=h,
        d_model=layer.d_model,
        d_head=layer.d_head,
        n=n,
        projections=n * (layer.w_q.size + layer.w_k.size + layer.w_v.size),
        scores=h * n * n * layer.d_head,
        weighted_sum=h * n * n * layer.d_v,
        output=n * layer.w_o.size,
        exponentials=h * n * n,
    )


def heads_section(model: dict, n: int = N_TOKENS) -> Section:
    """``model``: ``{"model_id", "num_layers", "num_heads", "hidden_size"}`` read from the model's config."""
    one = layer_cost(MultiHeadAttention(512, 1), n)
    eight = layer_cost(MultiHeadAttention(512, 8), n)
    bert = layer_cost(MultiHeadAttention(768, 12), n)
    own = layer_cost(MultiHeadAttention(model["hidden_size"], model["num_heads"]), n)
    layers, heads = model["num_layers"], model["num_heads"]
    short = model["model_id"].rsplit("/", 1)[-1]  # the name without its hub owner: tables fit 80 columns
    # Labels read at 80 columns: heads × d_head; the model's name is in the title.
    rows = [
        ("1×512", one, 1),
        ("8×64", eight, 1),
        ("BERT 12×64", bert, 12),
        (f"model {heads}×{own.d_head}", own, layers),
    ]
    ratio = eight.total / one.total
    b = SEED_HEADS["bert_base"]
    findings = (
        f"At d_model = 512 and n = {n} tokens, one head of 512 costs {big(one.total)} multiply-adds per layer and "
        f"eight heads of 64 cost {big(eight.total)} (ratio {ratio:.2f}): splitting d_model into heads moves no "
        f"arithmetic; only the softmax exponentials grow, {big(one.exponentials)} → {big(eight.exponentials)}.",
        f"BERT base: 12 layers × 12 heads = 144 heads of 768 / 12 = 64; {big(12 * bert.total)} multiply-adds "
        f"for its 12 attention layers at n = {n}.",
        f"The default model here, {model['model_id']}: {layers} layers × {heads} heads = {layers * heads} heads of "
        f"{model['hidden_size']} / {heads} = {own.d_head} (read from its config).",
    )
    tables = (
        table(
            f"Multiply-adds of one attention layer at n = {n} tokens, by heads × d_head (model: {short}, "
            f"BERT: BERT base)",
            ["heads×d", "Q, K, V", "QKᵀ", "αV", "W^O", "per layer", "all layers", "softmax exps"],
            [
                [name, compact(c.projections), compact(c.scores), compact(c.weighted_sum), compact(c.output),
                 compact(c.total), compact(c.total * mult), compact(c.exponentials)]
                for name, c, mult in rows
            ],
        ),
        table(
            "Layers × heads",
            ["model", "layers", "heads per layer", "heads", "d_model", "d_head"],
            [
                ["BERT base (the lesson's)", b["layers"], b["heads"], b["total_heads"], b["hidden"], b["d_head"]],
                [short, layers, heads, layers * heads, model["hidden_size"], own.d_head],
            ],
        ),
    )
    data = {
        "n": n,
        "one_head_512": one.to_dict(),
        "eight_heads_512": eight.to_dict(),
        "ratio_8_to_1": ratio,
        "bert_base": dict(bert.to_dict(), layers=12, all_layers=12 * bert.total),
        "model": dict(model, total_heads=layers * heads, d_head=own.d_head, cost=own.to_dict()),
    }
    return Section("heads", 4, "Several heads", findings, tables, data, SEED_HEADS)
