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
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decoder_training as shared  # the machinery both bundled decoders share
from decoder_training import encode, init, save, unigram_nats

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
    return shared.train_tokenizer(texts, VOCAB)


def held_out(model, stream) -> float:
    """Mean loss in nats per token over the held-out stream, in windows of CONTEXT tokens."""
    return float(shared.losses_by_position(model, stream, CONTEXT).mean())


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
    ran = shared.fit(model, train_ids, steps=steps, batch=batch, context=CONTEXT, lr=lr, seed=seed, log=log)
    model.eval()
    if not evaluate:
        return model, tok, {}
    held_nats, uni = held_out(model, held_ids), unigram_nats(train_ids, held_ids, VOCAB)
    chars_per_token = sum(len(d) + 1 for d in held_docs) / len(held_ids)
    report = {
        "python": sys.version.split()[0], "modules": len(MODULES), "docstrings": len(docs),
        "corpus_chars": len(corpus), "corpus_sha256": hashlib.sha256(corpus.encode()).hexdigest(),
        "train_tokens": len(train_ids), "held_out_tokens": len(held_ids), "held_out_every": HELD_OUT_EVERY,
        "seed": seed, "steps": steps, "batch": batch, "context": CONTEXT, "lr": lr, "threads": THREADS,
        "train_seconds": ran["seconds"], "tokens_seen": steps * batch * CONTEXT,
        "held_out_nats_per_token": round(held_nats, 4), "unigram_nats_per_token": round(uni, 4),
        "held_out_bits_per_char": round(held_nats / math.log(2) / chars_per_token, 4),
        "unigram_bits_per_char": round(uni / math.log(2) / chars_per_token, 4),
    }
    return model, tok, report


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
