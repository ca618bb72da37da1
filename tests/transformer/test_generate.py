"""generate(): cached decoding is exact (float64: 256 steps equal a recompute of the whole sequence within
1e-12, per architecture and cache kind), equals transformers' greedy generate, serves ragged batches, keeps
each step's attention row, and refuses bad input by name before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [5, 17, 3, 42, 8, 23, 11, 2, 30]
# (family, cache): the window cache where the family has windows (Gemma-2's global layers stay dense)
EXACT = [("gpt2", "dense"), ("llama", "dense"), ("llama3", "dense"), ("mistral", "window"), ("mistral", "dense"),
         ("qwen2", "window"), ("gemma2", "window"), ("gemma2", "dense"), ("qwen3", "dense"), ("gemma3", "window"),
         ("gemma3", "dense"), ("gpt_oss", "window"), ("gpt_oss", "dense")]
WINDOWED = ("mistral", "gemma2", "gemma3", "gpt_oss")


def _model(decoder_folder, family, dtype="float64", backend="torch"):
    from attnlab.transformer import Transformer

    return Transformer.from_pretrained(decoder_folder(family), dtype=dtype, backend=backend)


def _theirs64(decoder_folder, family):
    """transformers' model of the family in float64, eager attention (gpt-oss's experts: its eager loop too,
    since its grouped matmul refuses float64)."""
    import torch
    from transformers import AutoModelForCausalLM

    experts = {"experts_implementation": "eager"} if family == "gpt_oss" else {}
    return AutoModelForCausalLM.from_pretrained(decoder_folder(family), dtype=torch.float64,
                                                attn_implementation="eager", **experts).eval()


def _full_logits(m, seq, fwd_hooks=()):
    """Logits at every position of ``seq``, recomputed without a cache (one pass: causal, so row p is step p's)."""
    import torch

    with torch.no_grad():
        return m.run_with_hooks(torch.tensor([seq]), fwd_hooks=list(fwd_hooks))[0]  # (T, V)


@pytest.mark.parametrize("family, cache", EXACT)
def test_256_cached_steps_equal_recomputing_the_sequence(decoder_folder, family, cache):
    import torch

    m = _model(decoder_folder, family)
    g = m.generate([PROMPT], 256, cache=cache)
    assert g.ids.shape == (1, 256) and g.logits.dtype == torch.float64
    P, seq = len(PROMPT), g.sequences[0]
    full = _full_logits(m, seq)  # (P + 256, V)
    assert float((g.logits[0] - full[P - 1: P + 255]).abs().max()) < 1e-12
    for t in (0, 1, 97, 255):  # and a recompute of just the prefix, at some steps
        assert float((g.logits[0, t] - _full_logits(m, seq[: P + t])[-1]).abs().max()) < 1e-12
    assert torch.equal(g.ids[0], g.logits[0].argmax(-1))  # greedy: each token is its logits' first largest


@pytest.mark.parametrize("family, cache", [("llama", "dense"), ("mistral", "window"), ("gemma2", "window"),
                                           ("qwen3", "dense"), ("gemma3", "window"), ("gpt_oss", "window")])
def test_float32_cached_error_at_most_twice_the_uncached(decoder_folder, family, cache):
    m32, m64 = _model(decoder_folder, family, "float32"), _model(decoder_folder, family, "float64")
    g = m32.generate([PROMPT], 128, cache=cache)
    P, seq = len(PROMPT), g.sequences[0]
    exact = _full_logits(m64, seq)[P - 1: P + 127]  # the same tokens, float64
    cached = float((g.logits[0].double() - exact).abs().max())
    uncached = float((_full_logits(m32, seq)[P - 1: P + 127].double() - exact).abs().max())
    assert 0 < uncached and cached <= 2 * uncached


@pytest.mark.parametrize("family", ["gpt2", "llama", "llama3", "mistral", "qwen2", "gemma2", "qwen3", "gemma3",
                                    "gpt_oss"])
def test_greedy_ids_equal_transformers_generate(decoder_folder, family):
    import torch

    theirs = _theirs64(decoder_folder, family)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        ref = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(PROMPT):]
    ours = _model(decoder_folder, family).generate(ids, 64, cache="window" if family in WINDOWED else "dense")
    assert ours.ids[0].tolist() == ref.tolist()


@pytest.mark.parametrize("family, cache", [("gpt2", "dense"), ("mistral", "window"), ("gemma2", "window")])
def test_a_ragged_batch_equals_each_prompt_alone(decoder_folder, family, cache):
    import torch

    m = _model(decoder_folder, family)
    prompts = [PROMPT, PROMPT[:3], [7] + PROMPT]
    batch = m.generate(prompts, 24, cache=cache, maps=True)
    for b, p in enumerate(prompts):
        alone = m.generate([p], 24, cache=cache, maps=True)
        assert torch.equal(batch.ids[b], alone.ids[0])
        assert float((batch.logits[b] - alone.logits[0]).abs().max()) < 1e-12
        assert max(float(np.abs(x - y).max()) for x, y in zip(batch.attention[b], alone.attention[0])) < 1e-12
    # the same batch as a padded [B, T] tensor with its attention_mask (right padding)
    width = max(map(len, prompts))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    padded = m.generate(ids, 24, attention_mask=ids.ne(0) | (torch.arange(width) < 1), cache=cache)
    assert torch.equal(padded.ids, batch.ids)


@pytest.mark.parametrize("family, cache", [("gpt2", "dense"), ("qwen2", "window"), ("gemma2", "window"),
                                           ("mistral", "window"), ("qwen3", "dense"), ("gemma3", "window"),
                                           ("gpt_oss", "window")])
def test_maps_rows_are_rows_of_the_full_map(decoder_folder, family, cache):
    """Step t's row is row P − 1 + t of the whole sequence's map: attnlab's own (float64, 1e-12) and
    transformers' eager output_attentions (1e-5: its norms and rotary run in float32)."""
    import torch

    m = _model(decoder_folder, family)
    n, P = 20, len(PROMPT)
    g = m.generate([PROMPT], n, cache=cache, maps=True)
    seq = torch.tensor([g.sequences[0]])
    with torch.no_grad():
        _, cache_ = m.run_with_cache(seq, names=lambda name: name.endswith("hook_pattern"))
        ref = _theirs64(decoder_folder, family)(input_ids=seq, output_attentions=True).attentions
    ours = np.stack([cache_[f"blocks.{layer}.attn.hook_pattern"][0].numpy() for layer in range(2)])  # (L, H, T, T)
    hf = np.stack([a[0].numpy() for a in ref])
    assert g.positions[0] == list(range(P - 1, P - 1 + n))
    for t, row in enumerate(g.attention[0]):
        assert row.shape == (2, 4, P + t)
        np.testing.assert_allclose(row, ours[:, :, P - 1 + t, : P + t], atol=1e-12, rtol=0)
        np.testing.assert_allclose(row, hf[:, :, P - 1 + t, : P + t], atol=1e-5, rtol=0)
    for layer in range(2):  # a sliding layer's last row: zeros where its ring dropped a key, none elsewhere
        dropped = g.attention[0][-1][layer, :, : P + n - 1 - 6]
        assert (dropped == 0).all() == (m.config.layer_window(layer) is not None)


def _keep_only(sink, window):
    """A hook on every layer's scores that keeps keys 0..sink−1 and the last ``window``: the full recompute."""
    import math

    import torch

    def hook(scores, name):
        T = scores.shape[-1]
        q, k = torch.arange(T)[:, None], torch.arange(T)[None]
        seen = (k < sink) | (k > q - window)
        return scores.masked_fill(~seen, -math.inf)

    return [(f"blocks.{layer}.attn.hook_attn_scores", hook) for layer in range(2)]


@pytest.mark.parametrize("cache, window, sink", [("sink", 5, 2), ("window", 5, None), ("sink", 4, 4)])
def test_sink_and_window_caches_equal_a_masked_recompute(decoder_folder, cache, window, sink):
    """Positions are the original sequence's: StreamingLLM's pattern computed in full, keys 0..S−1 and the last W."""
    import torch

    m = _model(decoder_folder, "llama")
    g = m.generate([PROMPT], 60, cache=cache, window=window, sink=sink, maps=True)
    P = len(PROMPT)
    full = _full_logits(m, g.sequences[0], _keep_only(sink or 0, window))
    assert float((g.logits[0] - full[P - 1: P + 59]).abs().max()) < 1e-12
    with torch.no_grad():  # each step's row, its slots put back at their positions, is the masked map's row
        _, maps = m.run_with_cache(torch.tensor([g.sequences[0]]), names=lambda n: n.endswith("hook_pattern"),
                                   fwd_hooks=_keep_only(sink or 0, window))
    full_map = np.stack([maps[f"blocks.{layer}.attn.hook_pattern"][0].numpy() for layer in range(2)])
    for t, row in enumerate(g.attention[0]):
        np.testing.assert_allclose(row, full_map[:, :, P - 1 + t, : P + t], atol=1e-12, rtol=0)
    assert g.kv_cache.nbytes == 2 * 2 * 2 * 8 * ((sink or 0) + window) * 8  # k and v · L · H_kv · D · slots · 8 bytes


def test_the_generation_cache_is_exact_in_size(decoder_folder):
    import torch

    m = _model(decoder_folder, "llama", "float32")
    g = m.generate([PROMPT, PROMPT[:4]], 10)
    T = len(PROMPT) + 10 - 1  # every position that is fed: the last new token never is
    assert g.kv_cache.nbytes == 2 * 2 * 2 * 8 * T * 4 * 2  # 2 · L · H_kv · D · T · bytes, for a batch of 2
    half = m.generate([PROMPT, PROMPT[:4]], 10, cache_dtype=torch.bfloat16)
    assert half.to_dict()["kv_cache"]["dtype"] == "bfloat16" and half.kv_cache.nbytes == g.kv_cache.nbytes // 2
    assert float((half.logits[:, 0] - g.logits[:, 0]).abs().max()) < 0.1  # the prompt's keys and values rounded


def test_hooks_run_at_every_step(decoder_folder):
    """fwd_hooks in generate act on every step as on the whole sequence (a head knocked out)."""
    def knock(z, name):
        z = z.clone()
        z[:, 1] = 0
        return z

    m = _model(decoder_folder, "gemma2")
    hooks = [("blocks.0.attn.hook_z", knock)]
    g = m.generate([PROMPT], 30, cache="window", fwd_hooks=hooks)
    P = len(PROMPT)
    assert float((g.logits[0] - _full_logits(m, g.sequences[0], hooks)[P - 1: P + 29]).abs().max()) < 1e-12
    assert g.ids[0].tolist() != m.generate([PROMPT], 30, cache="window").ids[0].tolist()


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2"])
def test_greedy_decoding_with_a_head_knocked_out_is_recomputing_with_it(decoder_folder, family):
    """knockout's hooks in generate: each greedy token is the argmax of the whole sequence so far, recomputed
    without a cache under the same hooks (the cache holds the knocked-out run's keys and values)."""
    import torch

    from attnlab.interventions.ablation import knockout

    m = _model(decoder_folder, family)
    keep = torch.ones(m.config.num_layers, m.config.num_heads)
    keep[0, 1] = 0.0
    hooks = knockout(m.config, keep)
    g = m.generate([PROMPT], 16, fwd_hooks=hooks)
    seq = list(PROMPT)
    for t in range(16):
        seq.append(int(_full_logits(m, seq, hooks)[-1].argmax()))
        assert seq[-1] == int(g.ids[0, t])
    assert g.ids[0].tolist() != m.generate([PROMPT], 16).ids[0].tolist()  # the knockout changed the text


def test_a_watched_pattern_reads_the_cache_in_the_model(decoder_folder):
    """With hook_pattern watched the model computes the scores itself, over the cache's slots: same logits."""
    seen = []
    hooks = [(f"blocks.{layer}.attn.hook_pattern", lambda w, name: seen.append((name, tuple(w.shape))))
             for layer in range(2)]
    m = _model(decoder_folder, "gemma2")
    g = m.generate([PROMPT], 12, cache="window", fwd_hooks=hooks)
    assert float((g.logits - m.generate([PROMPT], 12, cache="window").logits).abs().max()) < 1e-12
    assert seen[0] == ("blocks.0.attn.hook_pattern", (1, 4, len(PROMPT), len(PROMPT)))  # the prompt, in one call
    assert seen[-2:] == [("blocks.0.attn.hook_pattern", (1, 4, 1, 6)),  # a sliding layer reads its ring of 6
                         ("blocks.1.attn.hook_pattern", (1, 4, 1, len(PROMPT) + 11))]  # a global one, every key


# every backend, the kernel too: the cache's reads need no dense mask (causal with lengths is each sequence's own)
@pytest.mark.parametrize("backend", ["torch", "sdpa", "blockwise", "numpy", "auto", "kernel"])
def test_every_backend_that_serves_decoding_agrees(decoder_folder, backend):
    import torch

    m = _model(decoder_folder, "mistral", "float32", backend=backend)
    g = m.generate([PROMPT, PROMPT[:5]], 16, cache="window")
    ref = _model(decoder_folder, "mistral", "float32").generate([PROMPT, PROMPT[:5]], 16, cache="window")
    assert torch.equal(g.ids, ref.ids)
    assert float((g.logits - ref.logits).abs().max()) < 1e-4


def test_stop_ids_on_token_and_text(decoder_folder):
    import torch

    m = _model(decoder_folder, "gpt2", "float32")
    free = m.generate("the bank of the river", 12)
    stop = int(free.ids[0, 3])
    first = free.ids[0].tolist().index(stop)
    seen = []
    g = m.generate(["the bank of the river", "money"], 12, stop_ids=[stop], on_token=lambda t, ids: seen.append((t, ids.tolist())))
    assert g.ids[0, : first + 1].tolist() == free.ids[0, : first + 1].tolist()
    assert int(g.lengths[0]) == first + 1 and (g.ids[0, first + 1:] == g.pad_id).all()
    assert (g.logits[0, first + 1:] == 0).all()
    prompt0 = len(m.tokenizer("the bank of the river")["input_ids"])
    assert int(g.kv_cache.lengths[0]) == prompt0 + first  # after its stop id a sequence writes nothing more
    assert [t for t, _ in seen] == list(range(g.ids.shape[1])) and all(len(ids) == 2 for _, ids in seen)
    assert isinstance(g.text, list) and g.text[0] == m.tokenizer.decode(free.ids[0, : first + 1], skip_special_tokens=True)
    assert g.sequences[0][-int(g.lengths[0]):] == g.ids[0, : first + 1].tolist()
    json.dumps(g.to_dict())
    assert torch.equal(m.generate("money", 5).ids, g.ids[1:, :5]) or int(g.lengths[1]) < 5


def test_a_cache_passed_back_in_continues_the_sequence(decoder_folder):
    """Generation.kv_cache holds every position fed; continuing from it equals generating from the whole text."""
    import torch

    m = _model(decoder_folder, "mistral")
    first = m.generate([PROMPT], 10, cache="window")
    more = [int(first.ids[0, -1]), 4, 9]  # the cache lacks only the last token chosen
    second = m.generate([more], 12, cache="window", kv_cache=first.kv_cache, maps=True)
    whole = m.generate([PROMPT + first.ids[0, :-1].tolist() + more], 12, cache="window", maps=True)
    assert torch.equal(second.ids, whole.ids) and second.positions == whole.positions
    assert float((second.logits - whole.logits).abs().max()) < 1e-12
    assert max(float(np.abs(x - y).max()) for x, y in zip(second.attention[0], whole.attention[0])) < 1e-12
    with pytest.raises(ValueError, match=r"kv_cache holds layers \[\('window', 6, None\)"):
        m.generate([more], 2, kv_cache=first.kv_cache)  # cache="dense" asks for dense layers
    with pytest.raises(ValueError, match="for a batch of 1"):
        m.generate([more, more], 2, cache="window", kv_cache=first.kv_cache)
    with pytest.raises(TypeError, match="kv_cache must be a KVCache"):
        m.generate([more], 2, kv_cache=first.to_dict()["kv_cache"])


def test_sampling_is_reproducible_with_a_seed(decoder_folder):
    import torch

    m = _model(decoder_folder, "llama", "float32")
    a = m.generate([PROMPT], 20, sample=True, temperature=1.5, top_k=20, top_p=0.9, seed=7)
    b = m.generate([PROMPT], 20, sample=True, temperature=1.5, top_k=20, top_p=0.9, seed=7)
    c = m.generate([PROMPT], 20, sample=True, temperature=1.5, top_k=20, top_p=0.9, seed=8)
    assert torch.equal(a.ids, b.ids) and not torch.equal(a.ids, c.ids)
    for t in range(20):  # every token drawn lies within the top 20 of its logits
        assert int(a.ids[0, t]) in a.logits[0, t].topk(20).indices.tolist()


def test_prefill_and_decode_through_one_forward(decoder_folder):
    """m(new ids, kv_cache=cache): the same hidden states whether the tokens come in one call or one by one."""
    import torch

    from attnlab.transformer.cache import KVCache

    m = _model(decoder_folder, "qwen2")
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        whole = m(ids)
        kv = KVCache.for_model(m.config, 1, kind="window", dtype=torch.float64)
        parts = [m(ids[:, :4], kv_cache=kv)] + [m(ids[:, i:i + 1], kv_cache=kv) for i in range(4, len(PROMPT))]
    assert float((torch.cat(parts, 1) - whole).abs().max()) < 1e-12
    assert kv.lengths.tolist() == [len(PROMPT)] and kv.kinds == ("dense", "window")


@pytest.mark.parametrize("call, match", [
    (lambda m: m.generate([PROMPT], 400), "passes the model's 320 learned positions; no cache goes past them"),
    (lambda m: m.generate([PROMPT], 2, sample=True, temperature=0), r"temperature must be a finite number in \(0, 100\], got 0"),
    (lambda m: m.generate([PROMPT], 2, sample=True, top_p=1.2), "top_p must lie in"),
    (lambda m: m.generate([PROMPT], 2, sample=True, top_k=0), "top_k must be an int >= 1"),
    (lambda m: m.generate([[]], 2), "input_ids: prompt 0 is empty"),
    (lambda m: m.generate([PROMPT, []], 2), "input_ids: prompt 1 is empty"),
    (lambda m: m.generate([PROMPT], 0), "max_new_tokens must be an int >= 1"),
    (lambda m: m.generate([PROMPT], 2, cache="paged"), "cache must be one of"),
    (lambda m: m.generate([PROMPT], 2, cache="window"), "no sliding-window layers"),
    (lambda m: m.generate([[999]], 2), "outside 0..299"),
    (lambda m: m.generate([PROMPT], 2, stop_ids=[-1]), "stop_ids must be token ids"),
    (lambda m: m.generate([PROMPT], 2, cache_dtype="int3"), "cache_dtype must be one of"),
    (lambda m: m.generate([PROMPT], 2, fwd_hooks=[("blocks.9.hook_z", lambda x, n: x)]), "not a hook point"),
])
def test_bad_input_is_named_before_any_work(decoder_folder, call, match):
    m = _model(decoder_folder, "gpt2", "float32")
    with pytest.raises((ValueError, TypeError), match=match):
        call(m)


def test_a_dense_cache_past_the_positions_says_which_cache_allows_it(decoder_folder):
    import torch

    from attnlab.transformer import Transformer, TransformerConfig
    from attnlab.transformer.cache import KVCache

    m = _model(decoder_folder, "llama", "float32")
    with pytest.raises(ValueError, match=r"max_new_tokens=400: .* with a dense cache; cache='sink'"):
        m.generate([PROMPT], 400)
    assert m.generate([PROMPT], 400, cache="sink", window=8).ids.shape == (1, 400)  # memory constant, past 320
    with pytest.raises(ValueError, match="kv_cache holds 2 layers x 2 k/v heads x head dim 8 for a batch of 2"):
        m(torch.tensor([PROMPT]), kv_cache=KVCache.for_model(m.config, 2))
    with pytest.raises(TypeError, match="kv_cache must be a KVCache"):
        m(torch.tensor([PROMPT]), kv_cache={})
    encoder = Transformer(TransformerConfig(vocab_size=10, d_model=16, num_layers=1, num_heads=2, causal=False))
    with pytest.raises(ValueError, match="generate needs a causal decoder"):
        encoder.generate([[1, 2]], 2)


def test_decoding_checks_the_cache_once_when_appended_and_a_plain_call_checks_everything(decoder_folder, monkeypatch):
    """Entries are checked when the cache appends them; each step's attention call then checks q alone (by
    the norm its score bound needs: a NaN in q is still refused, naming q), never the whole cache again, while
    a plain attnlab.attention call checks q, k and v."""
    import torch

    import attnlab
    from attnlab.reference import validate

    scanned = []
    check = validate.check_finite

    def spy(name, x):
        scanned.append((name, tuple(x.shape)))
        return check(name, x)

    m = _model(decoder_folder, "llama", "float32")
    free = m.generate([PROMPT, PROMPT[:5]], 6)
    monkeypatch.setattr(validate, "check_finite", spy)
    g = m.generate([PROMPT, PROMPT[:5]], 6)
    assert torch.equal(g.ids, free.ids)
    assert {name for name, _ in scanned} <= {"q"}

    def nan_q(q, name):
        return torch.where(torch.arange(q.shape[-1]) == 3, float("nan"), q)

    with pytest.raises(ValueError, match="q contains NaN or Inf"):
        m.generate([PROMPT], 3, fwd_hooks=[("blocks.1.attn.hook_rot_q", nan_q)])
    scanned.clear()
    x = torch.ones(1, 2, 3, 4)
    attnlab.attention(x, x, x, causal=True, backend="torch")
    assert [name for name, _ in scanned] == ["q", "k", "v"]  # (the kernel's decode pass checks k, v as it reads them)


@pytest.mark.parametrize("family, cache", [("llama", "dense"), ("mistral", "dense"), ("mistral", "window"),
                                           ("qwen3", "dense"), ("gemma3", "window"), ("gpt_oss", "window")])
@pytest.mark.needs("kernel")
def test_the_compiled_decode_pass_generates_what_torch_does(decoder_folder, family, cache, monkeypatch):
    """backend="kernel": each one-token step (GQA, the cache's lengths, a band; gpt-oss's learned sinks) goes
    through the compiled decode pass."""
    from attnlab.backends import kernel

    steps = []
    real = kernel._tiles.decode  # the compiled pass, however the call reached it
    monkeypatch.setattr(kernel._tiles, "decode", lambda *a, **kw: steps.append(a[1].shape) or real(*a, **kw))
    g = _model(decoder_folder, family, "float32", "kernel").generate([PROMPT, PROMPT[:4]], 40, cache=cache)
    want = _model(decoder_folder, family, "float32", "torch").generate([PROMPT, PROMPT[:4]], 40, cache=cache)
    assert float((g.logits - want.logits).abs().max()) < 1e-4
    assert len(steps) >= 2 * 39  # two layers, every decoded step of the ragged batch (and the prompt: 9 rows)


def test_generate_leaves_each_steps_backend_to_auto(decoder_folder, monkeypatch):
    """Not told a backend, every attention call of generate() is auto's (which measures decoding on this machine)."""
    from attnlab.backends import reads
    from attnlab.transformer import Transformer, attend

    asked = []
    for module in (attend, reads):  # the prompt's calls, and each step's read (its choice kept per length bucket)
        real, read = module.attention, module.attention_read
        monkeypatch.setattr(module, "attention", lambda *a, real=real, **kw: asked.append(kw["backend"]) or real(*a, **kw))
        monkeypatch.setattr(module, "attention_read",
                            lambda q, k, v, o, backend, read=read: asked.append(backend) or read(q, k, v, o, backend))
    choose = reads.choose
    monkeypatch.setattr(reads, "choose", lambda request, backend: asked.append(backend) or choose(request, backend))
    Transformer.from_pretrained(decoder_folder("llama")).generate([PROMPT], 5)
    assert asked and set(asked) == {"auto"}
