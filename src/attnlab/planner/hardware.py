"""The machines the planner predicts for: bundled accelerators (datasheet figures × stated efficiencies)
and this machine (measured, :mod:`attnlab.planner.machine`), both as one :class:`Hardware`.

A :class:`Rate` turns work into seconds: a constant (work / per-second rate) or, on this machine,
measured (work, seconds) points interpolated log-log (:func:`attnlab.backends.calibrate.estimate`,
the same rule auto's table uses), so fixed per-call costs at small sizes are part of the figure;
past the largest point the time grows in proportion to the work (the largest point's rate).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from attnlab.backends.calibrate import estimate


@dataclass(frozen=True)
class Rate:
    """Work (FLOPs or bytes) per second: ``per_s``, or measured ``points`` ((work, seconds), …)."""

    per_s: float | None = None
    points: tuple[tuple[float, float], ...] = ()

    def seconds(self, work: float) -> float:
        if work <= 0:
            return 0.0
        if self.points:
            top_work, top_s = max(self.points)
            if work >= top_work:  # past the largest point the rate holds: the work only repeats
                return top_s * work / top_work
            return estimate([list(p) for p in self.points], work)
        return work / self.per_s

    @property
    def at_largest(self) -> float:
        """The rate at the largest measured point (or the constant): what tables print."""
        if self.points:
            work, s = max(self.points)
            return work / s
        return self.per_s

    def to_dict(self) -> dict:
        return {"per_s": self.at_largest, "points": [list(p) for p in self.points]}


@dataclass(frozen=True)
class Accelerator:
    """A datasheet: peak dense 16-bit tensor FLOP/s, memory bandwidth and size, link bandwidth per direction."""

    name: str
    peak_flops: float
    bandwidth: float
    memory_bytes: float
    link: float
    link_name: str
    source: str


# Dense (no sparsity) 16-bit tensor-core peaks with FP32 accumulation, from the vendors' datasheets.
ACCELERATORS: dict[str, Accelerator] = {
    "h100": Accelerator("H100 SXM", 989e12, 3.35e12, 80e9, 450e9, "NVLink 4 (900 GB/s both ways)",
                        "NVIDIA H100 Tensor Core GPU datasheet (SXM5: BF16 1,979 TFLOPS with sparsity)"),
    "h200": Accelerator("H200 SXM", 989e12, 4.8e12, 141e9, 450e9, "NVLink 4 (900 GB/s both ways)",
                        "NVIDIA H200 Tensor Core GPU datasheet (SXM: BF16 1,979 TFLOPS with sparsity)"),
    "a100": Accelerator("A100 80GB SXM", 312e12, 2.039e12, 80e9, 300e9, "NVLink 3 (600 GB/s both ways)",
                        "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)"),
    "l4": Accelerator("L4", 121e12, 300e9, 24e9, 32e9, "PCIe Gen4 x16 (64 GB/s both ways)",
                      "NVIDIA L4 Tensor Core GPU datasheet (BF16 242 TFLOPS with sparsity)"),
    "rtx4090": Accelerator("RTX 4090", 165.2e12, 1008e9, 24e9, 32e9, "PCIe Gen4 x16 (no NVLink)",
                           "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 (FP16/BF16 tensor, "
                           "FP32 accumulate)"),
}
ALIASES = {"h100-sxm": "h100", "h100 sxm": "h100", "a100-80gb": "a100", "a100 80gb": "a100", "4090": "rtx4090",
           "rtx-4090": "rtx4090"}


@dataclass(frozen=True)
class Efficiencies:
    """What fraction of the datasheet a serving stack reaches: assumptions, printed with every prediction.

    matmul: the prefill's large GEMMs; attention: a FlashAttention-class prefill kernel; bandwidth: the
    decode's weight reads and the elementwise work (counted unfused: an upper bound where kernels fuse it); decode_attention: reading the KV cache (FlashDecoding-class); link: NCCL's
    all-reduce bus bandwidth over the link; layer_overhead_s: kernel launches and host work per layer
    and pass; allreduce_latency_s: the fixed cost of one all-reduce; step_overhead_s: the host's work per
    step beside the layers (sampling, scheduling), left at 0 unless known.
    """

    matmul: float = 0.7
    attention: float = 0.5
    bandwidth: float = 0.8
    decode_attention: float = 0.7
    link: float = 0.7
    layer_overhead_s: float = 15e-6
    allreduce_latency_s: float = 10e-6
    step_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("matmul", "attention", "bandwidth", "decode_attention", "link"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f"efficiency {name} must be in (0, 1], got {value!r}")
        for name in ("layer_overhead_s", "allreduce_latency_s", "step_overhead_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")


@dataclass(frozen=True)
class Hardware:
    """Rates the time model uses, per device. ``measured``: this machine's measurements, else a prediction."""

    name: str
    matmul: Rate  # FLOP/s of the layers' matmuls
    bandwidth: Rate  # bytes/s reading the weights
    attention: Rate  # FLOP/s of the prefill's attention, per layer call
    decode_attention: Rate  # bytes/s of KV cache read by one decode step's attention, per layer call
    elementwise: Rate  # bytes/s of elementwise work (norms, rotary, activations), per layer and pass
    memory_bytes: float
    layer_overhead_s: float
    measured: bool
    source: str
    link: float | None = None  # bytes/s per direction between devices (tensor parallelism)
    allreduce_latency_s: float = 0.0
    efficiencies: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    step_overhead_s: float = 0.0  # per pass, beside the layers': the decoding loop, sampling
    prefill_overhead_s: tuple[float, float] | None = None  # the prefill's (per layer, per pass), if not the same
    notes: tuple[str, ...] = ()  # what a plan on it must say (a rate not measured, a busy machine)
    bounds: tuple[Hardware, Hardware] | None = None  # the same machine at the fast and the slow end of its range

    def overhead(self, layers: int, prefill: bool) -> float:
        """The fixed seconds of one pass of ``layers`` layers: the prefill's where measured apart, else a step's."""
        per_layer, per_pass = (self.prefill_overhead_s if prefill and self.prefill_overhead_s
                               else (self.layer_overhead_s, self.step_overhead_s))
        return layers * per_layer + per_pass

    def to_dict(self) -> dict:
        d = asdict(replace(self, bounds=None))
        for name in ("matmul", "bandwidth", "attention", "decode_attention", "elementwise"):
            d[name] = getattr(self, name).to_dict()
        d["notes"], d["bounds"] = list(self.notes), [b.to_dict() for b in self.bounds] if self.bounds else None
        return d


def accelerator_key(name: str) -> str | None:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in ACCELERATORS else None


def accelerator(name: str, efficiencies: Efficiencies | None = None) -> Hardware:
    """A bundled accelerator's :class:`Hardware`: the datasheet times the (stated, overridable) efficiencies."""
    key = accelerator_key(name) if isinstance(name, str) else None
    if key is None:
        raise ValueError(f"hardware {name!r} is not known; known: this, {', '.join(ACCELERATORS)}")
    a, e = ACCELERATORS[key], efficiencies or Efficiencies()
    return Hardware(
        a.name, Rate(a.peak_flops * e.matmul), Rate(a.bandwidth * e.bandwidth), Rate(a.peak_flops * e.attention),
        Rate(a.bandwidth * e.decode_attention), Rate(a.bandwidth * e.bandwidth), a.memory_bytes, e.layer_overhead_s, False,
        a.source, link=a.link * e.link, allreduce_latency_s=e.allreduce_latency_s, efficiencies=asdict(e),
        step_overhead_s=e.step_overhead_s,
        details={"peak_flops": a.peak_flops, "bandwidth": a.bandwidth, "memory_bytes": a.memory_bytes,
                 "link": a.link, "link_name": a.link_name})


def with_memory(hw: Hardware, memory_bytes: float) -> Hardware:
    return replace(hw, memory_bytes=memory_bytes)
