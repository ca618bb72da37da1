"""Library ``generate`` as a user meets it: it stops at the model's end-of-text by default (and can go on),
one temperature range, and the threads a small model's steps run on."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.needs("torch")

PROMPT = "Return the number of"  # the bundled decoder ends it with its end-of-text after 9 tokens


def test_generate_stops_at_end_of_text_by_default(decoder):
    eos = decoder.tokenizer.eos_token_id
    g = decoder.generate(PROMPT, 24)
    n = int(g.lengths[0])
    assert n < 24 and int(g.ids[0, n - 1]) == eos and eos not in g.ids[0, : n - 1].tolist()
    on = decoder.generate(PROMPT, 24, stop_at_eos=False)
    assert int(on.lengths[0]) == 24 and on.ids[0, :n].tolist() == g.ids[0, :n].tolist()
    assert on.text[0].startswith(g.text[0]) and len(on.text[0]) > len(g.text[0])  # it went on past the end
    explicit = decoder.generate(PROMPT, 24, stop_ids=(eos,), stop_at_eos=False)
    assert explicit.ids.tolist() == g.ids.tolist()  # stop_ids still stop


def test_a_model_without_a_tokenizer_has_no_end_of_text(decoder):
    import copy

    bare = copy.copy(decoder)
    bare.tokenizer = None
    ids = decoder.tokenizer(PROMPT)["input_ids"]
    assert int(bare.generate([ids], 24).lengths[0]) == 24


@pytest.mark.parametrize("kw, err, match", [
    ({"stop_at_eos": "no"}, TypeError, "stop_at_eos must be True or False, got 'no'"),
    ({"sample": True, "temperature": float("inf")}, ValueError, r"temperature must be a finite number in \(0, 100\]"),
    ({"sample": True, "temperature": 1000.0}, ValueError, r"temperature must be a finite number in \(0, 100\], got 1000.0"),
])
def test_bad_options_are_refused_before_any_work(decoder, kw, err, match):
    with pytest.raises(err, match=match):
        decoder.generate(PROMPT, 4, **kw)


def test_a_small_models_steps_run_on_one_thread_and_the_count_comes_back(decoder, monkeypatch):
    import torch

    from attnlab.transformer import threads

    seen = []
    before = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    decoder.generate(PROMPT, 3, on_token=lambda step, ids: seen.append(("step", step)))
    assert seen[0] == 1 and seen[-1] == 2 and ("step", 0) in seen  # one thread while it ran, two after
    assert threads.step_bytes(decoder, decoder.generate(PROMPT, 2).kv_cache) < threads.SMALL_STEP_BYTES
    seen.clear()
    monkeypatch.setattr(threads, "SMALL_STEP_BYTES", 1)
    decoder.generate(PROMPT, 2)
    assert seen == []  # a large step keeps torch's count
    monkeypatch.undo()
    assert torch.get_num_threads() == before


def test_pinned_threads_hold_every_generation_inside_them(decoder, monkeypatch):
    """The planner measures a big model's small stand-ins on the threads the big model takes: pinned, a
    generation that would drop to one thread keeps the pinned count; the count comes back after."""
    import torch

    from attnlab.transformer import threads

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert threads.threads_for(threads.SMALL_STEP_BYTES - 1) == 1 and threads.threads_for(threads.SMALL_STEP_BYTES) == 2
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    with threads.pinned_threads(2):
        decoder.generate(PROMPT, 2)
    assert seen == [2, 2]  # set on entry and restored on exit; the generation itself changed nothing
