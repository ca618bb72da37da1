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


ENGINES = ("vllm", "trt-llm", "ideal")
DEFAULT_ENGINE = "vllm"
FIT_SOURCE = ("fitted by benchmarks/fit_accelerators.py to batch-1 totals of Argonne's LLM-Inference-Bench "
              "(benchmarks/published/llm_inference_bench.csv) on Llama-3-8B and Mistral-7B")
# (accelerator, engine) → the fitted efficiencies and the held-out rows' predicted ÷ measured (lowest, highest):
# Qwen2-7B, Llama-2-7B, Llama-3-70B and Llama-2-70B, which no fitted row shares a model with. The prefill's
# matmul and attention efficiencies stay assumed (the prefill is under 1 % of those totals).
# Fitted as one fixed cost per step (both engines replay a decode step as a CUDA graph) and none per layer; on
# H100 under vLLM the bandwidth efficiency reached its bound, 1.0, with 3.3 ms a step: among 7-8B models a
# shortfall in bandwidth and a fixed cost per token look alike, and only the tensor-parallel rows tell them apart.
FITTED: dict[tuple[str, str], tuple[dict, tuple[float, float]]] = {
    ("a100", "trt-llm"): ({"bandwidth": 0.653, "decode_attention": 0.653, "layer_overhead_s": 0.0,
                           "step_overhead_s": 2.763e-03, "allreduce_latency_s": 1.14e-05}, (0.85, 1.13)),
    ("a100", "vllm"): ({"bandwidth": 0.632, "decode_attention": 0.632, "layer_overhead_s": 0.0,
                        "step_overhead_s": 2.623e-03, "allreduce_latency_s": 2.12e-05}, (0.98, 1.07)),
    ("h100", "trt-llm"): ({"bandwidth": 0.864, "decode_attention": 0.864, "layer_overhead_s": 0.0,
                           "step_overhead_s": 2.040e-03, "allreduce_latency_s": 1.23e-05}, (0.79, 1.09)),
    ("h100", "vllm"): ({"bandwidth": 1.0, "decode_attention": 1.0, "layer_overhead_s": 0.0,
                        "step_overhead_s": 3.327e-03, "allreduce_latency_s": 1.91e-05}, (0.87, 1.09)),
}


def engine_efficiencies(key: str, engine: str = DEFAULT_ENGINE) -> tuple[Efficiencies, tuple[float, float] | None]:
    """The efficiencies of ``engine`` on accelerator ``key``: fitted where published rows exist (with the held-out
    error as (lowest, highest) predicted ÷ measured), else the assumptions (None); "ideal" is always the assumptions."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    fitted = FITTED.get((key, engine))
    if fitted is None:
        return Efficiencies(), None
    return Efficiencies(**fitted[0]), fitted[1]


def accelerator_key(name: str) -> str | None:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in ACCELERATORS else None


def accelerator(name: str, efficiencies: Efficiencies | None = None, engine: str = DEFAULT_ENGINE) -> Hardware:
    """A bundled accelerator's :class:`Hardware`: the datasheet times the efficiencies, ``efficiencies`` when
    given, else ``engine``'s (:func:`engine_efficiencies`: fitted to published rows where there are some)."""
    key = accelerator_key(name) if isinstance(name, str) else None
    if key is None:
        raise ValueError(f"hardware {name!r} is not known; known: this, {', '.join(ACCELERATORS)}")
    fitted, error = engine_efficiencies(key, engine)
    a, e = ACCELERATORS[key], efficiencies or fitted
    error = error if efficiencies is None else None
    return Hardware(
        a.name, Rate(a.peak_flops * e.matmul), Rate(a.bandwidth * e.bandwidth), Rate(a.peak_flops * e.attention),
        Rate(a.bandwidth * e.decode_attention), Rate(a.bandwidth * e.bandwidth), a.memory_bytes, e.layer_overhead_s, False,
        a.source, link=a.link * e.link, allreduce_latency_s=e.allreduce_latency_s, efficiencies=asdict(e),
        step_overhead_s=e.step_overhead_s,
        details={"peak_flops": a.peak_flops, "bandwidth": a.bandwidth, "memory_bytes": a.memory_bytes,
                 "link": a.link, "link_name": a.link_name, "engine": engine, "fitted": error is not None,
                 "validation": list(error) if error else None})


def with_memory(hw: Hardware, memory_bytes: float) -> Hardware:
    return replace(hw, memory_bytes=memory_bytes)
