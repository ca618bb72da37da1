"""Train attnlab's bundled offline decoder: a small Llama-style model on the docstrings of Python's standard library.

    PYTHONPATH=src python scripts/train_decoder.py [--out src/attnlab/transformer/decoder] [--steps 600]

Why this corpus: every machine that runs attnlab has it (no download), it is English prose about
code, and it is gathered the same way each time: the module list below is fixed and sorted, each
module's members are visited in sorted order, every docstring is cleaned with ``inspect.cleandoc``
and kept once. Every 20th docstring is held out for the evaluation. What changes the corpus is the
Python version (the standard library's docstrings change between releases): its sha256 and the
Python version are written to ``training.json`` beside the weights.

Why this model: a Llama-style decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU)
built from attnlab's own :class:`~attnlab.transformer.Transformer`, saved under transformers' Llama
tensor names, so that the same folder loads with ``Transformer.from_pretrained`` and with
transformers (``attnlab maps --model attnlab:decoder`` captures its maps through transformers).
The tokenizer is a byte-level BPE of 1,024 tokens (any text encodes, nothing is unknown) trained with
the ``tokenizers`` library on the training split.

Reproducible: the same corpus and seed on one machine give the same tokenizer and the same weights
(``torch.manual_seed``, one seeded generator for the batches, one thread, deterministic algorithms).
Across machines the floating-point order of the matrix products (the CPU's vector width, the BLAS
build) can differ, so the weights agree only to rounding, and the samples may differ after many steps.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import math
import sys
import time
import warnings
from pathlib import Path

# Pure-Python modules (and a few built-in ones) with much prose, importable everywhere without side
# effects. Sorted; changing it changes the corpus.
MODULES = sorted("""
abc argparse array ast asyncio base64 bdb binascii bisect builtins bz2 cmath code codeop compileall
contextvars doctest errno faulthandler gc getpass importlib.metadata importlib.resources multiprocessing
netrc pdb py_compile pydoc runpy unicodedata urllib.robotparser venv webbrowser wsgiref.simple_server
xml.sax xmlrpc.client zipapp calendar cmd codecs collections colorsys concurrent.futures
configparser contextlib copy csv dataclasses datetime decimal difflib dis email email.message enum
filecmp fnmatch fractions ftplib functools getopt gettext glob graphlib gzip hashlib heapq hmac html
html.parser http.client http.cookies http.server imaplib importlib inspect io ipaddress itertools json
keyword linecache locale logging logging.handlers lzma mailbox math mimetypes numbers operator
optparse os os.path pathlib pickle pickletools pkgutil platform plistlib poplib pprint profile pstats
queue quopri random re reprlib sched secrets selectors shelve shlex shutil signal smtplib socket
socketserver sqlite3 ssl stat statistics string struct subprocess symtable sys sysconfig tabnanny
tarfile tempfile textwrap threading time timeit token tokenize tomllib trace traceback tracemalloc
types typing unittest unittest.mock urllib.parse urllib.request uuid warnings wave weakref xml.dom.minidom
xml.etree.ElementTree zipfile zipimport zlib zoneinfo
""".split())

EOS = "<|endoftext|>"
# One thread: on a machine whose cores are shared, a pool of two spins at every barrier (a step of this
# model took 10x longer with two threads than with one there); one thread also fixes the order of sums.
THREADS = 1
VOCAB = 1024
CONTEXT = 128
HELD_OUT_EVERY = 20
CONFIG = dict(vocab_size=VOCAB, d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, d_ff=384, max_positions=CONTEXT,
              positions="rotary", norm="rmsnorm", norm_eps=1e-5, ffn="gated", activation="silu", bias=False,
              ffn_bias=False, causal=True, tie_embeddings=True, family="llama")


def docstrings() -> list[str]:
    """Every docstring of :data:`MODULES` (the module, its classes, functions and methods, those of its
    submodules included), each kept once, in order, then pydoc's help topics (the language reference).

    Gathered in a fresh interpreter that sees the standard library alone (``-I -S``): other packages
    change it when they are imported (transformers adds methods to ``logging.Logger``), so the same
    process would gather a different corpus after importing them."""
    import subprocess

    child = subprocess.run([sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--corpus"], check=True,
                           capture_output=True, text=True, encoding="utf-8")
    return json.loads(child.stdout)


def _gather() -> list[str]:
    from pydoc_data.topics import topics

    seen, out = set(), []

    def keep(obj: object) -> None:
        doc = inspect.getdoc(obj) if not isinstance(obj, str) else obj
        if doc and len(doc) >= 40 and doc not in seen:
            seen.add(doc)
            out.append(inspect.cleandoc(doc))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MODULES:
            try:
                mod = importlib.import_module(name)
            except ImportError:  # a module this build lacks (e.g. no sqlite3): the corpus hash says so
                continue
            keep(mod)
            for _, member in sorted(vars(mod).items()):
                home = getattr(member, "__module__", None) or ""
                if home != mod.__name__ and not home.startswith(mod.__name__ + "."):
                    continue
                if inspect.isclass(member):
                    keep(member)
                    for _, meth in sorted(vars(member).items()):
                        if inspect.isfunction(meth) or inspect.ismethoddescriptor(meth):
                            keep(meth)
                elif inspect.isfunction(member) or inspect.isbuiltin(member):
                    keep(member)
    for topic in sorted(topics):  # the language reference as help() shows it
        keep(topics[topic])
    return out


def split(docs: list[str]) -> tuple[list[str], list[str]]:
    """(training docstrings, held-out docstrings): every HELD_OUT_EVERY-th one is held out."""
    return ([d for i, d in enumerate(docs) if i % HELD_OUT_EVERY],
            [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY == 0])


def train_tokenizer(texts: list[str]):
    """A byte-level BPE of VOCAB tokens (EOS included) on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode(tok, texts: list[str]):
    """One long stream of ids: each docstring followed by EOS."""
    import torch

    eos = tok.token_to_id(EOS)
    ids = []
    for enc in tok.encode_batch(texts):
        ids += enc.ids + [eos]
    return torch.tensor(ids, dtype=torch.long)


def init(model) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, the residual projections scaled by 1/√(2L) (norms keep their ones).

    torch's defaults (N(0, 1) embeddings, tied to the output) start at a loss of ~180 nats instead of ln V."""
    import torch

    resid = 0.02 / math.sqrt(2 * model.config.num_layers)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, 0.0, resid if name.endswith(("attn.o.weight", "ffn.down.weight")) else 0.02)


def loss_of(model, x, y):
    import torch.nn.functional as F

    logits = model.logits(model(x))  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def held_out(model, stream, batch: int = 16) -> float:
    """Mean loss in nats per token over the held-out stream, in windows of CONTEXT tokens."""
    import torch

    n = (len(stream) - 1) // CONTEXT
    xs = stream[: n * CONTEXT].view(n, CONTEXT)
    ys = stream[1: n * CONTEXT + 1].view(n, CONTEXT)
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, batch):
            total += float(loss_of(model, xs[i:i + batch], ys[i:i + batch])) * len(xs[i:i + batch])
    return total / n


def unigram_nats(train, held) -> float:
    """Loss (nats per token) of the unigram model of the training stream (add-one) on the held-out stream."""
    import torch

    counts = torch.bincount(train, minlength=VOCAB).double() + 1
    logp = (counts / counts.sum()).log()
    return float(-logp[held].mean())


def train(steps: int, seed: int = 0, batch: int = 16, lr: float = 4e-3, evaluate: bool = True, log=print):
    """(model, tokenizer, report): the tokenizer and the model trained for ``steps`` AdamW steps
    (``evaluate``: with the held-out figures in the report)."""
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    try:
        return _train(steps, seed, batch, lr, evaluate, log)
    finally:  # a caller (a test) gets its settings back
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _train(steps: int, seed: int, batch: int, lr: float, evaluate: bool, log):
    import torch

    from attnlab.transformer import Transformer, TransformerConfig

    torch.manual_seed(seed)
    docs = docstrings()
    corpus = "\n".join(docs)
    train_docs, held_docs = split(docs)
    tok = train_tokenizer(train_docs)
    train_ids, held_ids = encode(tok, train_docs), encode(tok, held_docs)
    model = Transformer(TransformerConfig(**CONFIG), backend="torch").train()
    init(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    warm = max(1, steps // 20)
    start = time.perf_counter()
    for step in range(steps):
        scale = (step + 1) / warm if step < warm else 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))
        for group in opt.param_groups:
            group["lr"] = lr * (0.1 + 0.9 * scale) if step >= warm else lr * scale
        at = torch.randint(0, len(train_ids) - CONTEXT - 1, (batch,), generator=gen)  # (batch,)
        x = torch.stack([train_ids[i:i + CONTEXT] for i in at.tolist()])  # (batch, CONTEXT)
        y = torch.stack([train_ids[i + 1:i + CONTEXT + 1] for i in at.tolist()])
        loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            log(f"step {step:5d}  loss {loss.item():.3f}  {time.perf_counter() - start:6.0f} s")
    model.eval()
    if not evaluate:
        return model, tok, {}
    held_nats, uni = held_out(model, held_ids), unigram_nats(train_ids, held_ids)
    chars_per_token = sum(len(d) + 1 for d in held_docs) / len(held_ids)
    report = {
        "python": sys.version.split()[0], "modules": len(MODULES), "docstrings": len(docs),
        "corpus_chars": len(corpus), "corpus_sha256": hashlib.sha256(corpus.encode()).hexdigest(),
        "train_tokens": len(train_ids), "held_out_tokens": len(held_ids), "held_out_every": HELD_OUT_EVERY,
        "seed": seed, "steps": steps, "batch": batch, "context": CONTEXT, "lr": lr, "threads": THREADS,
        "train_seconds": round(time.perf_counter() - start, 1), "tokens_seen": steps * batch * CONTEXT,
        "held_out_nats_per_token": round(held_nats, 4), "unigram_nats_per_token": round(uni, 4),
        "held_out_bits_per_char": round(held_nats / math.log(2) / chars_per_token, 4),
        "unigram_bits_per_char": round(uni / math.log(2) / chars_per_token, 4),
    }
    return model, tok, report


def hf_state(model) -> dict:
    """The model's tensors under transformers' Llama names (the inverse of attnlab.transformer.weights' map), float16."""
    from attnlab.transformer.weights import LAYOUT

    layer_prefix, layer_names, top_names = LAYOUT["llama"]
    state = model.state_dict()
    out = {}
    for ours, theirs in top_names:
        out[f"model.{theirs}.weight"] = state[f"{ours}.weight"]
    for i in range(model.config.num_layers):
        for ours, theirs in layer_names:
            out[f"model.{layer_prefix.format(i=i)}{theirs}.weight"] = state[f"blocks.{i}.{ours}.weight"]
    return {k: v.detach().half().contiguous() for k, v in out.items()}


def hf_config(c) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "intermediate_size": c.d_ff,
        "max_position_embeddings": c.max_positions, "rope_theta": c.rope_theta, "rms_norm_eps": c.norm_eps,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
        # stored in float16 (half the file), computed in float32: transformers loads a model in the dtype
        # its config names, and a float16 forward on the CPU is slow and far from attnlab's
        "bos_token_id": None, "eos_token_id": 0, "pad_token_id": None, "torch_dtype": "float32",
    }


def save(model, tok, report: dict, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(model.config), indent=2) + "\n")
    save_file(hf_state(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "bos_token": None, "unk_token": None,
        "model_max_length": CONTEXT, "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "src/attnlab/transformer/decoder")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--corpus", action="store_true", help="print the corpus as JSON (what docstrings() runs)")
    args = ap.parse_args()
    if args.corpus:
        sys.stdout.write(json.dumps(_gather()))
        return
    model, tok, report = train(args.steps, seed=args.seed, log=lambda line: print(line, flush=True))
    save(model, tok, report, args.out)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
