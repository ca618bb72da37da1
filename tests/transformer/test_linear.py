"""The transformer's linear layer: the compiled few-row path equals torch's linear, and every call it
cannot serve goes to torch's."""

import pytest
import torch
import torch.nn.functional as F

from attnlab.transformer import linear as L
from attnlab.transformer.linear import Linear, linear

compiled = pytest.mark.needs("matvec")  # fails on CI where the extension was not built, skips elsewhere


def spy(monkeypatch) -> list:
    calls = []
    real = L._matvec.linear
    monkeypatch.setattr(L._matvec, "linear", lambda *a: calls.append(a[4]) or real(*a))
    return calls


@compiled
@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 1, 64), (1, 8, 64), (8, 64), (64,)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out", [1, 7, 130, 1000])
def test_few_rows_equal_torch(monkeypatch, shape, bias, out):
    g = torch.Generator().manual_seed(out)
    lin = Linear(64, out, bias=bias)
    x = torch.randn(*shape, generator=g)
    calls = spy(monkeypatch)
    with torch.no_grad():
        got, want = lin(x), F.linear(x, lin.weight, lin.bias)
    assert calls, "the compiled path served the call"
    assert got.shape == want.shape == (*shape[:-1], out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@compiled
def test_a_non_contiguous_input_is_read_right(monkeypatch):
    w = torch.randn(50, 32)
    x = torch.randn(32, 4).T  # (4, 32), rows strided
    calls = spy(monkeypatch)
    torch.testing.assert_close(linear(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
    assert calls == [4]


@compiled
@pytest.mark.parametrize("case", ["many rows", "float64", "bfloat16", "autograd", "strided weight"])
def test_calls_it_cannot_serve_are_torchs(monkeypatch, case):
    w, x = torch.randn(40, 16), torch.randn(2, 16)
    if case == "many rows":
        x = torch.randn(L.MAX_ROWS + 1, 16)
    elif case == "float64":
        w, x = w.double(), x.double()
    elif case == "bfloat16":
        w, x = w.bfloat16(), x.bfloat16()
    elif case == "autograd":
        w.requires_grad_(True)
    else:
        w = torch.randn(16, 40).T
    calls = spy(monkeypatch)
    got = linear(x, w)
    assert calls == []
    torch.testing.assert_close(got, F.linear(x, w))
    if case == "autograd":
        got.sum().backward()
        assert w.grad is not None


@compiled
def test_inference_mode_and_the_state_dict_are_nn_linears():
    lin = Linear(16, 8)
    assert isinstance(lin, torch.nn.Linear) and set(lin.state_dict()) == {"weight", "bias"}
    with torch.inference_mode():
        x = torch.randn(1, 16)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


@compiled
def test_the_extension_checks_its_buffers():
    w, x, out = torch.zeros(4, 3).numpy(), torch.zeros(2, 3).numpy(), torch.zeros(2, 4).numpy()
    with pytest.raises(ValueError, match="weight must hold 15 float32"):
        L._matvec.linear(w, x, None, out, 2, 5, 3)
    with pytest.raises(ValueError, match="rows must be 1..8"):
        L._matvec.linear(w, x, None, out, 9, 4, 3)
    with pytest.raises(ValueError, match="bias must hold 4"):
        L._matvec.linear(w, x, torch.zeros(3).numpy(), out, 2, 4, 3)


def test_without_the_extension_torch_serves(monkeypatch):
    monkeypatch.setattr(L, "_matvec", None)
    w, x = torch.randn(10, 6), torch.randn(1, 6)
    torch.testing.assert_close(linear(x, w), F.linear(x, w))
