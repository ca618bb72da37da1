"""Path patching on tiny float64 models: a sender's clean output added to the receiver's input by hand
(the residual stream is a sum) gives the same metric; a sender at or after the receiver's layer gives
exactly 0; under grouped-query attention only the receiver sees its patched keys or values."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.needs("torch")
try:
    import torch
except ImportError:  # the needs mark skips every test here (on CI: fails them)
    torch = None

import circuit_models as cm  # noqa: E402

from attnlab import Head, PathPatching, path_patch  # noqa: E402


def _by_hand(m, clean, corrupted, sender, receiver, which):
    """The receiver's input recomputed from the corrupted residual stream plus the sender's change
    (z_clean − z_corrupted) through its output projection: (B, H or H_kv, T, Dh) at the receiver's layer."""
    c = m.config
    (sl, sh), rl = sender, receiver[0]
    names = [f"blocks.{sl}.attn.hook_z", f"blocks.{rl}.hook_resid_pre"]
    _, a = m.run_with_cache(clean, names=names)
    _, b = m.run_with_cache(corrupted, names=names)
    dh = c.head_dim
    dz = a[names[0]][:, sh] - b[names[0]][:, sh]  # (B, T, Dh)
    x = b[names[1]] + dz @ m.blocks[sl].attn.o.weight[:, sh * dh:(sh + 1) * dh].T  # (B, T, d)
    blk = m.blocks[rl]
    proj = {"q": blk.attn.q, "k": blk.attn.k, "v": blk.attn.v}[which]
    B, T = clean.shape
    return proj(blk.norm1(x)).view(B, T, -1, dh).transpose(1, 2)


def _replaced(name, head, new):
    def fn(x, _):
        x = x.clone()
        x[:, head] = new[:, head]
        return x
    return (name, fn)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_path_patching_is_the_senders_change_added_to_the_receivers_input(which):
    m = cm.model("gpt2")
    clean, corrupted = cm.pair()
    out = path_patch(m, clean, corrupted, cm.logit_diff, sender=(0, 1), receiver=(2, 3, which))
    new = _by_hand(m, clean, corrupted, (0, 1), (2, 3), which)
    want = cm.logit_diff(m.run_with_hooks(corrupted, fwd_hooks=[_replaced(f"blocks.2.attn.hook_{which}", 3, new)]))
    assert isinstance(out, PathPatching) and out.sender == Head(0, 1) and out.receiver == (2, 3)
    np.testing.assert_allclose(out.raw, want.numpy(), atol=1e-11)
    assert abs(out.effect - (out.raw.mean() - out.corrupted.mean()) / (out.clean.mean() - out.corrupted.mean())) < 1e-12


@pytest.mark.parametrize("style", cm.STYLES)
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_a_sender_the_receiver_cannot_read_has_no_effect(style, which):
    """Heads of the receiver's layer and later ones: exactly 0; the grid's earlier heads equal single senders."""
    m = cm.model(style)
    clean, corrupted = cm.pair()
    grid = path_patch(m, clean, corrupted, cm.logit_diff, receiver=(1, 2, which))
    assert grid.effect.shape == (3, 4) and np.all(grid.effect[1:] == 0.0) and np.abs(grid.effect[0]).max() > 1e-6
    one = path_patch(m, clean, corrupted, cm.logit_diff, sender=(0, 3), receiver=(1, 2, which))
    assert abs(one.effect - grid.effect[0, 3]) < 1e-10
    assert path_patch(m, clean, corrupted, cm.logit_diff, sender=(2, 0), receiver=(1, 2, which)).effect == 0.0


@pytest.mark.parametrize("which", ["k", "v"])
def test_under_grouped_query_attention_only_the_receiver_sees_the_patch(which):
    """Llama-style, 4 query heads on 2 k/v heads: receiver head 3 shares k/v head 1 with head 2. Head 2's
    pattern stays the corrupted run's; head 3's is the one its patched k/v head gives."""
    m = cm.model("llama")
    clean, corrupted = cm.pair()
    at = "blocks.2.attn."
    names = [at + "hook_pattern", at + "hook_z"]

    def read(head):
        return lambda logits, cache: cache[at + "hook_z"][:, head, -1].sum(-1)  # what the head writes at the end

    new = _by_hand(m, clean, corrupted, (0, 1), (2, 3), which)
    _, shared = m.run_with_cache(corrupted, names=names, fwd_hooks=[_replaced(at + f"hook_{which}", 1, new)])
    for head, want in ((2, None), (3, shared[at + "hook_z"][:, 3, -1].sum(-1))):
        out = path_patch(m, clean, corrupted, read(head), sender=(0, 1), receiver=(2, 3, which), names=names)
        np.testing.assert_allclose(out.raw, out.corrupted if want is None else want.numpy(), atol=1e-12)
    assert float((shared[at + "hook_z"][:, 2] - m.run_with_cache(corrupted, names=names)[1][at + "hook_z"][:, 2])
                 .abs().max()) > 1e-6  # patching the shared head itself would have moved head 2


def test_the_grid_ranks_senders_and_is_json_ready():
    m = cm.model("gpt2")
    clean, corrupted = cm.pair()
    grid = path_patch(m, clean, corrupted, cm.logit_diff, receiver=(2, 0, "k"))
    biggest = np.abs(grid.effect).argmax()  # by size, the sign kept
    assert grid.top(1)[0] == (Head(*np.unravel_index(biggest, (3, 4))), grid.effect.flat[biggest])
    d = json.loads(json.dumps(grid.to_dict()))
    assert d["receiver"] == {"layer": 2, "head": 0} and d["input"] == "k" and d["sender"] is None
    assert d["effect"] == grid.effect.tolist()
    one = path_patch(m, clean, corrupted, cm.logit_diff, sender=Head(1, 1), receiver=(2, 0, "k"))
    assert json.loads(json.dumps(one.to_dict()))["sender"] == {"layer": 1, "head": 1}
    with pytest.raises(ValueError, match="top ranks the senders of a grid"):
        one.top()


@pytest.mark.parametrize("kw,message", [
    ({"receiver": (2, 0)}, "receiver must be a 0-based"),
    ({"receiver": (2, 0, "o")}, r"receiver must be a 0-based \(layer, head, input\) with input one of q, k, v"),
    ({"receiver": (3, 0, "k")}, r"receiver must be a 0-based \(layer, head\) with layer 0\.\.2 and head 0\.\.3"),
    ({"receiver": (2, 4, "k")}, r"receiver must be .* got \(2, 4\)"),
    ({"sender": (0, 4), "receiver": (2, 0, "k")}, r"sender must be a 0-based \(layer, head\) .* got \(0, 4\)"),
    ({"sender": 0, "receiver": (2, 0, "k")}, "sender must be a Head or a 0-based"),
])
def test_bad_heads_are_refused_by_name(kw, message):
    m = cm.model("gpt2")
    clean, corrupted = cm.pair()
    with pytest.raises((ValueError, TypeError), match=message):
        path_patch(m, clean, corrupted, cm.logit_diff, **kw)
