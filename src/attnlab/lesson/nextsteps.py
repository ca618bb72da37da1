"""Section 7 of the lesson: what attention alone does not do, and the masks that come next.

Order blindness is shown and checked: without position information, shuffling the tokens shuffles
the outputs the same way, and each token spreads the same weights over the same tokens. Then the
causal mask (−∞ above the diagonal before the softmax) and hiding a token for masked-LM.
"""

from __future__ import annotations

import numpy as np

from attnlab.reference.masks import causal_mask, hide_mask
from attnlab.reference.multihead import MultiHeadAttention
from attnlab.lesson.fmt import pct
from attnlab.lesson.scene import TOKENS
from attnlab.lesson.section import Section, table

D_MODEL, HEADS = 8, 2
CAUSAL_TOKENS = TOKENS[:5]  # "I sat on the bank"
HIDDEN_WORD = "bank"
TOLERANCE = 1e-12


def _labels(tokens) -> list[str]:
    """Unique labels for repeated words ("the", "the#2"), so tables and heatmaps stay readable."""
    seen: dict[str, int] = {}
    out = []
    for t in tokens:
        seen[t] = seen.get(t, 0) + 1
        out.append(t if seen[t] == 1 else f"{t}#{seen[t]}")
    return out


def _weight_rows(w: np.ndarray, labels: list[str]) -> list[list[str]]:
    return [[lab] + [pct(x) if x > 0 else "·" for x in row] for lab, row in zip(labels, w)]


def next_section(seed: int = 0) -> Section:
    rng = np.random.default_rng(seed)
    tokens = _labels(TOKENS)
    n = len(tokens)
    x = rng.standard_normal((n, D_MODEL))  # (8, 8): token vectors with no position information
    layer = MultiHeadAttention(D_MODEL, HEADS, seed=seed)

    # 1. Order blindness: permute the tokens, run the same layer.
    perm = rng.permutation(n)
    base, shuffled = layer(x), layer(x[perm])
    out_err = float(np.max(np.abs(shuffled.output - base.output[perm])))
    # token perm[i] now sits at row i; its weights over the same tokens: columns permuted alike
    w_err = float(np.max(np.abs(shuffled.weights - base.weights[:, perm][:, :, perm])))
    blind = out_err < TOLERANCE and w_err < TOLERANCE

    # 2. The causal mask: −∞ above the diagonal before the softmax.
    c = len(CAUSAL_TOKENS)
    causal = layer(x[:c], causal=True)  # weights (2, 5, 5)
    allowed = causal_mask(c)
    above = float(np.max(np.abs(causal.weights[:, ~allowed])))

    # 3. Hiding a token: nobody may attend to it, so it can be asked for.
    hidden_pos = TOKENS.index(HIDDEN_WORD)
    hide = hide_mask(n, [hidden_pos], tq=n)  # (8, 8), column `hidden_pos` False
    hidden = layer(x, mask=hide)
    hidden_col = float(np.max(np.abs(hidden.weights[..., hidden_pos])))
    row_sums = float(np.max(np.abs(hidden.weights.sum(-1) - 1)))

    order = " ".join(tokens[i] for i in perm)
    findings = (
        f'Order blindness: shuffled to "{order}", with no position information the outputs come out shuffled the '
        f"same way (largest difference {out_err:.1e}) and each token's weights over the same tokens are unchanged "
        f"({w_err:.1e}): {'checked' if blind else 'NOT confirmed'}. Attention alone does not know word order.",
        f'The causal mask puts −∞ on every score above the diagonal before the softmax: over "{" ".join(CAUSAL_TOKENS)}", '
        f"every weight on a later token is exactly {above:g}; the first token can only attend to itself.",
        f'Hiding "{HIDDEN_WORD}" (masked-LM): no query may attend to it, its column is {hidden_col:g} in every head, '
        f"and every row still adds up to 1 (error {row_sums:.1e}); a model asked to predict it must use the context.",
    )
    causal_labels = list(CAUSAL_TOKENS)
    tables = (
        table(
            "Order blindness, head 1: weights of each token before and after shuffling",
            ["token", "position before", "position after", "largest weight (before)", "largest weight (after)"],
            [
                [tokens[perm[i]], perm[i] + 1, i + 1,
                 f"{pct(base.weights[0, perm[i]].max())} on {tokens[int(base.weights[0, perm[i]].argmax())]}",
                 f"{pct(shuffled.weights[0, i].max())} on {tokens[perm[int(shuffled.weights[0, i].argmax())]]}"]
                for i in range(n)
            ],
        ),
        table("Causal mask, head 1: weights (· = −∞ before the softmax)", ["query"] + causal_labels,
              _weight_rows(causal.weights[0], causal_labels)),
        table(f'"{HIDDEN_WORD}" hidden, head 1: weights', ["query"] + tokens, _weight_rows(hidden.weights[0], tokens)),
    )
    data = {
        "tokens": tokens,
        "order_blindness": {
            "permutation": perm.tolist(),
            "output_max_error": out_err,
            "weights_max_error": w_err,
            "checked": blind,
            "weights": base.weights[0].tolist(),
            "weights_shuffled": shuffled.weights[0].tolist(),
        },
        "causal": {
            "tokens": causal_labels,
            "mask": allowed.tolist(),
            "weights": causal.weights[0].tolist(),
            "max_weight_above_diagonal": above,
        },
        "hidden": {
            "word": HIDDEN_WORD,
            "position": hidden_pos,
            "weights": hidden.weights[0].tolist(),
            "max_weight_on_hidden": hidden_col,
            "max_row_sum_error": row_sums,
        },
    }
    return Section("next", 7, "Order blindness, the causal mask, a hidden token", findings, tables, data)
