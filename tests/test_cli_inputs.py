"""Bad input to the CLI gets one line that says what is wrong, before any work (issue 10, "The CLI")."""

import json

import pytest

from attnlab.cli.app import main

RIVER, MONEY = "I sat on the bank of the river.", "I put the money in the bank."


def _one_error(capsys, text):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    assert text in err, err
    return err


# bench: sizes beyond the maximum or beyond memory, refused before anything is allocated

def test_bench_refuses_sizes_beyond_the_maximum(capsys):
    assert main(["bench", "--sizes", "100000000", "--methods", "numpy"]) == 2
    _one_error(capsys, "sizes go up to 65536")


def test_bench_config_refuses_inputs_that_do_not_fit_in_memory(monkeypatch):
    from attnlab.bench import sweep

    monkeypatch.setattr(sweep, "memory_available", lambda: 2**30)
    with pytest.raises(ValueError, match=r"n = 4096, 12 heads, d = 4096: .* need 3.0 GiB, and 1.0 GiB"):
        sweep.BenchConfig(sizes=(512, 4096), heads=(1, 12), d=4096)  # by hand: 4 arrays · 12 · 4096 · 4096 · 4 B
    sweep.BenchConfig(sizes=(4096,), heads=(12,), d=64)  # 48 MiB fits


# paths: what the path is and what was expected

def test_model_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "some-file.txt"
    f.write_text("hello")
    assert main(["maps", RIVER, "--model", str(f)]) == 2
    _one_error(capsys, "is a file; expected a model folder (config.json and *.safetensors inside) or a hub id")


def test_corpus_that_is_a_folder_or_not_text(tmp_path, capsys, no_model):
    assert main(["heads", "--corpus", str(tmp_path)]) == 2
    _one_error(capsys, "is a folder; expected a UTF-8 text file")
    binary = tmp_path / "c.txt"
    binary.write_bytes(b"a sentence\n\xc1\xc2\n")
    assert main(["heads", "--corpus", str(binary)]) == 2
    _one_error(capsys, f"corpus file '{binary}' is not UTF-8 text (byte 0xc1 on line 2)")
    assert main(["stats", str(binary)]) == 2
    _one_error(capsys, f"text file '{binary}' is not UTF-8 text")


@pytest.mark.parametrize("args, text", [
    (["maps", RIVER, "--html", "{dir}"], "--html '{dir}' is a folder; --html takes a file to write"),
    (["maps", RIVER, "--png", "{dir}/no/h.png", "--layer", "1", "--head", "1"], "the folder '{dir}/no' does not exist"),
    (["maps", RIVER, "--save", "{dir}"], "--save '{dir}' is a folder"),
    (["heads", RIVER, "--json", "{dir}/no/r.json"], "--json '{dir}/no/r.json': the folder '{dir}/no' does not exist"),
    (["find-head", RIVER, "--target", "bank", "--decider", "river", "--json", "{dir}"], "--json '{dir}' is a folder"),
    (["lesson", "--out", "{dir}/file"], "--out must be a folder, got the file '{dir}/file'"),
    (["bench", "--png", "{dir}", "--sizes", "64"], "--png '{dir}' is a folder"),
    (["rollout", RIVER, "--png", "{dir}"], "--png '{dir}' is a folder"),
])
def test_output_paths_are_checked_before_any_work(tmp_path, capsys, no_model, args, text):
    (tmp_path / "file").write_text("")
    assert main([a.format(dir=tmp_path) for a in args]) == 2
    _one_error(capsys, text.format(dir=tmp_path))


def test_error_text_is_not_taken_for_markup(capsys):
    assert main(["heads", "--average", "[sep]"]) == 2
    _one_error(capsys, "average must be 'row' or 'sentence', got '[sep]'")


# one rule for a tab, in the CLI and in the library

def test_a_tab_makes_a_pair_in_the_library_as_in_the_cli():
    from attnlab.cli.maps import _as_items
    from attnlab.hf.encoding import check_sentences

    assert check_sentences(["A man.\tHe sat.", ("A man.", "He sat.")]) == [("A man.", "He sat.")] * 2
    assert _as_items(["A man.\tHe sat."]) == check_sentences(["A man.\tHe sat."])
    with pytest.raises(ValueError, match=r"sentences\[0\] has 2 tabs; a tab separates the two sentences of a pair"):
        check_sentences(["a\tb\tc"])


# progress when stderr is not a terminal

def test_progress_is_plain_lines_off_a_terminal(capsys):
    from attnlab.cli.common import progress

    bar, update = progress("capturing")
    with bar:
        update(1, 4)
        update(2, 4)  # within a few seconds of the last line: not repeated
        update(4, 4)
    lines = capsys.readouterr().err.splitlines()
    assert [line.rsplit(" (", 1)[0] for line in lines] == ["capturing", "capturing 1/4", "capturing 4/4"]


def test_lesson_steps_are_reported_off_a_terminal(capsys):
    from attnlab.cli.common import progress

    bar, _ = progress("the lesson")
    with bar:
        for i, what in enumerate(("scene", "cost"), 1):
            bar.update(bar.tasks[0].id, description=what, completed=i - 1, total=3)
    assert [line.rsplit(" (", 1)[0] for line in capsys.readouterr().err.splitlines()] == ["the lesson", "scene 0/3", "cost 1/3"]


# with the model

def test_too_long_sentence_gives_only_attnlabs_error(default_model, capfd):
    default_model.tokenizer.deprecation_warnings.pop("sequence-length-is-longer-than-the-specified-maximum", None)
    assert main(["maps", "word " * 600]) == 2
    err = capfd.readouterr().err
    assert "indexing errors" not in err and "Token indices" not in err
    assert err.strip().splitlines() == ["error: sentences[0] has 602 tokens; model 'sentence-transformers/all-MiniLM-L6-v2' takes at most 512 (the positions it embeds): cut the text to 512 tokens, or use a model with at least 602 positions"]


def test_heads_reports_progress_off_a_terminal(default_model, capsys):
    assert main(["heads"]) == 0
    assert "capturing 2/2" in capsys.readouterr().err


def test_find_head_names_the_occurrence_and_takes_another(default_model, capsys):
    twice = "The bank by the bank of the river."
    assert main(["find-head", twice, "--target", "bank", "--decider", "river", "--json", "-"]) == 0
    out = capsys.readouterr()
    assert 'note: "bank" occurs more than once: sentence 1 has it 2 times; occurrence 1 (word 3) was used.' in out.err
    assert "--occurrence N" in out.err
    assert json.loads(out.out)["target_occurrence"] == [{"occurrence": 1, "of": 2, "words": [3, 3]}]
    assert main(["find-head", twice, "--target", "bank", "--decider", "river", "--occurrence", "2", "--json", "-"]) == 0
    out = capsys.readouterr()
    assert "note:" not in out.err and json.loads(out.out)["target_occurrence"][0]["words"] == [6, 6]
    assert main(["find-head", twice, "--target", "bank", "--decider", "river", "--occurrence", "3"]) == 2
    _one_error(capsys, "occurrence 3 of 'bank' was asked for, but sentence 1 has it 2 times")


def test_maps_html_gets_the_compare_search(default_model, tmp_path, capsys):
    page = tmp_path / "bank.html"
    assert main(["maps", RIVER, MONEY, "--words", "--html", str(page), "--target", "bank",
                 "--decider", "river", "--decider", "money"]) == 0
    assert '"search"' in page.read_text() and "No head of 72 qualifies" in page.read_text()
    assert capsys.readouterr().err == f"wrote {page}\n"
    assert main(["maps", RIVER, "--html", str(tmp_path / "x.html"), "--target", "bank"]) == 2
    _one_error(capsys, "--target and --decider go together")
    assert main(["maps", RIVER, MONEY, "--html", str(tmp_path / "y.html"), "--target", "bank", "--decider", "rivers",
                 "--decider", "money"]) == 2
    _one_error(capsys, "word 'rivers' is not in sentence 1")
    assert not (tmp_path / "y.html").exists()


# issue 20: messages in the user's words, and errors that tell the truth

def _flagged(capsys, args, text, status=2):
    assert main(args) == status
    return _one_error(capsys, text)


@pytest.mark.parametrize("args, text", [
    (["cost", "--deadline-ms", "x"], "error: Invalid value for '--deadline-ms'"),  # the parser's, not a boxed panel
    (["cost", "--deadline-ms", "0"], "error: --deadline-ms must be a positive number, got 0.0"),
    (["cost", "--memory-mb", "-1"], "error: --memory-mb must be a positive number"),
    (["lesson", "--deadline-ms", "0"], "error: --deadline-ms must be a positive number"),
    (["bench", "--sizes", "0"], "error: --sizes takes comma-separated integers >= 1, got '0'"),
    (["bench", "--heads", "2,x"], "error: --heads takes comma-separated integers >= 1, got '2,x'"),
    (["bench", "--repeats", "0"], "'--repeats'"),
    (["bench", "--d", "0"], "'--d'"),
    (["bench", "--memory-mb", "0"], "error: --memory-mb must be > 0, got 0.0"),
    (["bench", "--max-seconds", "0"], "error: --max-seconds must be > 0"),
    (["bench", "--decode", "--heads", "4", "--png", "x.png"], "error: --heads, --png do not apply to --decode"),
    (["bench", "--decode", "--methods", "sdpa,gemm"], "error: --methods with --decode takes some of attention,"),
    (["ablate", RIVER, "--how", "half"], "error: --how must be one of zero, mean, got 'half'"),
    (["ablate", RIVER, "--heads", "1.1,2.3,1.1"], "error: --heads names 1.1 twice; name each head once"),
    (["rollout", RIVER, "--residual", "1"], "error: --residual must be a number in [0, 1), got 1.0"),
    (["lesson", "--out", ""], "error: --out is empty"),
    (["maps", RIVER, "--model", ""], "error: --model is empty"),
    (["heads", "--revision", " "], "error: --revision is empty"),
    (["maps", RIVER, "--json", ""], "error: --json is empty"),
    (["maps", "I sat on the \udcffbank."], r"error: argument 2 ('I sat on the \xffbank.') is not UTF-8 text"),
    (["nosuch"], "error: No such command 'nosuch'."),
])
def test_errors_name_the_flag_the_user_typed_before_any_work(capsys, no_model, monkeypatch, args, text):
    monkeypatch.setattr("attnlab.interventions.ablation._load", lambda *a: pytest.fail("loaded the model"))
    _flagged(capsys, args, text)


def test_stats_on_an_empty_file_fails_before_the_model_loads(tmp_path, capsys, no_model):
    (tmp_path / "empty.txt").write_text("\n  \n")
    _flagged(capsys, ["stats", str(tmp_path / "empty.txt")], "is empty (or only white space)")
    _flagged(capsys, ["stats", str(tmp_path / "empty.txt"), "--lines"], "is empty (or only white space)")


def test_python_names_become_the_flags_they_came_from():
    from attnlab.cli.errors import in_flags

    flags = {"max_tokens": "--max-tokens", "sizes": "--sizes", "heads": "--heads", "d": "--d"}
    assert in_flags("texts[0] has 9 tokens (pass max_tokens to cut it)", flags) == "texts[0] has 9 tokens (pass --max-tokens to cut it)"
    assert in_flags("sizes must be ints", flags) == "--sizes must be ints"
    assert in_flags("this model has heads 1 to 12", flags) == "this model has heads 1 to 12"  # English, not a flag
    assert in_flags("heads folder 'x' does not exist", flags) == "heads folder 'x' does not exist"
    assert in_flags("--max-tokens and max_tokens_x", flags) == "--max-tokens and max_tokens_x"


def _scene_raises(monkeypatch, exc):
    def boom():
        if callable(exc):
            exc()
        raise exc

    monkeypatch.setattr("attnlab.lesson.scene.scene", boom)


@pytest.mark.parametrize("exc", [
    RuntimeError("a worker died"),  # was shown as the user's error
    lambda: __import__("numpy").zeros(-1),  # a ValueError raised inside NumPy: not raised on purpose
    lambda: {}["layer"],  # a KeyError from a lookup in attnlab's code
    lambda: len(5),  # a TypeError from a builtin
])
def test_a_failure_of_attnlab_is_an_internal_error_not_the_users(capsys, monkeypatch, exc):
    _scene_raises(monkeypatch, exc)
    assert main(["scene"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("internal error: ") and "Traceback" not in err, err
    assert "please report it" in err and "ATTNLAB_DEBUG=1" in err


def test_attnlabs_own_input_errors_stay_the_users(capsys, monkeypatch):
    import numpy as np

    import attnlab

    _scene_raises(monkeypatch, lambda: attnlab.attention(np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 4))))
    assert main(["scene"]) == 2  # a check of attnlab's, raised on purpose: the user's to fix
    assert capsys.readouterr().err.startswith("error: ")


def test_attnlab_debug_shows_the_traceback(monkeypatch):
    _scene_raises(monkeypatch, RuntimeError("a worker died"))
    monkeypatch.setenv("ATTNLAB_DEBUG", "1")
    with pytest.raises(RuntimeError, match="a worker died"):
        main(["scene"])


def test_help_texts_stand_alone(capsys):
    """No help text refers to a document the user does not have ("the seeds", "seed 000"); a seed is
    a random generator's, and rng(0) is written out as NumPy's default_rng(0)."""
    from attnlab.cli.app import COMMANDS

    for name in COMMANDS:
        assert main([name, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        for ref in ("the seeds", "seed's", "seed 00", "seed document", "../"):
            assert ref not in text, (name, ref)
        assert "rng(0)" not in text.replace("default_rng(0)", ""), name


def test_the_benchmark_notes_stand_alone():
    from attnlab.bench import methods

    assert "seed" not in methods.__doc__ and "seed" not in methods.naive_attention.__doc__


def test_stats_over_the_models_length_says_so_in_flags_without_transformers_warning(default_model, tmp_path, capfd):
    default_model.tokenizer.deprecation_warnings.pop("sequence-length-is-longer-than-the-specified-maximum", None)
    f = tmp_path / "long.txt"
    f.write_text("word " * 600)
    assert main(["stats", str(f)]) == 2
    err = capfd.readouterr().err
    assert "Token indices" not in err and "indexing errors" not in err, err
    assert err.strip().splitlines()[-1] == ("error: texts[0] has 602 tokens; 'sentence-transformers/all-MiniLM-L6-v2' "
                                            "takes at most 512 (pass --max-tokens to cut it)")
    assert main(["stats", str(f), "--max-tokens", "99999999999999999999"]) == 2
    assert capfd.readouterr().err.strip().splitlines()[-1] == (
        "error: --max-tokens is 99999999999999999999; 'sentence-transformers/all-MiniLM-L6-v2' takes at most 512 tokens")


def test_the_command_list_shows_each_summary_unbroken(capsys):
    """`attnlab --help` lists each command with its docstring's first paragraph wrapped to the panel, not broken
    where the source's lines end: no line of a summary ends while the next line's first word would have fit."""
    from attnlab.cli.app import COMMANDS

    assert main(["--help"]) == 0
    rows = [line[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("│") and line.endswith("│")]
    rows = [r for r in rows if r.strip() and not r.lstrip().startswith("--")]  # the commands panel's rows
    first = rows[[r.split()[0] for r in rows].index("scene")]
    at = first.index("The")  # where the summaries' column starts
    width = len(first) - at - 1  # rich's padding of one on the right
    named = 0
    for row, after in zip(rows, rows[1:]):
        named += row[:at].strip() in COMMANDS
        text, continued = row[at:].rstrip(), not after[:at].strip()
        if continued:  # the same command's next line: its first word did not fit on this one
            assert len(text) + 1 + len(after[at:].split()[0]) > width, (row, after)
    assert named >= len(COMMANDS) - 1


def test_no_command_prints_the_help_and_help_is_not_an_error(capsys):
    assert main([]) == 2
    assert "Usage: attnlab" in capsys.readouterr().out
    assert main(["--help"]) == 0 and main(["maps", "--help"]) == 0
    assert "--model" in capsys.readouterr().out


# issue 24: patch and attribute, on the bundled decoder

PATCH = ["patch", "--clean", "Set the class of the", "--corrupted", "Set the file of the", "--target", " class"]


@pytest.mark.parametrize("args, text", [
    (PATCH + ["--over", "layer"], "error: --over must be one of head, head_pos, got 'layer'"),
    (["patch", "--clean", "  ", "--corrupted", "x", "--target", " a"], "error: --clean is empty; give the text the model reads"),
    (["patch", "--clean", "a b", "--corrupted", "a b", "--target", " a"],
     "error: --clean and --corrupted are the same text; patching needs a --corrupted text that changes"),
    (["patch", "--clean", "a", "--target", " a"], "error: Missing option '--corrupted'."),
    (PATCH + ["--top", "0"], "'--top'"),
    (PATCH + ["--model", ""], "error: --model is empty"),
    (PATCH + ["--png", "/no/such/folder/p.png"], "error: --png '/no/such/folder/p.png': the folder '/no/such/folder'"),
    (["attribute", " ", "--target", " a"], "error: TEXT is empty; give the text the model reads"),
    (["attribute", "x", "--target", " a", "--top", "-1"], "'--top'"),
])
def test_patch_and_attribute_check_their_flags_before_any_work(capsys, no_decoder, args, text):
    _flagged(capsys, args, text)


@pytest.mark.needs("torch", "transformers")
@pytest.mark.parametrize("args, text", [
    (["patch", "--clean", "Set the class of the", "--corrupted", "Set the file", "--target", " class"],
     "error: --clean has 6 tokens and --corrupted has 4; patching lines the two runs up position by position, so they "
     "need the same number of tokens (--clean: 'S' 'et' ' the' ' class' ' of' ' the'; --corrupted: 'S' 'et' ' the' ' file')"),
    (PATCH[:-1] + [" Paris"], "error: --target must be one token, got ' Paris', which is 3 tokens [486, 287, 270] "
                              "(' P' + 'ar' + 'is')"),
    (PATCH + ["--baseline", "xyzzy"], "error: --baseline must be one token, got 'xyzzy', which is"),
    (PATCH + ["--baseline", " class"], "error: --baseline ' class' is the same token as --target ' class'"),
    (["attribute", "Set the class of the", "--target", ""], "error: --target must be one token, got '', which is 0 tokens"),
    (["attribute", "word " * 200, "--target", " class"], "error: TEXT has 400 tokens; this model takes at most 128"),
])
def test_patch_and_attribute_say_how_the_text_and_tokens_tokenize(capsys, args, text):
    _flagged(capsys, args, text)


def test_patch_and_attribute_refuse_an_unknown_model_and_an_encoder(tmp_path, capsys):
    _flagged(capsys, PATCH + ["--model", str(tmp_path / "nothing")], f"model folder '{tmp_path / 'nothing'}' does not exist")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10, "hidden_size": 8,
                                                      "num_hidden_layers": 1, "num_attention_heads": 2,
                                                      "intermediate_size": 16, "max_position_embeddings": 16}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    _flagged(capsys, ["attribute", "x", "--target", " a", "--model", str(tmp_path)],
             f"error: --model '{tmp_path}' is a bert encoder")
