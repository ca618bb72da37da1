"""Tiny random GPT-2, Llama and RoBERTa models saved as safetensors folders (built from their config
classes, nothing downloaded), with a byte-level BPE tokenizer trained offline on a few sentences,
and attnlab's transformer on the bundled default model."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_tokenizers


def pytest_collection_modifyitems(items):
    """Every test of this folder builds models with torch and transformers: it says so (tests/conftest.py's rule)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.needs("torch", "transformers"))

TEXTS = ["I sat on the bank of the river.", "I put the money in the bank.", "The river runs past the bank, slowly!",
         "A bank.", "Money, money, money: the bank keeps it all, and the river keeps the rest."] * 4
BACKENDS = ("torch", "sdpa", "blockwise", "kernel", "numpy", "auto")


def bpe(special: list[str]):
    return tiny_tokenizers.byte_level(TEXTS, special)


def _gpt2_tokenizer():
    from transformers import GPT2TokenizerFast

    return GPT2TokenizerFast(tokenizer_object=bpe(["<|endoftext|>"]), eos_token="<|endoftext|>",
                             bos_token="<|endoftext|>", unk_token="<|endoftext|>")


@pytest.fixture(scope="session")
def gpt2_folder(tmp_path_factory):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("tiny-gpt2")
    tok = _gpt2_tokenizer()
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=4)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def llama_folder(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    tok = _gpt2_tokenizer()
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    # grouped-query attention (4 query heads share 2 key/value heads), an untied LM head
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def roberta_folder(tmp_path_factory):
    import torch
    from tokenizers import processors
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-roberta")
    tok_model = bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok_model.post_processor = processors.RobertaProcessing(("</s>", tok_model.token_to_id("</s>")),
                                                            ("<s>", tok_model.token_to_id("<s>")))
    tok = RobertaTokenizerFast(tokenizer_object=tok_model, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                               cls_token="<s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=66, pad_token_id=tok.pad_token_id)
    RobertaModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def default_transformer():
    """attnlab's transformer with the bundled all-MiniLM-L6-v2 weights."""
    from attnlab.transformer import Transformer

    return Transformer.from_pretrained()
