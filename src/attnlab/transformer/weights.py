"""Real weights for attnlab's transformer, read straight from a model folder's safetensors.

Each family's tensor names map onto the transformer's own (``blocks.{i}.attn.q.weight`` …); GPT-2's
Conv1D weights are stored [in, out] and are transposed, its fused ``c_attn`` split into q, k and v.
transformers is used for the tokenizer only, never for the forward pass.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from attnlab.transformer.config import TransformerConfig

log = logging.getLogger(__name__)

PREFIXES = ("bert.", "roberta.", "transformer.", "model.")  # the base model inside a task model's file

# (our name, the family's name) per layer ({i}) and once per model; "T": stored transposed (Conv1D).
_BERT_LAYER = [
    ("attn.q", "attention.self.query"), ("attn.k", "attention.self.key"), ("attn.v", "attention.self.value"),
    ("attn.o", "attention.output.dense"), ("norm1", "attention.output.LayerNorm"),
    ("ffn.up", "intermediate.dense"), ("ffn.down", "output.dense"), ("norm2", "output.LayerNorm"),
]
_BERT_TOP = [("tok_emb", "embeddings.word_embeddings"), ("pos_emb", "embeddings.position_embeddings"),
             ("type_emb", "embeddings.token_type_embeddings"), ("emb_norm", "embeddings.LayerNorm")]
_GPT2_LAYER = [("norm1", "ln_1"), ("attn.o", "attn.c_proj", "T"), ("norm2", "ln_2"),
               ("ffn.up", "mlp.c_fc", "T"), ("ffn.down", "mlp.c_proj", "T")]
_GPT2_TOP = [("tok_emb", "wte"), ("pos_emb", "wpe"), ("final_norm", "ln_f")]
_LLAMA_LAYER = [
    ("norm1", "input_layernorm"), ("attn.q", "self_attn.q_proj"), ("attn.k", "self_attn.k_proj"),
    ("attn.v", "self_attn.v_proj"), ("attn.o", "self_attn.o_proj"), ("norm2", "post_attention_layernorm"),
    ("ffn.gate", "mlp.gate_proj"), ("ffn.up", "mlp.up_proj"), ("ffn.down", "mlp.down_proj"),
]
_LLAMA_TOP = [("tok_emb", "embed_tokens"), ("final_norm", "norm")]
# Gemma-2's four norms: before attention, on its output, before the FFN, on its output.
_GEMMA2_LAYER = [
    ("norm1", "input_layernorm"), ("attn.q", "self_attn.q_proj"), ("attn.k", "self_attn.k_proj"),
    ("attn.v", "self_attn.v_proj"), ("attn.o", "self_attn.o_proj"), ("norm1_post", "post_attention_layernorm"),
    ("norm2", "pre_feedforward_layernorm"), ("norm2_post", "post_feedforward_layernorm"),
    ("ffn.gate", "mlp.gate_proj"), ("ffn.up", "mlp.up_proj"), ("ffn.down", "mlp.down_proj"),
]
_QK_NORM = [("attn.q_norm", "self_attn.q_norm"), ("attn.k_norm", "self_attn.k_norm")]
# gpt-oss: Llama's attention and norms, a router, its experts (split in _gpt_oss_experts) and the sinks
_GPT_OSS_LAYER = _LLAMA_LAYER[:5] + [("norm2", "post_attention_layernorm"), ("ffn.router", "mlp.router")]
# DeepSeek-V3: MLA's projections and norms; the dense layers' MLP or the routed layers' router, shared expert
# (the experts themselves: _routed_experts)
_MLA = [("attn." + ours, "self_attn." + theirs) for ours, theirs in (
    ("q", "q_proj"), ("q_a", "q_a_proj"), ("q_a_norm", "q_a_layernorm"), ("q_b", "q_b_proj"),
    ("kv_a", "kv_a_proj_with_mqa"), ("kv_norm", "kv_a_layernorm"), ("kv_b", "kv_b_proj"), ("o", "o_proj"))]
_SHARED = [("ffn.shared." + x, f"mlp.shared_experts.{x}_proj") for x in ("gate", "up", "down")]
_DEEPSEEK_LAYER = [_LLAMA_LAYER[0], _LLAMA_LAYER[5], *_LLAMA_LAYER[6:], *_MLA, *_SHARED]
LAYOUT = {
    "bert": ("encoder.layer.{i}.", _BERT_LAYER, _BERT_TOP),
    "roberta": ("encoder.layer.{i}.", _BERT_LAYER, _BERT_TOP),
    "gpt2": ("h.{i}.", _GPT2_LAYER, _GPT2_TOP),
    "llama": ("layers.{i}.", _LLAMA_LAYER, _LLAMA_TOP),
    "mistral": ("layers.{i}.", _LLAMA_LAYER, _LLAMA_TOP),
    "qwen2": ("layers.{i}.", _LLAMA_LAYER, _LLAMA_TOP),
    "gemma2": ("layers.{i}.", _GEMMA2_LAYER, _LLAMA_TOP),
    "qwen3": ("layers.{i}.", _LLAMA_LAYER + _QK_NORM, _LLAMA_TOP),
    "gemma3_text": ("layers.{i}.", _GEMMA2_LAYER + _QK_NORM, _LLAMA_TOP),
    "gpt_oss": ("layers.{i}.", _GPT_OSS_LAYER, _LLAMA_TOP),
    "deepseek_v3": ("layers.{i}.", _DEEPSEEK_LAYER, _LLAMA_TOP),
    "qwen3_moe": ("layers.{i}.", _LLAMA_LAYER + _QK_NORM, _LLAMA_TOP),
}
# Any of these in a model folder means it has a tokenizer (text in and out); without: token ids only.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
# Old BERT checkpoints name LayerNorm's parameters after the paper.
_RENAMES = {".gamma": ".weight", ".beta": ".bias"}


def read_safetensors(folder: Any) -> dict:
    """Every tensor of every ``*.safetensors`` file in ``folder`` (sharded files are merged)."""
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model folder {str(folder)!r} has no .safetensors weights; attnlab loads only safetensors")
    tensors: dict = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def convert(tensors: dict, c: TransformerConfig) -> dict:
    """The family's tensors renamed (and reshaped) into the transformer's state dict."""
    base = {}
    for name, t in tensors.items():
        for old, new in _RENAMES.items():
            if name.endswith(old):
                name = name[: -len(old)] + new
        for prefix in PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        base[name] = t
    layer_prefix, layer_names, top_names = LAYOUT[c.family]
    pairs = [(ours, theirs, *how) for ours, theirs, *how in top_names]
    for i in range(c.num_layers):
        pre = layer_prefix.format(i=i)
        pairs += [(f"blocks.{i}.{ours}", pre + theirs, *how) for ours, theirs, *how in layer_names]
    if c.family == "gpt2":
        pairs += _gpt2_qkv(base, c)
    if not c.tie_embeddings:
        pairs.append(("lm_head", "lm_head"))
    state = {}
    for ours, theirs, *how in pairs:
        for kind in ("weight", "bias"):
            t = base.get(f"{theirs}.{kind}")
            if t is not None:
                state[f"{ours}.{kind}"] = t.T.contiguous() if how == ["T"] and kind == "weight" else t
    if c.family == "gpt_oss":
        state.update(_gpt_oss_experts(base, c))
    if c.routing is not None:
        state.update(_routed_experts(base, c))
    return state


def _gpt2_qkv(base: dict, c: TransformerConfig) -> list:
    """GPT-2's c_attn [d, 3d] (Conv1D) split into q, k and v Linear weights [d, d] each (put in ``base``)."""
    pairs = []
    for i in range(c.num_layers):
        for kind in ("weight", "bias"):
            fused = base.get(f"h.{i}.attn.c_attn.{kind}")
            if fused is not None:
                parts = (fused.T if kind == "weight" else fused).chunk(3, dim=0)
                base.update({f"_qkv.{i}.{x}.{kind}": t for x, t in zip("qkv", parts)})
        pairs += [(f"blocks.{i}.attn.{x}", f"_qkv.{i}.{x}") for x in "qkv"]
    return pairs


def _gpt_oss_experts(base: dict, c: TransformerConfig) -> dict:
    """gpt-oss's sinks and experts: gate_up_proj [E, d, 2f] interleaves gate (even columns) and up (odd)."""
    state = {}
    for i in range(c.num_layers):
        pre, ours = f"layers.{i}.mlp.experts.", f"blocks.{i}.ffn."
        if f"{pre}gate_up_proj" not in base:
            continue  # reported as missing by the loader
        gate_up, gate_up_bias = base[f"{pre}gate_up_proj"], base[f"{pre}gate_up_proj_bias"]  # (E, d, 2f), (E, 2f)
        state.update({ours + "gate": gate_up[..., ::2].contiguous(), ours + "up": gate_up[..., 1::2].contiguous(),
                      ours + "gate_bias": gate_up_bias[..., ::2].contiguous(),
                      ours + "up_bias": gate_up_bias[..., 1::2].contiguous(),
                      ours + "down": base[f"{pre}down_proj"], ours + "down_bias": base[f"{pre}down_proj_bias"]})
        sinks = base.get(f"layers.{i}.self_attn.sinks")
        if sinks is not None:
            state[f"blocks.{i}.attn.sinks"] = sinks
    return state


def _routed_experts(base: dict, c: TransformerConfig) -> dict:
    """DeepSeek-V3's and Qwen3-MoE's routers and experts: per expert ``experts.{e}.gate_proj`` / ``up_proj`` /
    ``down_proj`` (as transformers saves them), or already fused ``experts.gate_up_proj`` (E, 2f, d) and
    ``experts.down_proj`` (E, d, f), into ``gate_up`` (gate's rows first) and ``down``."""
    import torch

    state = {}
    for i in (layer for layer in range(c.num_layers) if c.routed(layer)):
        pre, ours = f"layers.{i}.mlp.", f"blocks.{i}.ffn."
        for theirs, mine in (("gate.weight", "router"), ("gate.e_score_correction_bias", "score_bias"),
                             ("experts.gate_up_proj", "gate_up"), ("experts.down_proj", "down")):
            if pre + theirs in base:
                state[ours + mine] = base[pre + theirs]
        each = [[base.get(f"{pre}experts.{e}.{x}_proj.weight") for e in range(c.num_experts)] for x in ("gate", "up", "down")]
        if all(t is not None for part in each for t in part):  # else missing, reported by the loader
            gate, up, down = (torch.stack(part) for part in each)  # (E, f, d), (E, f, d), (E, d, f)
            state[ours + "gate_up"], state[ours + "down"] = torch.cat((gate, up), dim=1), down
    return state


DTYPES = ("float32", "float64", "float16", "bfloat16")


def torch_dtype(dtype: Any, name: str = "dtype") -> Any:
    """A torch floating dtype from its name or itself (None: float32)."""
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, str) and dtype in DTYPES:
        return getattr(torch, dtype)
    if isinstance(dtype, torch.dtype) and str(dtype).removeprefix("torch.") in DTYPES:
        return dtype
    raise ValueError(f"{name} must be one of {', '.join(DTYPES)} (a name or a torch dtype), got {dtype!r}")


def load_pretrained(cls: type, model: Any = None, backend: str = "auto", revision: str | None = None,
                    dtype: Any = None) -> Any:
    """``cls`` (the Transformer) with the weights of ``model`` (see :func:`attnlab.locate.folder.resolve`),
    in ``dtype`` (default float32), in eval mode, its parameters frozen (``requires_grad_(True)`` to train
    it), with its tokenizer when the folder has one (else ``tokenizer`` is None: token ids in and out)."""
    from attnlab.locate.folder import resolve

    wanted = torch_dtype(dtype)
    folder, model_id, rev = resolve(model, revision)
    raw = json.loads((folder / "config.json").read_text())
    quant = raw.get("quantization_config")
    if quant:  # gpt-oss's published experts are MXFP4 blocks, DeepSeek-V3's weights FP8: not tensors we read
        raise ValueError(f"model {model_id!r}: config.json's quantization_config.quant_method is "
                         f"{quant.get('quant_method')!r}; attnlab's transformer loads unquantized safetensors "
                         f"({', '.join(DTYPES)}): dequantize the weights first")
    config = TransformerConfig.from_hf(raw)
    net = cls(config, backend=backend)
    state = convert(read_safetensors(folder), config)
    expected = set(net.state_dict())
    missing = sorted(expected - set(state))
    if missing:
        raise ValueError(f"model {model_id!r}: its safetensors lack {len(missing)} tensors the transformer needs, "
                         f"e.g. {', '.join(missing[:4])}")
    net.load_state_dict(state, strict=True)
    net.to(wanted).eval().requires_grad_(False)
    net.tokenizer = _tokenizer(folder) if any((folder / f).exists() for f in TOKENIZER_FILES) else None
    log.info("transformer %s (%s) loaded from %s in %s", model_id, rev, folder, wanted)
    return net


def _tokenizer(folder: Any) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    if tok.pad_token is None:  # GPT-2 and Llama have none; padded keys are masked out anyway
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"  # right padding: key padding goes to the backends as lengths
    return tok
