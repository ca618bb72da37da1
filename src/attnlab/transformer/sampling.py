"""How the next token is chosen from its logits: greedy, or sampled with temperature, top-k and top-p.

The order is transformers': divide by the temperature, keep the ``top_k`` largest, keep the smallest
set whose probability reaches ``top_p`` (nucleus sampling, Holtzman et al. 2020; the most likely
token always stays), then draw from the softmax with a ``torch.Generator`` seeded by ``seed``, so
the same seed draws the same tokens. Greedy takes the first largest logit (``torch.argmax``'s rule,
as transformers' greedy search).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# One temperature range for the library, the CLI and the server (which say it in these words): a finite
# T in (0, MAX_TEMPERATURE]; beyond it the softmax is uniform to float32's precision (random bytes).
MAX_TEMPERATURE = 100.0
TEMPERATURE_RULE = f"temperature must be a finite number in (0, {MAX_TEMPERATURE:g}]"


def check_temperature(t: Any, name: str = "temperature") -> float:
    """``t`` as a float when it lies in (0, MAX_TEMPERATURE] (a finite number); else the one error, naming ``name``."""
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise TypeError(f"{name} must be a number, got {t!r}")
    if not (math.isfinite(t) and 0 < t <= MAX_TEMPERATURE):
        raise ValueError(f"{name}{TEMPERATURE_RULE.removeprefix('temperature')}, got {t!r} (greedy decoding: "
                         "leave out the sampling options)")
    return float(t)


@dataclass(frozen=True)
class Sampling:
    """The choice rule. Sampling options are refused with ``sample=False`` (they would be ignored). torch is
    imported where it computes: the CLI checks a temperature with :func:`check_temperature` before torch loads."""

    sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sample, bool):
            raise TypeError(f"sample must be True or False, got {self.sample!r}")
        t, k, p = self.temperature, self.top_k, self.top_p
        check_temperature(t)  # sampling or not: one range (greedy refuses any T but the default below)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"top_k must be an int >= 1 or None, got {k!r}")
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1):
            raise ValueError(f"top_p must lie in (0, 1], got {p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}")
        if not self.sample:
            given = [f"{n}={v!r}" for n, v, default in (("temperature", t, 1.0), ("top_k", k, None), ("top_p", p, None),
                                                         ("seed", self.seed, None)) if v != default]
            if given:
                raise ValueError(f"{', '.join(given)} take effect only when sampling: pass sample=True")

    def generator(self, device: Any) -> torch.Generator | None:
        """The random stream of one generation (None for greedy decoding)."""
        import torch

        if not self.sample:
            return None
        g = torch.Generator(device=device)
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g

    def filtered(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits (B, V) after temperature, top-k and top-p, as float32 or wider; removed tokens −inf."""
        import torch

        x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits.clone()
        # shifted by the largest first (≤ 0): a tiny T (5e-324, zero in float32) sends the others to −inf and
        # leaves the largest at 0, never inf − inf or 0 / 0 (NaN probabilities)
        shifted = x - x.max(-1, keepdim=True).values
        x = torch.where(shifted == 0, shifted, shifted / self.temperature)
        if self.top_k is not None and self.top_k < x.shape[-1]:
            keep = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, x.topk(self.top_k, dim=-1).indices, True)
            x = x.masked_fill(~keep, float("-inf"))
        if self.top_p is not None and self.top_p < 1:
            probs, order = x.softmax(-1).sort(dim=-1, descending=True)  # (B, V) each
            before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each one
            drop_sorted = before >= self.top_p  # the first token is never dropped: nothing is above it
            drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
            x = x.masked_fill(drop, float("-inf"))
        return x

    def choose(self, logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """The next token of each sequence (B,) from its logits (B, V)."""
        import torch

        if not self.sample:
            return logits.argmax(dim=-1)
        probs = self.filtered(logits).softmax(-1)  # (B, V)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]
