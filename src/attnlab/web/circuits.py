"""The served circuits: activation patching and direct logit attribution on attnlab's transformer, on the
viewer model's weights (the Generation view's transformer, loaded once), for the model view to colour
its heads by.

Both answer ``heads`` [layer][head] (0-based): patching, how much of the clean logit (difference) each
head's output brings back into the corrupted run (:func:`attnlab.patch`, normalised, 1 all of it);
attribution, what each head writes straight into the logit (difference) of one text
(:func:`attnlab.logit_attribution`). The texts and tokens are read as the CLI reads them
(:mod:`attnlab.interventions.targets`); what the model cannot take is a ValueError, a 400.
"""

from __future__ import annotations

from typing import Any

# what an encoder cannot do, in the reason /api/info and the 400s give
CANNOT = "has no next-token logits for patching or attribution to measure"


def _decoder(generator: Any) -> Any:
    why = generator.refusal(CANNOT)
    if why is not None:
        raise ValueError(why)
    return generator.model()


def _model(net: Any, model_id: str) -> dict:
    return {"id": model_id, "num_layers": net.config.num_layers, "num_heads": net.config.num_heads}


def _ids(net: Any, ids: list[int]) -> Any:
    import torch

    return torch.tensor([ids], device=net.device)  # [1, T]


def patched(generator: Any, clean: str, corrupted: str, target: str, baseline: str | None) -> dict:
    """Each head's output patched from ``clean`` into ``corrupted`` (as many tokens), measured by the
    logit of ``target`` (minus ``baseline``'s) at the last position."""
    from attnlab.interventions.patching import patch
    from attnlab.interventions.targets import describe, encode_pair, logit_metric, target_ids
    from attnlab.viz.generation import token_texts

    net, lm = _decoder(generator), generator.cache.loaded()
    tok = net.tokenizer
    a, b = encode_pair(tok, clean, corrupted, net.config.max_positions - net.config.position_offset)
    t, base = target_ids(net, target, baseline)
    with generator.cache.lock:  # one model call at a time, as the captures
        found = patch(net, _ids(net, a), _ids(net, b), logit_metric(t, base))
    return {"model": _model(net, lm.model_id), "metric": describe(tok, t, base), "target": t, "baseline": base,
            "clean_labels": token_texts(tok, a), "corrupted_labels": token_texts(tok, b),
            "heads": found.effect.tolist(), "clean": float(found.clean[0]), "corrupted": float(found.corrupted[0])}


def attributed(generator: Any, text: str, target: str, baseline: str | None) -> dict:
    """What each component writes straight into the logit of ``target`` (minus ``baseline``'s) at the
    last position of ``text``: the heads as a grid, everything in ``components``, and the sum's check."""
    from attnlab.interventions.attribution import logit_attribution
    from attnlab.interventions.targets import describe, encode, target_ids
    from attnlab.viz.generation import token_texts

    net, lm = _decoder(generator), generator.cache.loaded()
    tok = net.tokenizer
    ids = encode(tok, text, net.config.max_positions - net.config.position_offset)
    t, base = target_ids(net, target, baseline)
    with generator.cache.lock:
        found = logit_attribution(net, _ids(net, ids), t, baseline=base)
    c = net.config
    data = found.to_dict()
    heads = [[0.0] * c.num_heads for _ in range(c.num_layers)]
    for part in data["components"]:
        if part["kind"] == "head":
            heads[part["layer"]][part["head"]] = part["value"]
    return {"model": _model(net, lm.model_id), "metric": describe(tok, t, base), "labels": token_texts(tok, ids),
            "heads": heads, **{k: data[k] for k in ("target", "baseline", "total", "logit", "error", "components")}}
