"""The induction probe: the sequence it builds, and its score against a hand computation."""

import numpy as np
import pytest

from attnlab.interventions.induction import induction_scores, repeated_tokens


def test_sequence_is_a_prefix_and_one_random_sequence_twice():
    ids = repeated_tokens(50, {0, 1}, length=10, batch=3, seed=7, prefix=1)
    assert ids.shape == (3, 21) and (ids[:, 0] == 1).all()
    np.testing.assert_array_equal(ids[:, 1:11], ids[:, 11:])
    assert not np.isin(ids[:, 1:], [0, 1]).any()
    np.testing.assert_array_equal(ids, repeated_tokens(50, {0, 1}, length=10, batch=3, seed=7, prefix=1))  # seeded


def test_score_is_the_weight_on_the_token_after_the_earlier_copy(tiny_llama):
    import torch
    from transformers import AutoModel

    found = induction_scores(tiny_llama, length=8, batch=2, seed=3)
    assert found.scores.shape == (2, 4) and found.prefix == "<s>"
    net = AutoModel.from_pretrained(tiny_llama, attn_implementation="eager").eval()
    from attnlab.hf.loading import load_model

    tok = load_model(tiny_llama).tokenizer
    ids = repeated_tokens(len(tok), set(tok.all_special_ids), 8, 2, 3, tok.bos_token_id)
    with torch.inference_mode():
        att = torch.stack(net(input_ids=torch.tensor(ids), output_attentions=True).attentions, 1).numpy()
    want = np.zeros((2, 4))
    for b in range(2):
        for i in range(9, 17):  # the second copy; its token at i first appeared at i − 8, followed by i − 7
            want += att[b, :, :, i, i - 7]
    np.testing.assert_allclose(found.scores, want / 16, atol=1e-6)
    assert found.to_dict()["scores"] == np.round(found.scores, 6).tolist()


def test_too_long_for_the_model(tiny_llama):
    with pytest.raises(ValueError, match="takes at most 64"):
        induction_scores(tiny_llama, length=40)
