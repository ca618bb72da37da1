"""What a backend is: what it declares it supports, every reason it refuses a call, how it runs one.

A backend declares its :class:`Supports` (the array libraries of its inputs, devices, dtypes and features it
serves) and, where it needs more, adds its own reasons in :meth:`Backend.more_refusals`.
:meth:`Backend.refusals` returns *all* the reasons at once, so an error can say everything that
stands in the way, not only the first thing.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnlab.backends.request import Call, Request
from attnlab.reference import validate

# What a call can ask for, by the name of its Request field, and how a refusal says it.
FEATURES = {
    "mask": "a dense boolean mask",
    "bias": "an additive bias",
    "band": "causal or a sliding window",
    "structure": "structured visibility beyond causal (a window, lengths, documents, a prefix, sink tokens)",
    "lengths": "each sequence's own length (lengths=, masks.cache_lengths)",
    "mask_mod": "a mask evaluated by its rule (a mask_mod callable, or a union of more than two key intervals per row)",
    "score_mod": "a score_mod callable",
    "alibi": "ALiBi (masks.alibi)",
    "sinks": "learned sink logits (sink_logits=)",
    "gqa": "fewer key/value heads than query heads",
    "weights": "every weight (return_weights=True)",
    "weights_rows": "the weights of chosen rows (weights_rows=)",
    "lse": "the log-sum-exp (return_lse=True)",
    "grad": "gradients of q, k, v",
    "bias_grad": "a gradient of the bias",
    "block_size": "a block size (block_size=)",
    "softcap": "logit softcapping (softcap=)",
    "kv_dtype": "keys and values in another dtype than the query (a 16-bit cache under a float32 query)",
    "quantized": "a quantized cache's keys and values (QuantizedKV: codes and scales)",
}


def asked(r: Request) -> list[str]:
    """The features of FEATURES that ``r`` asks for."""
    return [f for f in FEATURES if (r.problem.groups > 1 if f == "gqa" else getattr(r, f))]


def refusal(s: Supports, feature: str) -> str:
    """The reason a backend that declares ``s`` gives for a feature it does not serve."""
    hint = s.instead.get(feature)
    return f"does not support {FEATURES[feature]}" + (f" ({hint})" if hint else "")


# The largest score bound a backend computing in each dtype accepts: a quarter of the dtype's range,
# so that scaling to base 2 and subtracting a row's maximum (the online softmax) cannot overflow either.
OVERFLOW_LIMIT = {"float16": 65504.0 / 4, "bfloat16": 3.39e38 / 4, "float32": 3.4e38 / 4, "float64": 1.79e308 / 4}


@dataclass(frozen=True)
class Supports:
    """What a backend serves: array libraries ("numpy", "torch"), devices ("cpu" or "any"), dtypes, features.

    ``instead``: for a feature it does not serve, what to ask for instead (its refusal says so).
    """

    libraries: frozenset[str]
    devices: str
    dtypes: frozenset[str]
    features: frozenset[str]
    instead: dict[str, str] = field(default_factory=dict, hash=False)


class Backend:
    """A way to compute attention that says what it supports.

    ``supports`` declares it; ``refusals`` lists every reason it cannot serve a request (empty: it
    can); ``compute_dtype`` is the precision it computes a dtype in (auto keeps one precision per
    input dtype at every size); ``estimate`` is a rough prior of the seconds a call takes, used by
    ``auto`` only where nothing was measured on this machine (:mod:`attnlab.backends.calibrate`);
    ``run`` returns (out, weights or None, LSE or None) in the same array library, device and dtype as q.
    """

    name: str = ""
    summary: str = ""
    supports: Supports
    # the quantized formats a backend declaring the feature "quantized" reads (QuantizedKV.kind)
    quantized_kinds: frozenset[str] = frozenset({"int8", "int4", "fp8"})

    def refusals(self, r: Request) -> list[str]:
        s, reasons = self.supports, []
        if r.library not in s.libraries:
            reasons.append(f"takes {' or '.join(sorted(s.libraries))} inputs, got {r.library}")
        if s.devices != "any" and r.device.split(":")[0] != s.devices:
            reasons.append(f"runs on {s.devices} only, got {r.device}")
        if r.dtype not in s.dtypes:
            reasons.append(f"computes {', '.join(d for d in validate.FLOAT_DTYPES if d in s.dtypes)} only, got {r.dtype}")
        reasons += [refusal(s, f) for f in asked(r) if f not in s.features]
        if r.quantized and "quantized" in s.features and r.quantized not in self.quantized_kinds:
            reasons.append(f"reads {' and '.join(sorted(self.quantized_kinds))} caches, not {r.quantized}")
        if r.dtype in s.dtypes and r.score_bound > (limit := OVERFLOW_LIMIT[self.compute_dtype(r.dtype)]):
            reasons.append(f"scores reach up to {r.score_bound:.3g} (|scale|·max|q|·max|k|), beyond what it computes in "
                           f"{self.compute_dtype(r.dtype)} without overflow ({limit:.3g}); scale q or k down, or use float64")
        return reasons + self.more_refusals(r)

    def more_refusals(self, r: Request) -> list[str]:
        """Reasons beyond the declared support (a missing library, a build without the compiled kernel)."""
        return []

    def compute_dtype(self, dtype: str) -> str:
        """The precision the backend computes ``dtype`` inputs in (their own, unless it says otherwise)."""
        return dtype

    def checks_kv(self, call: Call) -> bool:
        """Whether run() checks q, k and v for NaN/Inf as it reads them (a pending call, Call.kv_pending: it raises
        request.Unchecked where it met a value it cannot vouch for); else they are checked before run()."""
        return False

    def estimate(self, r: Request) -> float:
        raise NotImplementedError

    def run(self, call: Call) -> tuple[Any, Any, Any]:
        raise NotImplementedError


TORCH_IMPORT_S = 1.5  # about what importing torch costs a NumPy-only session: the prior weighs it in
PRIOR_READ_BYTES_PER_S = 20e9  # where nothing was measured: bytes of keys and values a call reads per second


def read_seconds(r: Request, item: int, per_query_head: bool) -> float:
    """A prior's floor: the time to read the keys and values once, ``item`` bytes per element, once per k/v head
    (the kernel's decode pass) or once per query head (the torch and NumPy paths, which repeat grouped keys and
    compute in float32 or float64). A call with few query rows (a decoding step) is this read, whatever its
    scores cost: without it the per-score priors rank SDPA or the Python loop first for a long cache, 4 to 10
    times slower than the decode pass."""
    p = r.problem
    heads = int(np.prod(p.batch, dtype=np.int64)) // (1 if per_query_head else p.groups)
    return heads * p.tk * (p.d + p.dv) * item * r.visible / PRIOR_READ_BYTES_PER_S


def torch_refusals(r: Request) -> list[str]:
    """Why a torch-based backend cannot run here: torch is not installed."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return ["needs torch (pip install 'attnlab[torch]')"]
    return []


def torch_overhead(r: Request) -> float:
    """Seconds a torch backend pays before any math: importing torch, if not yet done."""
    return TORCH_IMPORT_S if "torch" not in sys.modules else 0.0


def as_torch(x: Any) -> Any:
    """A NumPy array as a tensor sharing its memory; tensors and None pass through."""
    if x is None or validate.is_torch(x):
        return x
    import torch

    return torch.from_numpy(np.ascontiguousarray(x))


def like_input(x: Any, call: Call) -> Any:
    """A result tensor in the array library, dtype (and device) of the call's inputs."""
    if x is None or call.request.library == "torch":
        return x
    return x.detach().numpy().astype(call.problem.dtype, copy=False)
