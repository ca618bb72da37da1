"""plan(): the time and memory model term by term against hand computations, the searches, bad input."""

from __future__ import annotations

import pytest

import attnlab
from attnlab.planner import Hardware, largest_length, plan
from attnlab.planner import formulas as f
from attnlab.planner.hardware import FITTED, Efficiencies, Rate, accelerator
from attnlab.planner.models import load_model

# round rates, so that every term can be computed by hand
TOY = Hardware("toy", Rate(1e12), Rate(1e11), Rate(5e11), Rate(5e10), Rate(2e11), 100e9, 1e-4, True, "test", link=1e10,
               allreduce_latency_s=1e-5)


def test_search_by_hand():
    s = largest_length(lambda n: n <= 1000, start=1)
    assert (s.n, s.first_failing, s.capped) == (1000, 1001, False)
    s = largest_length(lambda n: n <= 1000, start=64, grain=64)
    assert (s.n, s.first_failing) == (960, 1024)
    s = largest_length(lambda n: True, start=1, cap=300)
    assert (s.n, s.capped, s.tried[-1]) == (300, True, 300)
    s = largest_length(lambda n: n < 5, start=8)
    assert s.n == 4
    assert largest_length(lambda n: False, start=1).n == 0
    s = largest_length(lambda n: n <= 1000, start=512, steps=1, grain=64)
    assert (s.n, s.first_failing, s.tried) == (768, 1024, (512, 1024, 768))


def test_ttft_and_tpot_term_by_term():
    a = load_model("llama-3.1-8b")
    p = plan("llama-3.1-8b", TOY, prompt_tokens=1000, new_tokens=2, dtype="bfloat16")
    layer = sum(f.layer_matmul_params(a).values())
    compute = 32 * 2 * 1000 * layer / 1e12 + 2 * 4096 * 128256 / 1e12
    read = f.decode_weight_bytes(a, 2) / 1e11
    assert p.rows[0].term("prefill", "matmuls").seconds == pytest.approx(max(compute, read))
    assert p.rows[0].term("prefill", "attention").seconds == pytest.approx(f.attention_flops(a, 1000, 1) / 5e11)
    assert p.rows[0].term("prefill", "overhead").seconds == pytest.approx(32 * 1e-4)
    per_token = 12 * 4096 + 12 * (4096 + 1024) + 2 * (2 * 4096 + 2 * 1024) + 5 * 14336 + 6 * 4096
    assert p.rows[0].term("prefill", "elementwise").seconds == pytest.approx(32 * per_token * 1000 * 2 / 2e11)
    # one decode step (new_tokens = 2): reads every weight and the KV of 1,001 keys
    decode = read + f.kv_bytes(a, 1001, 1, 2) / 5e10 + 32 * 1e-4
    assert p.tpot_s == pytest.approx(decode)
    assert p.rows[0].term("decode", "weights").limited_by == "memory bandwidth"
    assert p.total_s == pytest.approx(p.ttft_s + p.tpot_s)


def test_memory_and_max_batch_by_hand():
    a = load_model("llama-3.1-8b")
    p = plan("llama-3.1-8b", TOY, prompt_tokens=8000, new_tokens=100, dtype="bfloat16", memory_gb=40)
    weights = f.weight_bytes(a, 2)
    kv_end = f.kv_bytes(a, 8100, 1, 2)
    acts = f.prefill_activation_bytes(a, 8000, 1, 2)
    peak = weights + max(f.kv_bytes(a, 8000, 1, 2) + max(acts["attention"], acts["feed_forward"]) + acts["logits"], kv_end)
    assert p.peak_bytes == pytest.approx(peak) and p.kv_bytes == kv_end and p.weight_bytes == weights
    # the most sequences whose caches (and prefill activations) fit beside the weights
    per_seq = f.kv_bytes(a, 8000, 1, 2) + acts["feed_forward"]
    assert p.max_batch == int((40e9 - weights - acts["logits"]) // (per_seq + acts["logits"]))


def test_max_prompt_tokens_is_the_largest_meeting_both():
    p = plan("llama-3.1-8b", "h100", prompt_tokens=[4000, 32000], new_tokens=64, deadline_ms=2000)
    n = p.max_prompt_tokens
    at = plan("llama-3.1-8b", "h100", prompt_tokens=[n, n + 1], new_tokens=64, deadline_ms=2000)
    assert at.rows[0].meets_deadline and not at.rows[1].meets_deadline
    assert p.predicted and "predicted for H100 SXM under vllm" in p.notes[0]
    ttft = plan("llama-3.1-8b", "h100", prompt_tokens=4000, new_tokens=64, deadline_ms=2000, deadline_on="ttft")
    assert ttft.max_prompt_tokens > n  # the first token alone meets the deadline at longer prompts


def test_memory_budget_alone_caps_at_the_positions():
    p = plan("gpt2", "h100", prompt_tokens=512, new_tokens=24)
    assert p.max_prompt_tokens == 1024 - 24 and p.search.capped


def test_tensor_parallel_splits_weights_and_adds_all_reduces():
    one = plan("llama-3.1-70b", "h100", prompt_tokens=8000, new_tokens=16)
    four = plan("llama-3.1-70b", "h100", prompt_tokens=8000, new_tokens=16, gpus=4)
    assert four.weight_bytes == pytest.approx(one.weight_bytes / 4)
    assert four.rows[0].term("decode", "all-reduce").limited_by == "interconnect"
    assert one.rows[0].term("decode", "all-reduce") is None
    assert not one.rows[0].fits_memory and four.rows[0].fits_memory


def test_efficiencies_are_fitted_per_engine_stated_and_overridable():
    vllm, ideal = accelerator("h100"), accelerator("h100", engine="ideal")
    assert vllm.efficiencies == {**vars(Efficiencies()), **FITTED["h100", "vllm"][0]}
    assert vllm.details["validation"] == list(FITTED["h100", "vllm"][1])
    assert ideal.efficiencies["bandwidth"] == 0.8 and ideal.details["validation"] is None
    assert accelerator("l4").details["validation"] is None  # no published rows: the assumptions
    slow = accelerator("h100", Efficiencies(bandwidth=0.4))
    assert slow.bandwidth.per_s == pytest.approx(ideal.bandwidth.per_s / 2) and slow.details["validation"] is None
    with pytest.raises(ValueError, match="engine must be one of vllm, trt-llm, ideal, got 'tgi'"):
        accelerator("h100", engine="tgi")


def test_a_fitted_accelerator_shows_its_validation_range():
    """Llama-3-8B on one H100 under vLLM, 128 + 128 tokens: 0.994 s in LLM-Inference-Bench (a fitted row)."""
    p = plan("llama-3.1-8b", "h100", prompt_tokens=128, new_tokens=128)
    low, high = FITTED["h100", "vllm"][1]
    assert 0.85 < p.total_s / 0.994 < 1.15
    assert p.rows[0].ranges["total_s"] == pytest.approx((p.total_s / high, p.total_s / low))
    assert "on rows of other models left out of the fit it gave" in p.notes[0]
    d = plan("llama-3.1-8b", "h100", prompt_tokens=128, new_tokens=128, deadline_ms=3000)
    assert d.max_prompt_range[0] < d.max_prompt_tokens < d.max_prompt_range[1]
    assume = plan("llama-3.1-8b", "h100", prompt_tokens=128, new_tokens=128, engine="ideal")
    assert assume.rows[0].ranges["total_s"] is None and "assumed efficiencies" in assume.notes[0]


def test_beyond_the_positions_says_so_with_the_window():
    p = plan("mistral-7b-v0.1", "h100", prompt_tokens=[8000, 40000], new_tokens=16)
    assert p.rows[1].beyond_positions and not p.rows[1].fits
    assert "32,768 positions" in p.notes[-1] and "window (4096 tokens) bounds the KV cache" in p.notes[-1]


@pytest.mark.parametrize("kw, match", [
    ({"prompt_tokens": 0}, "prompt_tokens must be an int >= 1"),
    ({"prompt_tokens": []}, "prompt_tokens must hold"),
    ({"batch": -1}, "batch must be an int >= 1"),
    ({"new_tokens": 1.5}, "new_tokens must be an int >= 1"),
    ({"deadline_ms": 0}, "deadline_ms must be a positive number"),
    ({"memory_gb": float("nan")}, "memory_gb must be a positive number"),
    ({"gpus": 0}, "gpus must be an int >= 1"),
    ({"deadline_on": "first"}, "deadline_on must be"),
    ({"dtype": "float12"}, "dtype must be one of"),
    ({"hardware": "tpu"}, "known: this, h100"),
    ({"prompt_tokens": 10**12}, "prompt_tokens must be at most 16,777,216"),
    ({"new_tokens": 10**9}, "new_tokens must be at most 16,777,216"),
    ({"gpus": 5}, "gpus must split gpt2's 12 query heads"),
    ({"model": {"model_type": "gpt2", "n_embd": 250, "n_head": 12, "n_layer": 2, "vocab_size": 9, "n_positions": 64}},
     "n_embd=250 is not a multiple of n_head=12"),
    ({"model": {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": "2", "vocab_size": 9, "n_positions": 64}},
     "n_layer must be an int >= 1, got '2'"),
])
def test_bad_input_names_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        plan(**{"model": "gpt2", "hardware": "h100", **kw})


def test_plan_is_exported_lazily_and_to_dict_is_json():
    import json

    assert attnlab.plan is plan and "plan" in attnlab.__all__
    d = plan("qwen2.5-7b", "a100", prompt_tokens=[1000, 2000]).to_dict()
    json.dumps(d)
    assert d["predicted"] and len(d["rows"]) == 2 and d["rows"][0]["limited_by"]


def test_the_decoder_that_ships_with_attnlab_is_a_model_name():
    from attnlab.planner import load_model

    a = load_model("attnlab:decoder")
    assert (a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim, a.hidden_size, a.max_positions, a.tied) == \
        (4, 4, 2, 32, 128, 128, True)
    assert plan("attnlab:decoder", "h100", prompt_tokens=64, new_tokens=16).rows[0].ttft_s > 0


def test_cache_dtype_overrides_the_cache_part_of_dtype_and_shortens_the_decode_read():
    """plan(cache_dtype=, cache_budget=): the KV bytes are the cache format's, the weights stay dtype's; a
    step reads fewer bytes, so TPOT falls; the plan says its cache."""
    import attnlab

    base = attnlab.plan("llama-3.1-8b", "h100", prompt_tokens=[32000])
    int4 = attnlab.plan("llama-3.1-8b", "h100", prompt_tokens=[32000], cache_dtype="int4")
    kept = attnlab.plan("llama-3.1-8b", "h100", prompt_tokens=[32000], cache_budget=2048)
    assert int4.weight_bytes == base.weight_bytes and int4.kv_bytes < 0.4 * base.kv_bytes
    assert int4.tpot_s < base.tpot_s and kept.tpot_s < int4.tpot_s
    assert kept.kv_bytes == pytest.approx(base.kv_bytes * 2048 / 32256)
    assert int4.to_dict()["cache"]["cache_dtype"] == "int4" and base.to_dict()["cache"] is None
