"""Rotary fields of a transformers config: ``rope_parameters`` (or ``rope_scaling`` of older configs) read as
:class:`~attnlab.transformer.config.TransformerConfig`'s ``rope_*`` fields, YaRN's as transformers'
``_compute_yarn_parameters`` reads them. A rotary kind attnlab does not compute is refused naming the key.
Plain dicts in and out (the config module and its family readers share it)."""

from __future__ import annotations

import math

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _rope(c: dict, rope: dict | None = None, key: str = "rope_parameters") -> dict:
    """The rotary fields: theta and the scaling (transformers' ``rope_parameters``, or ``rope_scaling`` of
    older configs; ``rope`` and ``key``: one layer type's entry, e.g. Gemma-3's ``rope_parameters.full_attention``)."""
    if rope is None:
        rope = dict(c.get("rope_scaling") or {}) | dict(c.get("rope_parameters") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{key}.rope_type must be one of {', '.join(ROPE_TYPES)} (the rotary kinds attnlab's "
                         f"transformer computes), got {rope_type!r}")
    partial = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1.0):
        raise ValueError(f"partial_rotary_factor must be 1.0 (rotary on every dim), got {partial!r}")
    out = {"rope_type": rope_type, "rope_theta": float(rope.get("rope_theta", c.get("rope_theta") or 10000.0))}
    if rope_type in ("linear", "llama3"):
        out["rope_factor"] = float(rope["factor"])
    if rope_type == "llama3":
        out.update(rope_low_freq=float(rope.get("low_freq_factor", 1.0)),
                   rope_high_freq=float(rope.get("high_freq_factor", 4.0)),
                   rope_original_positions=int(rope["original_max_position_embeddings"]))
    if rope_type == "yarn":
        out.update(_yarn(c, rope))
    return out


def _yarn(c: dict, rope: dict) -> dict:
    """YaRN's fields as transformers' ``_compute_yarn_parameters`` reads them (its defaults included)."""
    orig = int(rope["original_max_position_embeddings"])
    factor = rope.get("factor") or c.get("max_position_embeddings", orig) / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = rope.get("attention_factor")
    if attention is None:
        m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return {"rope_factor": float(factor), "rope_original_positions": orig, "rope_attention_factor": float(attention),
            "rope_beta_fast": float(rope.get("beta_fast") or 32), "rope_beta_slow": float(rope.get("beta_slow") or 1),
            "rope_truncate": bool(rope.get("truncate", True))}
