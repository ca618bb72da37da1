"""Tokenizers trained in the tests on a few sentences, for tiny models built from config classes (nothing downloaded)."""

from __future__ import annotations


def byte_level(texts: list[str], special: list[str]):
    """A byte-level BPE (``Ġ`` pieces, as GPT-2's, RoBERTa's, Qwen2's and BART's) of 300 tokens, trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=special,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok
