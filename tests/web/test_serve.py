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


@pytest.mark.needs("transformers")
def test_missing_model_fails_at_start_not_on_the_first_request(capsys, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free once the probe closes
    assert main(["serve", "--model", str(tmp_path / "nope"), "--port", str(port)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "does not exist" in err and "reachable from the network" not in err


def test_bad_port_is_a_usage_error(capsys):
    assert main(["serve", "--port", "70000"]) == 2


def test_a_host_that_does_not_exist_is_a_bind_error_naming_it(capsys):
    from attnlab.web.server import check_port

    with pytest.raises(OSError, match=r"cannot bind to 999\.1\.1\.1: ") as info:
        check_port("999.1.1.1", 8765)
    assert "unknown error" not in str(info.value).lower()
    assert main(["serve", "--host", "999.1.1.1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot bind to 999.1.1.1:" in err and "unknown error" not in err.lower() and "loading" not in err


@pytest.mark.parametrize("host, warned", [
    ("127.0.0.1", False), ("127.0.0.2", False), ("localhost", False), ("::1", False),
    ("0.0.0.0", True), ("::", True), ("192.168.1.5", True), ("viewer.lan", True),
])
def test_a_host_other_machines_can_reach_is_warned_about(host, warned):
    from attnlab.web.guard import host_warning

    text = host_warning(host)
    assert (text is not None) == warned
    if warned:
        assert host in text and "reachable from the network" in text


@pytest.mark.needs("transformers")
def test_serve_on_every_address_prints_the_warning_before_loading(capsys, tmp_path):
    with socket.create_server(("0.0.0.0", 0)) as probe:
        port = probe.getsockname()[1]
    assert main(["serve", "--host", "0.0.0.0", "--port", str(port), "--model", str(tmp_path / "nope")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "reachable from the network" in err and err.index("reachable") < err.index("loading")
