"""GPT-2- and RoBERTa-style models from a local folder: tiny random models saved with safetensors and a
byte-level BPE tokenizer trained offline on a few sentences (no such weights exist offline)."""

import numpy as np
import pytest
import tiny_tokenizers

from attnlab.hf.capture import capture

pytestmark = pytest.mark.needs("torch", "transformers")

TEXTS = ["I sat on the bank of the river.", "I put the money in the bank.", "The river runs past the bank, slowly!"] * 4


def _bpe(special: list[str]):
    return tiny_tokenizers.byte_level(TEXTS, special)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    import torch
    from transformers import GPT2Config, GPT2Model, GPT2TokenizerFast

    folder = tmp_path_factory.mktemp("tiny-gpt2")
    tok = GPT2TokenizerFast(tokenizer_object=_bpe(["<|endoftext|>"]), eos_token="<|endoftext|>",
                            bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    GPT2Model(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=4)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def roberta_folder(tmp_path_factory):
    import torch
    from tokenizers import processors
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-roberta")
    bpe = _bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.post_processor = processors.RobertaProcessing(("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>")))
    tok = RobertaTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                               cls_token="<s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=66, pad_token_id=tok.pad_token_id)
    RobertaModel(config).save_pretrained(folder)
    return folder


def _eager(folder, sentence):
    import torch
    from transformers import AutoModel, AutoTokenizer

    net = AutoModel.from_pretrained(folder, attn_implementation="eager", use_safetensors=True).eval()
    enc = AutoTokenizer.from_pretrained(folder)(sentence, return_tensors="pt")
    with torch.inference_mode():
        return torch.stack(net(**enc, output_attentions=True).attentions, dim=1)[0].numpy()


def test_gpt2_maps_are_causal_and_equal_eager(gpt2_folder):
    maps = capture(TEXTS[:3], gpt2_folder, batch_size=3)
    assert (maps.num_layers, maps.num_heads) == (2, 4)
    assert maps.model_id == gpt2_folder.name
    for i, w in enumerate(maps.weights):
        assert np.all(np.triu(w, k=1) == 0), "a GPT-2 token attends to a later one"
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(w, _eager(gpt2_folder, TEXTS[i]), atol=1e-5)  # padded batch = alone


def test_gpt2_words_join_byte_level_pieces(gpt2_folder):
    maps = capture(["The river runs past the bank, slowly!"], gpt2_folder)
    assert any(t.startswith("Ġ") for t in maps.tokens[0])
    words = maps.to_words()
    assert words.words[0] == ["The", "river", "runs", "past", "the", "bank", ",", "slowly", "!"]
    assert words.is_mark[0] == [False] * 6 + [True, False, True]  # no special tokens: punctuation only
    np.testing.assert_allclose(words.weights[0].sum(-1), 1.0, atol=1e-5)


def test_roberta_maps_pairs_and_marks(roberta_folder):
    maps = capture(["I sat on the bank of the river.", ("The river.", "The bank!")], roberta_folder, batch_size=2)
    assert (maps.num_layers, maps.num_heads) == (3, 2)
    np.testing.assert_allclose(maps.weights[0], _eager(roberta_folder, TEXTS[0]), atol=1e-5)
    words = maps.to_words()
    assert words.words[1] == ["<s>", "The", "river", ".", "</s>", "</s>", "The", "bank", "!", "</s>"]
    assert words.kinds[1] == ["cls", "word", "word", "punct", "sep", "sep", "word", "word", "punct", "sep"]
