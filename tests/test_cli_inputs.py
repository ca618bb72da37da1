"""Bad input to the CLI gets one line that says what is wrong, before any work (issue 10, "The CLI")."""

import json

import pytest

from attnlab.cli.app import main

RIVER, MONEY = "I sat on the bank of the river.", "I put the money in the bank."


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model (or running the lesson) fails the test: the error must come first."""

    def refuse(*a, **k):
        raise AssertionError("the command did its work before checking its input")

    monkeypatch.setattr("attnlab.hf.loading.load_model", refuse)
    monkeypatch.setattr("attnlab.hf.capture.load_model", refuse)
    monkeypatch.setattr("attnlab.lesson.run.run_lesson", refuse)
    monkeypatch.setattr("attnlab.interventions.corpus.corpus_roles", refuse)


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
    assert err.strip().splitlines() == ["error: sentences[0] has 602 tokens; model 'sentence-transformers/all-MiniLM-L6-v2' takes at most 512"]


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
