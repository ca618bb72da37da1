"""Loading a pretrained transformers model to capture from: its torch module and fast tokenizer.

The folder comes from :func:`attnlab.locate.folder.resolve` (the bundled default, a local folder or
a hub id). Weights always come from safetensors and ``trust_remote_code`` stays off.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.locate.folder import resolve

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to capture from: the torch module, its fast tokenizer and what it is.

    ``model_id`` and ``revision`` name the weights (for a hub model the revision is the commit the
    cache resolved to, so a saved map says exactly which weights made it).
    """

    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    model_id: str
    revision: str | None
    path: Path
    num_layers: int
    num_heads: int
    config: dict = field(repr=False)

    @property
    def max_tokens(self) -> int:
        """The longest input the model takes, in tokens (one definition for every caller): the fewer
        of the positions it embeds (``max_position_embeddings``; none for relative positions such as
        T5's) and the length its tokenizer declares (``model_max_length``, which transformers sets
        to a huge number where a tokenizer declares none)."""
        return int(min(self.tokenizer.model_max_length, self.config.get("max_position_embeddings") or 10**9))


def _config_dict(config: Any) -> dict:
    keep = ("model_type", "architectures", "num_hidden_layers", "num_attention_heads", "hidden_size",
            "intermediate_size", "max_position_embeddings", "vocab_size", "is_decoder", "type_vocab_size",
            "num_key_value_heads", "head_dim", "sliding_window", "attn_logit_softcapping", "is_encoder_decoder",
            "decoder_start_token_id")
    full = config.to_dict()
    return {k: full[k] for k in keep if k in full}


@functools.lru_cache(maxsize=4)
def load_model(model: str | os.PathLike | None = None, revision: str | None = None) -> LoadedModel:
    """Load (once per process) the model and fast tokenizer, with attnlab's capturing attention."""
    import transformers
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from attnlab.hf.capture_attention import ATTN_IMPLEMENTATION, register

    folder, model_id, rev = resolve(model, revision)
    register()
    transformers.utils.logging.disable_progress_bar()  # the CLI shows its own progress
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    for name in ("num_hidden_layers", "num_attention_heads"):
        if not isinstance(getattr(config, name, None), int):
            raise LookupError(f"model {model_id!r}: its config has no integer {name}; attnlab needs it to name heads")
    if not any(folder.glob("*.safetensors")):
        raise FileNotFoundError(f"model folder {str(folder)!r} has no .safetensors weights; attnlab loads only safetensors")
    net = AutoModel.from_pretrained(
        folder, attn_implementation=ATTN_IMPLEMENTATION, use_safetensors=True, trust_remote_code=False,
        local_files_only=True,
    )
    net.eval()
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
    if not getattr(tok, "is_fast", False):
        raise LookupError(f"model {model_id!r}: attnlab needs a fast tokenizer (tokenizer.json) for word boundaries")
    if tok.pad_token is None:  # GPT-2 has none; padded positions are masked out anyway
        tok.pad_token = tok.eos_token
    log.info("loaded %s (%s) from %s", model_id, rev, folder)
    return LoadedModel(
        model=net, tokenizer=tok, model_id=model_id, revision=rev, path=folder,
        num_layers=config.num_hidden_layers, num_heads=config.num_attention_heads,
        config=_config_dict(config),
    )
