"""A quantized cache's keys or values as :func:`attnlab.attention` takes them: :class:`QuantizedKV`, codes and
scales together, and how they become numbers again (the one dequantization every reader follows).

The stored format (docs/generation.md, "Quantized caches", says it for users):

- ``int8``: codes int8 [B, H, C, D], one float32 scale per token and head [B, H, C]; x̂ = code·scale (symmetric).
- ``int4`` (KIVI): two codes per byte along D, uint8 [B, H, C, D/2], channel 2j in the low nibble and 2j+1 in the
  high one. Keys are grouped per channel over 32 consecutive tokens (scale and zero [B, H, C/32, D]), values per
  token over 32 channels (scale and zero [B, H, C, D/32]); x̂ = code·scale + zero (the zero point is the group's
  minimum). The newest tokens of each sequence (positions ``quantized[b]``.. ``lengths[b]``, at least
  :data:`RESIDUAL` once there are that many) are held in the model's float dtype in ``residual``
  [B, H, S, D], S = min(RESIDUAL + GROUP, C), slot = position mod S.
- ``fp8``: codes float8_e4m3fn [B, H, C, D], one float32 scale per sequence and head [B, H]; x̂ = code·scale.

Dequantized numbers are float32 (code·scale computed in float32), so the float64 reference on
:meth:`QuantizedKV.reference` is exactly what a backend reads, up to its own float32 rounding.
``rotated``: the keys were stored as Hd·k (:func:`hadamard`); a reader multiplies its queries by Hd, and
:meth:`QuantizedKV.reference` turns them back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

KINDS = ("int8", "int4", "fp8")
GROUP = 32  # int4: tokens per key group (one channel), channels per value group (one token)
RESIDUAL = 128  # int4: the newest tokens kept in the model's dtype (at least this many once there are)
FP8_MAX = 448.0  # the largest finite float8_e4m3fn


@cache
def hadamard(d: int) -> np.ndarray:
    """Sylvester's Hadamard matrix over √d (d a power of two), float64 (d, d): orthogonal and symmetric,
    Hd[i, j] = (−1)^popcount(i & j) / √d."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"a Hadamard rotation needs a head width that is a power of two, got {d}")
    i = np.arange(d)
    bits = np.bitwise_and(i[:, None], i[None, :])
    parity = np.zeros((d, d), dtype=np.int64)
    while bits.any():
        parity ^= bits & 1
        bits = bits >> 1
    return (1.0 - 2.0 * parity) / math.sqrt(d)


@dataclass(frozen=True, eq=False)
class QuantizedKV:
    """One layer's keys or values as stored by a quantized cache, read as (B, H, Tk, D): torch tensors that
    stay as they are (nothing is copied to make this value).

    kind: "int8", "int4" or "fp8". codes, scale (and, for int4, zero, residual and quantized: see the
    module) with C ≥ Tk slots; only the first ``length`` = Tk are read. grouping (int4): "channel" (keys:
    a group is one channel over 32 tokens) or "token" (values: one token over 32 channels). norm: an
    upper bound of every dequantized row's length ‖x̂_j‖ (what overflow checks use instead of a pass).
    """

    kind: str
    codes: Any
    scale: Any
    length: int
    dim: int
    norm: float
    zero: Any = None
    residual: Any = None
    quantized: Any = None  # (B,) int64: int4 positions held as codes; the rest (to each length) in residual
    grouping: str = "token"
    rotated: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not 1 <= self.length <= self.codes.shape[2]:
            raise ValueError(f"length must be in 1..{self.codes.shape[2]} (the slots held), got {self.length}")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]), self.length, self.dim)

    @property
    def ndim(self) -> int:
        return 4

    @property
    def device(self) -> Any:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        """The bytes of every tensor held: codes, scales, zero points, residual (every slot, filled or not)."""
        held = (self.codes, self.scale, self.zero, self.residual, self.quantized)
        return sum(int(t.nbytes) for t in held if t is not None)

    def dequantize(self, start: int, stop: int) -> Any:
        """Keys or values ``start``..``stop`` − 1 as float32 torch (B, H, n, D), as stored (rotated keys stay rotated)."""
        import torch

        n = stop - start
        B, H = self.shape[:2]
        c = self.codes[:, :, start:stop]
        if self.kind == "int8":
            return c.to(torch.float32) * self.scale[:, :, start:stop, None]
        if self.kind == "fp8":  # e4m3's bits moved into a float16's are the code · 2^−8 (normal or not): exact, fast
            b = c.view(torch.uint8).to(torch.int16)  # sign s, then 7 bits r: float16 bits s << 15 | r << 7
            half = ((b + (b & 0x80)) << 7).view(torch.float16)  # (b + s·128) << 7 carries the sign into bit 15
            return half.to(torch.float32) * (self.scale * 256.0)[:, :, None, None]
        q = torch.stack((c & 15, c >> 4), dim=-1).reshape(B, H, n, self.dim).to(torch.float32)  # (B, H, n, D)
        if self.grouping == "channel" and start % GROUP == 0 and n % GROUP == 0:  # whole groups: broadcast
            g = slice(start // GROUP, stop // GROUP)
            x = (q.view(B, H, n // GROUP, GROUP, self.dim) * self.scale[:, :, g, None]
                 + self.zero[:, :, g, None]).view(B, H, n, self.dim)
        elif self.grouping == "channel":  # position p uses group p // 32 of its channel
            g = torch.arange(start, stop, device=c.device) // GROUP
            x = q * self.scale[:, :, g] + self.zero[:, :, g]  # (B, H, n, D)
        else:  # token p, channels 32c..32c+31 use group c
            x = (q.view(B, H, n, self.dim // GROUP, GROUP) * self.scale[:, :, start:stop, :, None]
                 + self.zero[:, :, start:stop, :, None]).view(B, H, n, self.dim)
        return self._with_residual(x, start, stop)

    def _with_residual(self, x: Any, start: int, stop: int) -> Any:
        """int4: the positions past each sequence's quantized ones come from the float residual."""
        import torch

        if int(self.quantized.min()) >= stop:  # every position of the tile is held as codes
            return x
        pos = torch.arange(start, stop, device=x.device)  # (n,)
        use = pos[None] >= self.quantized[:, None]  # (B, n)
        res = self.residual[:, :, pos % self.residual.shape[2]].to(torch.float32)  # (B, H, n, D)
        return torch.where(use[:, None, :, None], res, x)

    def reference(self) -> np.ndarray:
        """Every key or value (B, H, Tk, D) as float64 NumPy in the original basis (Hd·x̂ for rotated keys):
        what the float64 specification attends to."""
        x = self.dequantize(0, self.length).double().cpu().numpy()
        return x @ hadamard(self.dim) if self.rotated else x
