"""How a quantized cache writes one layer's keys or values: :class:`Store` holds the codes, scales, zero points
and the int4 residual in the format of :mod:`attnlab.reference.quantized` (which says how they are read), and
encodes each step's new entries into them. Slot = position (a dense cache)."""

from __future__ import annotations

from typing import Any

import torch

from attnlab.backends import pages
from attnlab.reference.quantized import FP8_MAX, GROUP, RESIDUAL, QuantizedKV, hadamard
from attnlab.transformer.layer_cache import Step

try:  # built at install where a C compiler is (optional): else torch's operations, to the same codes
    from attnlab.transformer import _encode
except ImportError:
    _encode = None


def encode_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., D) float32 → codes int8 (..., D) in −127..127 and one scale per row (...): symmetric, x̂ = code·scale."""
    scale = x.abs().amax(-1) / 127.0  # (...,)
    safe = torch.where(scale > 0, scale, 1.0)
    codes = torch.round(x / safe[..., None]).clamp_(-127, 127).to(torch.int8)
    return codes, scale


def encode_int4(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x float32 grouped along ``dim`` (a group is that axis, 32 long) → codes uint8 0..15 (x's shape, unpacked),
    scale and zero (x's shape without ``dim``): zero = the group's minimum, scale = (max − min) / 15."""
    lo, hi = x.amin(dim), x.amax(dim)
    scale = (hi - lo) / 15.0
    safe = torch.where(scale > 0, scale, 1.0)
    codes = torch.round((x - lo.unsqueeze(dim)) / safe.unsqueeze(dim)).clamp_(0, 15).to(torch.uint8)
    return codes, scale, lo


def coded_upto(end: int) -> int:
    """int4: the positions held as codes (0..returned − 1) once a sequence holds ``end``: all but the newest
    RESIDUAL or more, in whole groups."""
    return GROUP * (max(0, end - RESIDUAL) // GROUP)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 (..., D) → (..., D/2): channel 2j in the low nibble, 2j + 1 in the high one."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def scatter(dst: torch.Tensor, src: torch.Tensor, step: Step) -> None:
    """The step's real columns of ``src`` (B, H, Tq, ...) into ``dst`` (B, H, C, ...) at their positions."""
    if step.decode and step.even:
        dst[:, :, int(step.start[0])] = src[:, :, 0]
        return
    b, col = step.real.nonzero(as_tuple=True)  # (N,), (N,)
    dst[b, :, step.positions[b, col]] = src[b, :, col]  # (N, H, ...)


class Store:
    """One layer's keys (``grouping="channel"``) or values (``"token"``) in a quantized cache of ``kind``.

    ``dtype`` is the model's: entries come in it, and the int4 residual holds it. ``rotate`` (keys): each entry
    is stored as Hd·x. ``saturated`` (fp8): entries beyond the head's scale·448, clamped there, counted.
    """

    def __init__(self, kind: str, batch: int, heads: int, dim: int, capacity: int, dtype: torch.dtype, device: Any,
                 grouping: str = "token", rotate: bool = False):
        self.kind, self.dim, self.dtype, self.grouping, self.rotate = kind, dim, dtype, grouping, rotate
        self.device = torch.device(device)
        self.norm, self.saturated, self.scaled = 0.0, 0, False  # scaled (fp8): every head's scale is set
        B, H = batch, heads
        cap = -(-capacity // GROUP) * GROUP if kind == "int4" else capacity
        self.zero = self.residual = self.quantized = None
        if kind == "int8":
            self.codes = pages.zeros((B, H, cap, dim), torch.int8, device)
            self.scale = pages.zeros((B, H, cap), torch.float32, device)  # (B, H, C) per token
        elif kind == "fp8":
            self.codes = pages.zeros((B, H, cap, dim), torch.float8_e4m3fn, device)
            self.scale = torch.zeros(B, H, device=device)  # (B, H): set by the first nonzero write
        else:
            self.codes = pages.zeros((B, H, cap, dim // 2), torch.uint8, device)
            groups = (B, H, cap // GROUP, dim) if grouping == "channel" else (B, H, cap, dim // GROUP)
            self.scale = pages.zeros(groups, torch.float32, device)  # read with the codes: huge pages too
            self.zero = pages.zeros(groups, torch.float32, device)
            # a ring by position: R + 32 slots, or the capacity when smaller (then slot = position, nothing leaves it)
            self.residual = torch.zeros(B, H, min(RESIDUAL + GROUP, cap), dim, dtype=dtype, device=device)
            self.quantized = torch.zeros(B, dtype=torch.long, device=device)  # positions held as codes

    @property
    def shape(self) -> tuple[int, int, int, int]:
        B, H, C = self.codes.shape[:3]
        return (B, H, C, self.dim)

    @property
    def nbytes(self) -> int:
        return sum(int(t.nbytes) for t in (self.codes, self.scale, self.zero, self.residual, self.quantized) if t is not None)

    def read(self, length: int) -> QuantizedKV:
        """Slots 0..length − 1 as attention() takes them (the tensors themselves, no copy)."""
        return QuantizedKV(self.kind, self.codes, self.scale, length, self.dim, self.norm, self.zero, self.residual,
                           self.quantized, self.grouping, self.rotate)

    def grow(self, size: int) -> None:
        """At least ``size`` slots (the position axis of codes and of per-token or per-group scales)."""
        size = -(-size // GROUP) * GROUP if self.kind == "int4" else size
        C = self.codes.shape[2]
        if size <= C:
            return
        names = ["codes"] + ([] if self.kind == "fp8" else ["scale"]) + (["zero"] if self.kind == "int4" else [])
        for name in names:
            old = getattr(self, name)
            per = GROUP if self.kind == "int4" and self.grouping == "channel" and name != "codes" else 1
            new = pages.zeros((*old.shape[:2], size // per, *old.shape[3:]), old.dtype, old.device)  # (B, H, size[/32], ...)
            new[:, :, : old.shape[2]] = old
            setattr(self, name, new)
        if self.residual is not None and self.residual.shape[2] < min(RESIDUAL + GROUP, size):
            ring = self.residual.new_zeros((*self.residual.shape[:2], min(RESIDUAL + GROUP, size), self.dim))
            ring[:, :, : self.residual.shape[2]] = self.residual  # every position held was its own slot
            self.residual = ring

    def write(self, step: Step, x: torch.Tensor) -> None:
        """Encode the step's new entries x (B, H, Tq, D), checked finite in the model's dtype, into their slots, and
        raise ``norm`` to the longest of the rows written (and turned into codes) as they are read: from what was
        just encoded, not read back from the cache, where it can."""
        x = x.to(torch.float32)
        if self.rotate:  # Hd·x for each row (Hd symmetric): after rotary, before quantizing
            x = x @ torch.from_numpy(hadamard(self.dim)).to(torch.float32)
        if _encode is not None and step.decode and step.even and x.device.type == "cpu":
            norm = self._encode_step(x, int(step.start[0]))
            if norm is not None:
                self.norm = max(self.norm, norm)
                return
        if self.kind == "int8":
            codes, scale = encode_int8(x)
            scatter(self.codes, codes, step)
            scatter(self.scale, scale, step)
            rows = QuantizedKV("int8", codes, scale, step.tq, self.dim, 0.0).dequantize(0, step.tq)  # as read
        elif self.kind == "fp8":
            rows = self._write_fp8(step, x)
        else:
            coded = self._write_int4(step, x)
            if coded < step.longest:  # some rows became codes: every row from the first written or coded, as read
                self._bound(self.read(step.longest).dequantize(min(int(step.start.min()), coded), step.longest))
                return
            rows = x.to(self.dtype).to(torch.float32)  # (most decoding steps) the step's rows in the ring, as read
        if not (step.decode and step.even):  # padding columns were not written
            rows = torch.where(step.real[:, None, :, None], rows, 0.0)
        self._bound(rows)

    def _ring_only(self, start: int) -> bool:
        """int4: a decoding step's token at ``start`` goes to the ring and no sequence's group becomes codes."""
        return coded_upto(start + 1) <= int(self.quantized.min())

    def _encode_step(self, x: torch.Tensor, slot: int) -> float | None:
        """A decoding step's rows x (B, H, 1, D) float32 into ``slot`` of every sequence by the compiled encoder
        (:mod:`attnlab.transformer._encode`: torch's codes, scales and fp8's saturation count in one call instead of
        some twenty operations); returns the longest row as read, rounded up, or None where it does not apply
        (fp8 before every head's scale is set; int4 with a 16-bit ring, or sequences whose groups differ)."""
        B, H, C, D = self.shape
        rows = x.contiguous().numpy()
        if self.kind == "int8":
            return _encode.int8_rows(rows, self.codes.numpy(), self.scale.numpy(), B * H, D, C, slot)
        if self.kind == "fp8":
            if not self.scaled:
                return None
            norm, over = _encode.fp8_rows(rows, self.codes.view(torch.uint8).numpy(), self.scale.contiguous().numpy(),
                                          B * H, D, C, slot)
            self.saturated += over
            return norm
        if self.residual.dtype != torch.float32:
            return None
        ring, held = self.residual.shape[2], self.quantized.numpy()
        lo, hi, due = int(held.min()), int(held.max()), coded_upto(slot + 1)
        norm = 0.0
        if due > lo:  # the group that leaves the ring (every sequence's the same one) becomes codes, then the token
            if lo != hi or due - lo != GROUP:
                return None
            norm = _encode.int4_group(self.residual.numpy(), self.codes.numpy(), self.scale.numpy(), self.zero.numpy(),
                                      B * H, D, ring, C, lo, self.grouping == "channel")
            held[:] = due
        return max(norm, _encode.f32_rows(rows, self.residual.numpy(), B * H, D, ring, slot % ring))

    def _bound(self, rows: torch.Tensor) -> None:
        """``norm`` raised to the longest of ``rows`` (..., D)."""
        if rows.numel():
            self.norm = max(self.norm, float(torch.linalg.vector_norm(rows, dim=-1).max()))

    def _write_fp8(self, step: Step, x: torch.Tensor) -> torch.Tensor:
        """Writes x's codes; returns the rows as they are read (B, H, Tq, D)."""
        every = step.decode and step.even  # every column real (a decoding step of every sequence)
        real = step.real[:, None, :, None]  # (B, 1, Tq, 1)
        if not self.scaled:  # some head's scale not yet set: set once, at its first nonzero write
            top = torch.where(real, x.abs(), 0.0).amax(dim=(2, 3))  # (B, H): this write's largest |x|
            self.scale = torch.where(self.scale > 0, self.scale, top / FP8_MAX)
            self.scaled = bool((self.scale > 0).all())
        y = x / (self.scale if self.scaled else torch.where(self.scale > 0, self.scale, 1.0))[:, :, None, None]
        out = y.abs() > FP8_MAX
        self.saturated += int((out if every else out & real).sum())
        codes = y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        scatter(self.codes, codes, step)
        # as read (QuantizedKV.dequantize's float16 route, for large reads, gives these bits: both round code · scale once)
        return codes.to(torch.float32) * self.scale[:, :, None, None]

    def _write_int4(self, step: Step, x: torch.Tensor) -> int:
        """Positions past each sequence's newest RESIDUAL (in whole groups) become codes; the rest go to the ring.
        Returns the first position turned into codes (a large number if none)."""
        ring, first_coded = self.residual.shape[2], 1 << 62
        if step.decode and step.even:  # one token a sequence, all at one position: to the ring unless a group is due
            start = int(step.start[0])
            if self._ring_only(start):
                self.residual[:, :, start % ring] = x[:, :, -1].to(self.dtype)
                return first_coded
        for b in range(x.shape[0]):
            start, new = int(step.start[b]), int(step.new[b])
            end, first = start + new, step.tq - new  # the sequence's first real column
            q0, q1 = int(self.quantized[b]), coded_upto(start + new)
            if q1 > q0:  # positions q0..q1 − 1: from the ring (before this step) or from x
                pos = torch.arange(q0, q1, device=x.device)
                old = self.residual[b][:, pos % ring].to(torch.float32)  # (H, n, D)
                fresh = x[b][:, (first + (pos - start)).clamp(min=0, max=step.tq - 1)]  # (H, n, D)
                self._encode(b, q0, q1, torch.where((pos >= start)[None, :, None], fresh, old))
                self.quantized[b], first_coded = q1, min(first_coded, q0)
            keep = torch.arange(max(q1, start), end, device=x.device)  # positions held in the ring
            self.residual[b][:, keep % ring] = x[b][:, first + keep - start].to(self.dtype)
        return first_coded

    def _encode(self, b: int, q0: int, q1: int, x: torch.Tensor) -> None:
        """Sequence b's positions q0..q1 − 1 (whole groups), x (H, n, D) float32, as codes, scales and zeros."""
        H, n, D = x.shape
        if self.grouping == "channel":  # a group: one channel over 32 tokens
            codes, scale, zero = encode_int4(x.view(H, n // GROUP, GROUP, D), 2)
            self.scale[b, :, q0 // GROUP: q1 // GROUP], self.zero[b, :, q0 // GROUP: q1 // GROUP] = scale, zero
        else:  # a group: one token over 32 channels
            codes, scale, zero = encode_int4(x.view(H, n, D // GROUP, GROUP), 3)
            self.scale[b, :, q0:q1], self.zero[b, :, q0:q1] = scale, zero
        self.codes[b, :, q0:q1] = pack(codes.reshape(H, n, D))
