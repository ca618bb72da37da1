"""`attnlab serve`: a busy port or a missing model ends in one error line, before anything is served."""

from __future__ import annotations

import socket

import pytest

from attnlab.cli.app import main


def test_busy_port_is_one_clear_error(capsys):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err
    assert "loading" not in err  # the port is checked before the model is loaded


def test_missing_model_fails_at_start_not_on_the_first_request(capsys, tmp_path):
    pytest.importorskip("transformers")
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free once the probe closes
    assert main(["serve", "--model", str(tmp_path / "nope"), "--port", str(port)]) == 2
    assert "does not exist" in " ".join(capsys.readouterr().err.split())


def test_bad_port_is_a_usage_error(capsys):
    assert main(["serve", "--port", "70000"]) == 2
