"""Packed batches: ``documents=`` on the transformer's forward. A row holding several documents computes
what each document computes alone (each attends within itself, positions restart at its start), through
every backend that serves the description, and trains (gradients flow through the kernel's backward)."""

from __future__ import annotations

import pytest

from .test_hooks import _model

SIZES = (5, 1, 6)  # three documents in one row of 12 tokens, one of length 1


def _packed(m):
    import torch

    ids = torch.randint(1, m.config.vocab_size, (2, sum(SIZES)), generator=torch.Generator().manual_seed(3))
    docs = torch.repeat_interleave(torch.arange(len(SIZES)), torch.tensor(SIZES))
    return ids, docs


@pytest.mark.parametrize("backend", ["torch", "blockwise", "kernel", "sdpa", "auto"])
@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_a_packed_row_computes_each_document_alone(request, family, backend):
    import torch

    m = _model(request, family, backend)
    ids, docs = _packed(m)
    with torch.no_grad():
        packed = m.run_with_hooks(ids, documents=docs)
        start = 0
        for n in SIZES:
            alone = m.run_with_hooks(ids[:, start:start + n])
            torch.testing.assert_close(packed[:, start:start + n], alone, atol=2e-5, rtol=0)
            start += n


def test_documents_per_row_and_training_through_the_kernel(request):
    import torch

    m = _model(request, "llama", "kernel").requires_grad_(True)
    ids, _ = _packed(m)
    docs = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])  # the second row: one document
    logits = m.run_with_hooks(ids, documents=docs)
    with torch.no_grad():
        whole = m.run_with_hooks(ids[1:])
    torch.testing.assert_close(logits[1:], whole, atol=2e-5, rtol=0)
    logits.logsumexp(-1).mean().backward()
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("bad, text", [
    ([0, 1, 0] + [1] * 9, "documents must be non-decreasing along each row"),
    ([0] * 11, r"documents must be ints shaped \(T,\) or \(B, T\) = \(2, 12\)"),
    ([0.5] * 12, "documents must be ints"),
])
def test_bad_documents_are_refused_naming_them(request, bad, text):
    import torch

    m = _model(request, "llama")
    ids, _ = _packed(m)
    with pytest.raises(ValueError, match=text):
        m.run_with_hooks(ids, documents=torch.tensor(bad))
