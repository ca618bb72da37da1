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


# Tiny random decoders of every architecture generate() serves, from transformers' own config classes:
# 2 layers, d = 32, GQA where the family has it, sliding windows (6) much smaller than the tests'
# sequences, weights drawn wider than transformers' init (std 0.3) so that greedy choices are not
# near-ties. Room for 256 decoded steps. No tokenizer except GPT-2's (its vocabulary: the tiny BPE's 300).
WINDOW = 6
DECODERS = {
    "gpt2": lambda t: t.GPT2Config(vocab_size=300, n_positions=320, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                                   eos_token_id=0),  # the tiny BPE's <|endoftext|>
    "llama": lambda t: t.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=320),
    "llama3": lambda t: t.LlamaConfig(  # Llama-3.1's rope scaling, its original length shorter than the tests
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=320,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "mistral": lambda t: t.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=320,
                                         sliding_window=WINDOW),
    "qwen2": lambda t: t.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=320,
                                     use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "gemma2": lambda t: t.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                       max_position_embeddings=320, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                       attn_logit_softcapping=5.0, final_logit_softcapping=3.0, pad_token_id=0),
    # the decoders of 2025: QK-norm (Qwen3, Gemma-3); Gemma-3's local and global layers, each with its own
    # rotary base (the global one scaled linearly, as the 4B+ models); gpt-oss's sinks, window, YaRN (its
    # original length shorter than the tests) and 8 experts, 2 per token
    "qwen3": lambda t: t.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     max_position_embeddings=320),
    "gemma3": lambda t: t.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=320, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=16, final_logit_softcapping=3.0,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}},
        pad_token_id=0),
    "gpt_oss": lambda t: t.GptOssConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=320, sliding_window=WINDOW, num_local_experts=8,
        num_experts_per_tok=2, rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 5.0,
                                                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                "original_max_position_embeddings": 64}),
    # mixtures of experts: DeepSeek-V3 (MLA with a low-rank query, interleaved rotary pairs and YaRN with its
    # mscale; sigmoid routing with a correction bias over 4 groups of 2 experts, the best 2 groups kept; a shared
    # expert; layer 0 dense), the same without q_lora_rank, groups or renormalisation, and Qwen3-MoE (softmax
    # routing, layer 1 dense by mlp_only_layers)
    "deepseek_v3": lambda t: t.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=2.5,
        kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, v_head_dim=12, qk_nope_head_dim=8, n_group=4, topk_group=2,
        num_experts_per_tok=2, first_k_dense_replace=1, max_position_embeddings=320,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 5.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 0.707, "mscale_all_dim": 1.0, "original_max_position_embeddings": 64}),
    "deepseek_v3_plain": lambda t: t.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2, n_routed_experts=8, routed_scaling_factor=1.0,
        kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, v_head_dim=8, qk_nope_head_dim=16, n_group=1,
        topk_group=1, num_experts_per_tok=3, first_k_dense_replace=0, norm_topk_prob=False, rope_interleave=False,
        max_position_embeddings=320),
    "qwen3_moe": lambda t: t.Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, mlp_only_layers=[1], max_position_embeddings=320),
}
GEMMA = ("gemma2", "gemma3")  # their norms scale by 1 + w


@pytest.fixture(scope="session")
def decoder_folder(tmp_path_factory):
    """decoder_folder(family) → a folder with config.json and safetensors (GPT-2's also a tokenizer)."""
    import torch
    import transformers

    made: dict = {}

    def make(family: str):
        if family not in made:
            folder = tmp_path_factory.mktemp(f"gen-{family}")
            torch.manual_seed(0)
            net = transformers.AutoModelForCausalLM.from_config(DECODERS[family](transformers))
            with torch.no_grad():
                for name, p in net.named_parameters():
                    if p.dim() > 1 or "norm" not in name:
                        p.normal_(0.0, 0.3)
                    else:
                        p.normal_(0.0 if family in GEMMA else 1.0, 0.1)
                for name, b in net.named_buffers():  # DeepSeek's routing correction bias: a buffer, zero at init
                    if name.endswith("e_score_correction_bias"):
                        b.normal_(0.0, 0.3)
            net.save_pretrained(folder)
            if family == "gpt2":
                _gpt2_tokenizer().save_pretrained(folder)
            made[family] = folder
        return made[family]

    return make
