"""Tiny random-initialised models of every architecture capture serves, built from transformers'
config classes and saved with safetensors beside a tokenizer trained here (nothing is downloaded).

``build(arch, folder)`` saves one in a folder (the ``tiny_folder`` and ``tiny_llama`` fixtures of
tests/conftest.py build each once per session). Tokenizers: byte-level BPE
(``Ġ``, as GPT-2, Qwen2, BART) or SentencePiece-style (``▁`` pieces from a Metaspace
pre-tokenizer that does not split words first, as Llama's, so ``word_ids()`` gives one word per
sentence and attnlab has to find the words itself).
"""

from __future__ import annotations

import tiny_tokenizers

TEXTS = ["I sat on the bank of the river.", "I put the money in the bank.", "The river runs past the bank, slowly!"] * 4
ARCHS = ("llama", "qwen2", "mistral", "gemma2", "t5", "bart")
SINKS = ((-1.0, 0.0, 1.0, 2.5), (2.0, -0.5, 0.5, 1.5))  # gpt_oss: each layer's learned sink logit per head
WINDOW = 4  # Mistral's and Gemma-2's sliding window, shorter than the sentences so that it matters
SOFTCAP = 0.5  # Gemma-2's logit softcap, small enough to change random-init maps


def byte_level(special: list[str]):
    return tiny_tokenizers.byte_level(TEXTS, special)


def sentencepiece(special: list[str], template: str):
    """A BPE over ``▁`` pieces; ``template`` places the special tokens, e.g. "<s> $A" or "$A </s>"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Trained on split words (SentencePiece never merges across a space), used unsplit (as Llama's tokenizer.json)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=70, special_tokens=special))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    used = [s for s in special if s in template]
    tok.post_processor = processors.TemplateProcessing(
        single=template, pair=template.replace("$A", "$A $B"), special_tokens=[(s, tok.token_to_id(s)) for s in used])
    return tok


def _fast(tok, **names):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, **names)


def build_gpt_oss(folder) -> None:
    """A tiny gpt-oss (learned sinks :data:`SINKS`, a sliding window of :data:`WINDOW` on layer 0, YaRN, 4 experts
    of which 2 per token) with a byte-level BPE, saved as a causal LM (attnlab's Transformer loads it too)."""
    import torch
    import transformers as tf

    tok = _fast(byte_level(["<|endoftext|>"]), eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.save_pretrained(folder)
    config = tf.GptOssConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=WINDOW, num_local_experts=4,
        num_experts_per_tok=2, pad_token_id=tok.pad_token_id,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 5.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})
    torch.manual_seed(0)
    net = tf.GptOssForCausalLM(config)
    with torch.no_grad():  # weights large enough that the maps are far from uniform, sinks of every size
        for p in net.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
        for layer, sinks in zip(net.model.layers, SINKS):
            layer.self_attn.sinks.copy_(torch.tensor(sinks))
    net.save_pretrained(folder)


def build(arch: str, folder) -> None:
    """Save a tiny ``arch`` model (one of :data:`ARCHS`, or "gpt_oss": :func:`build_gpt_oss`) and its tokenizer
    in ``folder``."""
    import torch
    import transformers as tf

    if arch == "gpt_oss":
        return build_gpt_oss(folder)

    sp_names = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    if arch in ("llama", "mistral", "gemma2"):
        tok = _fast(sentencepiece(["<unk>", "<s>", "</s>", "<pad>"], "<s> $A"), **sp_names)
    elif arch == "t5":
        tok = _fast(sentencepiece(["<pad>", "</s>", "<unk>"], "$A </s>"), eos_token="</s>", unk_token="<unk>",
                    pad_token="<pad>")
    elif arch == "qwen2":
        tok = _fast(byte_level(["<|endoftext|>"]), eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    else:  # bart
        from tokenizers import processors

        bpe = byte_level(["<s>", "<pad>", "</s>", "<unk>"])
        bpe.post_processor = processors.RobertaProcessing(("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>")))
        tok = _fast(bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    tok.save_pretrained(folder)
    v, pad = len(tok), tok.pad_token_id
    decoder = dict(vocab_size=v, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64, pad_token_id=pad)
    configs = {
        "llama": lambda: tf.LlamaConfig(**decoder),
        "qwen2": lambda: tf.Qwen2Config(**decoder),
        "mistral": lambda: tf.MistralConfig(**decoder, sliding_window=WINDOW),
        "gemma2": lambda: tf.Gemma2Config(**decoder, head_dim=8, query_pre_attn_scalar=8, sliding_window=WINDOW,
                                          attn_logit_softcapping=SOFTCAP),
        "t5": lambda: tf.T5Config(vocab_size=v, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3,
                                  num_heads=4, relative_attention_num_buckets=8, pad_token_id=pad,
                                  eos_token_id=tok.eos_token_id, decoder_start_token_id=pad),
        "bart": lambda: tf.BartConfig(vocab_size=v, d_model=32, encoder_layers=2, decoder_layers=3,
                                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                      decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=pad,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                      decoder_start_token_id=tok.eos_token_id),
    }
    torch.manual_seed(0)
    config = configs[arch]()
    tf.AutoModel.from_config(config).save_pretrained(folder)
