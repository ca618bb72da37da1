"""Fixtures of the viewer's tests: an app over the default model, a tiny random BERT for fuzzing,
and a live uvicorn server on 127.0.0.1 for the browser (the ``browser`` and ``page`` fixtures are
tests/conftest.py's: tests in other folders draw pages too)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time

import pytest

@pytest.fixture(scope="session")
def viewer_app(default_model):  # needs fastapi: tests/conftest.py marks the tests that use it
    from attnlab.web.server import create_app

    from attnlab.lesson.scene import scene

    return create_app(default_model, scene=scene())


@pytest.fixture(scope="session")
def client(viewer_app):
    from fastapi.testclient import TestClient

    with TestClient(viewer_app, base_url="http://127.0.0.1") as c:
        yield c


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model):
    """A BERT of 2 layers x 2 heads with random weights and the default model's tokenizer: the real
    loading and capturing code, at a size that lets the fuzzer send hundreds of requests."""
    import torch
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=default_model.tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=512)
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    for f in default_model.path.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special_tokens")):
            shutil.copy(f, folder / f.name)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(app):
    """``app`` served by uvicorn in a thread on a free port of 127.0.0.1, for the block; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"uvicorn did not start on 127.0.0.1:{port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def serve():
    """:func:`served`, for tests that serve an app of their own: ``with serve(app) as url: ...``."""
    return served


@pytest.fixture(scope="session")
def live_server(viewer_app):
    """The viewer of the default model served by uvicorn on 127.0.0.1; yields its base URL."""
    with served(viewer_app) as url:
        yield url


@pytest.fixture(scope="module")
def long_server(tiny_llama):
    """The viewer of a tiny Llama served on 127.0.0.1 (the long view's browser test); yields its base URL."""
    from attnlab.hf.loading import load_model
    from attnlab.web.server import create_app

    with served(create_app(load_model(tiny_llama))) as url:
        yield url


@pytest.fixture(scope="session")
def tiny_seq2seq_dir(tmp_path_factory):
    """A tiny random T5 (2 encoder layers, 3 decoder layers, 4 heads, relative position bias) with a
    tokenizer trained in the test (tests/tiny_models.py's builder). Its tests say they need torch and
    transformers."""
    import tiny_models as tiny

    folder = tmp_path_factory.mktemp("tiny-t5-viewer")
    tiny.build("t5", folder)
    return folder


@pytest.fixture(scope="session")
def seq2seq_app(tiny_seq2seq_dir):
    from attnlab.web.server import create_app

    return create_app(str(tiny_seq2seq_dir))


