"""``attention()``: the one public function in front of the backends (:mod:`attnlab.backends.dispatch`)."""

from __future__ import annotations

import textwrap
from typing import Any

from attnlab.backends.dispatch import choose
from attnlab.backends.options import HELP, Options, defaults
from attnlab.backends.request import Unchecked, checked, prepare, prepare_read


def attention(q: Any, k: Any, v: Any, *, backend: str = "auto", **options: Any) -> Any:
    """Scaled dot-product attention on NumPy arrays or torch tensors, by the backend that fits.

    Shapes: q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv), leading dims broadcast. k and v may
    have fewer heads (dim −3) than q, Hq = G·Hkv (grouped-query attention: query head h uses
    key/value head h // G). k and v share one dtype; q has it too, or q is float32 and k, v are
    float16 or bfloat16 (a 16-bit cache read by a float32 query). The result has q's kind, device
    and dtype (NumPy arrays: their promoted dtype).

    backend: "auto", "numpy", "torch", "sdpa", "blockwise" or "kernel" (:mod:`attnlab.backends.dispatch`
        says what each serves). "auto" takes, among the backends that fit, the fastest on this
        machine that computes in the input's precision (float32 accumulation for float16/bfloat16):
        its result's precision never changes with the size of the call.

    The options, keywords that :class:`attnlab.backends.options.Options` holds (its defaults: {defaults}):

    {options}

    A row with nothing to attend to gives zeros. Returns ``out``, or a tuple
    ``(out, weights)``, ``(out, lse)`` or ``(out, weights, lse)`` as asked.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    opts = Options.of(options)
    call = prepare(q, k, v, opts, defer_kv=True)  # k and v: checked by the pass that reads them where it can
    served = choose(call.request, backend)
    try:
        if call.kv_pending and not served.checks_kv(call):
            raise Unchecked
        out, weights, lse = served.run(call)
    except Unchecked:  # checked first, as without deferring: the error naming k or v, or the choice again
        call = checked(call)
        out, weights, lse = choose(call.request, backend).run(call)
    extra = ([weights] if opts.wants_weights else []) + ([lse] if opts.return_lse else [])
    return (out, *extra) if extra else out


def attention_read(q: Any, k: Any, v: Any, options: Options, backend: str = "auto") -> tuple:
    """attention() on a KV cache's read, as a decoding step makes it: ``options`` built once by the caller,
    the checks that the cache already made skipped (:func:`attnlab.backends.request.prepare_read`), the
    backend auto's choice for the call's length bucket or the one named (which refuses as in attention()).
    Internal to the transformer: returns (out, weights, lse), None where not asked."""
    return choose((call := prepare_read(q, k, v, options)).request, backend).run(call)


if attention.__doc__:  # None under python -OO
    attention.__doc__ = attention.__doc__.format(defaults=defaults(), options=textwrap.indent(HELP, "    ").lstrip())
