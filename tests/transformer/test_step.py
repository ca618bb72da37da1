"""The lean decoding step (attnlab.transformer.step) computes what the model's forward computes: the same tokens,
logits and maps (each step's attention rows), bit for bit, as a generation whose steps are watched (a hook that
changes nothing sends every step through the forward), for greedy and sampled decoding, GQA, QK-norm, learned
positions, dense, window, sink and quantized caches, a 16-bit cache and ragged batches; it stands aside where it
does not apply, and refuses a non-finite key or value as the cache does."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [5, 17, 3, 42, 8, 23, 11, 2, 30]
RAGGED = [[5, 17, 3], [42, 8, 23, 11, 2, 30, 9]]
WATCH = [("blocks.0.hook_resid_pre", lambda x, name: None)]  # a hook that changes nothing: the general path


def _model(decoder_folder, family, backend="auto", dtype="float32"):
    from attnlab.transformer import Transformer

    return Transformer.from_pretrained(decoder_folder(family), backend=backend, dtype=dtype)


@pytest.fixture
def lean_calls(monkeypatch):
    """How many steps the lean path served (a list holding one count)."""
    from attnlab.transformer import step

    calls = [0]
    run = step.LeanStep.__call__

    def counted(self, ids):
        calls[0] += 1
        return run(self, ids)

    monkeypatch.setattr(step.LeanStep, "__call__", counted)
    return calls


def _same(m, prompts, new, lean_calls, **kw):
    import torch

    lean = m.generate(prompts, new, stop_at_eos=False, **kw)
    served = lean_calls[0]
    watched = m.generate(prompts, new, stop_at_eos=False, fwd_hooks=WATCH, **kw)
    assert lean_calls[0] == served  # the watched run took the model's forward at every step
    assert torch.equal(lean.ids, watched.ids) and lean.sequences == watched.sequences
    assert torch.equal(lean.logits, watched.logits)
    assert torch.equal(lean.kv_cache.lengths, watched.kv_cache.lengths)
    assert (lean.attention is None) == (watched.attention is None) and lean.positions == watched.positions
    for ours, theirs in zip(lean.attention or (), watched.attention or ()):  # each sequence's rows, step by step
        assert len(ours) == len(theirs) and all(a.tobytes() == b.tobytes() for a, b in zip(ours, theirs))
    return served


@pytest.mark.parametrize("family, backend, prompts, kw", [
    ("llama", "auto", [PROMPT], {}),  # GQA, rotary
    ("llama", "kernel", [PROMPT], {}),
    ("llama", "sdpa", [PROMPT], {"sample": True, "seed": 3, "temperature": 0.8, "top_k": 20}),
    ("llama", "auto", RAGGED, {}),  # each sequence its own length: the cache's lengths in every read
    ("llama", "auto", [PROMPT, PROMPT[::-1]], {"sample": True, "seed": 1, "top_p": 0.9}),
    ("llama", "auto", [PROMPT], {"cache": "sink", "window": 6, "sink": 2}),
    ("llama", "auto", [PROMPT], {"cache_dtype": "int8"}),
    ("llama", "auto", [PROMPT], {"cache_dtype": "bfloat16"}),
    ("llama", "auto", [PROMPT], {"maps": True}),  # each step's attention rows, kept as the forward keeps them
    ("llama", "auto", RAGGED, {"maps": True, "cache": "sink", "window": 6, "sink": 2}),  # rows by position
    ("llama", "auto", [PROMPT], {"maps": True, "cache_dtype": "int8"}),
    ("llama", "auto", [PROMPT], {"cache": "h2o", "cache_budget": 8}),  # ranked by each step's weights, cut
    ("llama", "auto", RAGGED, {"cache": "h2o", "cache_budget": 6, "maps": True}),
    ("llama", "auto", [PROMPT], {"cache": "snapkv", "cache_budget": 8}),
    ("llama", "auto", [PROMPT, PROMPT[::-1]], {"cache": "knorm", "cache_budget": 7}),
    ("llama", "auto", [PROMPT], {"cache": "random", "cache_budget": 8}),
    ("llama3", "auto", [PROMPT], {}),  # Llama-3.1's rotary scaling
    ("mistral", "auto", [PROMPT], {"cache": "window"}),  # a ring of the window
    ("mistral", "auto", RAGGED, {}),  # a dense cache read through each layer's window
    ("qwen2", "torch", [PROMPT], {}),
    ("qwen3", "auto", [PROMPT], {"sample": True, "seed": 5}),  # QK-norm
    ("gpt2", "auto", RAGGED, {}),  # learned positions, LayerNorm, biases, a GELU MLP
    ("gpt2", "auto", [PROMPT, PROMPT[::-1]], {}),
])
def test_lean_steps_equal_the_forward_bit_for_bit(decoder_folder, lean_calls, family, backend, prompts, kw):
    m = _model(decoder_folder, family, backend)
    assert _same(m, prompts, 24, lean_calls, **kw) == 23  # every step after the prompt's


def test_the_bundled_decoder_past_several_length_buckets(lean_calls):
    from attnlab.transformer import DEFAULT_DECODER, Transformer

    m = Transformer.from_pretrained(DEFAULT_DECODER)
    assert _same(m, [list(range(1, 17))], 100, lean_calls) == 99  # keys 17..115: buckets 32, 64 and 128


def test_a_stopped_sequence_sends_the_steps_to_the_forward(decoder_folder, lean_calls):
    m = _model(decoder_folder, "llama")
    free = m.generate([PROMPT, PROMPT[::-1]], 12, stop_at_eos=False)
    stop = int(free.ids[0, 3])  # the first sequence's fourth token
    lean_calls[0] = 0
    served = _same(m, [PROMPT, PROMPT[::-1]], 12, lean_calls, stop_ids=[stop])
    first = [int(t) for t in free.ids[0]].index(stop)  # where the first sequence stops
    assert served == first  # the steps before it; after it, the forward writes for the live sequence only


@pytest.mark.parametrize("family, kw", [("gemma2", {}), ("gpt_oss", {}), ("deepseek_v3", {})])
def test_where_it_does_not_apply_the_forward_serves(decoder_folder, lean_calls, family, kw):
    m = _model(decoder_folder, family)
    m.generate([PROMPT], 6, stop_at_eos=False, **kw)
    assert lean_calls[0] == 0


def test_float64_models_keep_the_forward(decoder_folder, lean_calls):
    m = _model(decoder_folder, "llama", dtype="float64")
    m.generate([PROMPT], 6, stop_at_eos=False)
    assert lean_calls[0] == 0


def test_a_non_finite_value_is_refused_as_the_cache_refuses_it(decoder_folder):
    import torch

    from attnlab.backends.reads import Reads
    from attnlab.transformer.cache import KVCache
    from attnlab.transformer.hooks import Hooks
    from attnlab.transformer.step import plan

    m = _model(decoder_folder, "llama")
    with torch.no_grad():
        m.tok_emb.weight[7] = float("nan")  # a token the prompt does not hold
        kv = KVCache.for_model(m.config, 1, capacity=32)
        m(torch.tensor([PROMPT]), kv_cache=kv)
        lean = plan(m, kv, Hooks(), False, Reads(m.backend), 32)
        assert lean is not None and lean.serves(torch.tensor([[7]]), None)
        with pytest.raises(ValueError, match=r"k for layer 0 must be finite"):
            lean(torch.tensor([[7]]))


def test_continuing_from_a_cache_passed_back_in(decoder_folder, lean_calls):
    import torch

    m = _model(decoder_folder, "llama")
    runs = []
    for hooks in ({}, {"fwd_hooks": WATCH}):
        first = m.generate([PROMPT], 10, stop_at_eos=False, **hooks)
        again = m.generate(first.ids[:, -1:], 10, stop_at_eos=False, kv_cache=first.kv_cache, **hooks)
        runs.append(torch.cat((first.logits, again.logits), dim=1))
    assert lean_calls[0] == 9 + 9  # the second call's first step is its prompt's (one token, through the forward)
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("backend, cache_dtype, rotate", [
    ("kernel", None, False), ("kernel", "bfloat16", False), ("auto", None, False), ("sdpa", None, False),
    ("kernel", "int8", False)])
def test_a_generations_reads_equal_the_models_forward_over_the_same_cache(decoder_folder, backend, cache_dtype,
                                                                          rotate, monkeypatch):
    """generate() reads its cache by Reads (the kernel's decode pass or SDPA called directly; a quantized cache's
    codes by kernel.decode); a manual greedy loop through the model's forward with kv_cache= reads it by
    attention_read or attention(): the same logits, bit for bit, across the length buckets 16, 32 and 64 (the
    prompt's row: generate's logits of its last row alone, the loop's of every row, so a different matrix
    product's rounding)."""
    import torch

    from attnlab.backends import reads
    from attnlab.transformer.cache import KVCache

    direct = []
    for kind in (reads._KernelRead, reads._SdpaRead, reads._QuantizedRead):
        monkeypatch.setattr(kind, "__call__", lambda self, *a, run=kind.__call__: direct.append(self) or run(self, *a))
    m = _model(decoder_folder, "llama", backend=backend)
    g = m.generate([PROMPT], 40, stop_at_eos=False, cache_dtype=cache_dtype, rotate=rotate)
    stored = cache_dtype if cache_dtype in ("int8", "int4", "fp8") else getattr(torch, cache_dtype or "float32")
    kv = KVCache.for_model(m.config, 1, capacity=64, dtype=stored, rotate=rotate)
    ids, rows = torch.tensor([PROMPT]), []
    with torch.no_grad():
        for _ in range(40):
            rows.append(m.run_with_hooks(ids, kv_cache=kv)[:, -1])
            ids = rows[-1].argmax(-1, keepdim=True)
    kinds = {type(d).__name__ for d in direct}  # two layers, most steps called directly
    assert len(direct) > 2 * 30 and (backend == "auto" and cache_dtype is None or kinds == {
        "_QuantizedRead" if rotate or cache_dtype in ("int8", "int4") else "_KernelRead" if backend == "kernel"
        else "_SdpaRead"})
    loop = torch.stack(rows, dim=1)
    assert torch.equal(g.logits[:, 1:], loop[:, 1:]) and torch.allclose(g.logits[:, 0], loop[:, 0], atol=1e-5)


@pytest.mark.needs("kernel")
@pytest.mark.parametrize("cache_dtype, rotate", [("int8", False), ("int4", False), ("fp8", True), ("int4", True)])
def test_a_quantized_caches_direct_reads_equal_its_reads_through_attention(cache_dtype, rotate, monkeypatch):
    """The bundled decoder (head width 32: int4's group) with a quantized cache: the steps that Reads serves by
    kernel.decode directly give the logits of the same generation with every read through attention()."""
    import torch

    from attnlab.backends import reads
    from attnlab.transformer import Transformer

    m = Transformer.from_pretrained("attnlab:decoder", backend="kernel")
    direct = []
    monkeypatch.setattr(reads._QuantizedRead, "__call__",
                        lambda self, *a, run=reads._QuantizedRead.__call__: direct.append(self) or run(self, *a))
    g = m.generate([PROMPT], 40, stop_at_eos=False, cache_dtype=cache_dtype, rotate=rotate)
    assert len(direct) > m.config.num_layers * 30
    monkeypatch.setattr(reads, "_direct", lambda name, call: None)  # nothing kept: attention() at every step
    w = m.generate([PROMPT], 40, stop_at_eos=False, cache_dtype=cache_dtype, rotate=rotate)
    assert torch.equal(g.ids, w.ids) and torch.equal(g.logits, w.logits)
