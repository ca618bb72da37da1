"""Train attnlab's bundled long-context decoder, attnlab:decoder-long: a Llama-style model that reads 2,048
tokens, trained at that length on the source files of Python's standard library.

    PYTHONPATH=src python scripts/train_decoder_long.py [--out src/attnlab/transformer/decoder_long]
        [--steps N] [--until K] [--minutes M] [--threads T] [--size NAME] [--init FOLDER]
        [--context N] [--plant SHARE --plant-kind periodic|pairs] [--repeat SHARE] [--spans N]

Why this corpus: every machine that runs attnlab has it (no download), and source code has what a
long context is for: identifiers defined near the top of a file and used thousands of tokens later.
It is gathered the same way each time: every ``*.py`` file under the interpreter's standard library
folder (``sysconfig.get_paths()["stdlib"]``), in sorted order of its path, read whole as Python reads
it (``tokenize.open``: the coding cookie is honoured), except the folders in :data:`SKIP` (tests,
installed packages, and two folders of generated tables and text). Every 20th file is held out.
The Python version and the corpus's sha256 are written to ``training.json``.

The tokenizer is a byte-level BPE of :data:`VOCAB` tokens trained on the training files. Windows of
CONTEXT tokens are drawn at random from the training files joined by EOS (a window may cross from
one file into the next, as in pretraining). The held-out figures cut the held-out files, joined the
same way, into windows that start every 256 tokens (so each token is scored at 8 positions of a window),
and report the loss at every position: a model that uses its context loses less at position 1,500 than at
position 50 on the same tokens.

Reading far back has to be taught: trained on the text alone (7.5 M tokens, then 6 M more; with stretches of
its own text written again, ``--repeat``), this small model learned to use about its last 256 tokens and no
more. A curriculum forms an induction head first: ``--context 128 --plant 0.5 --plant-kind periodic`` (half the
windows carry a stretch of random ids written again and again: only reading back predicts them), then
``--context 2048 --plant 0.5 --plant-kind pairs`` (random stretches written twice at any distance, among the
text) carries it to 2,048 tokens (``decoder_training.planted``; the commands are in docs/generation.md).

Budget: ``--steps`` sets the learning-rate schedule (warmup, then a cosine to the last step);
``--minutes`` stops a run early when the wall clock says so, and ``training.json`` records the steps
that ran. ``--until K`` stops after K steps: ``--steps N --until K`` reproduces a run that the clock
stopped at step K. A checkpoint (the whole folder, without the held-out figures) is written every
``--checkpoint-minutes``, so that a run cut short leaves a usable model; ``--evaluate`` computes the
figures for a saved folder. Reproducibility is that of ``train_decoder.py``: the same corpus, seed
and thread count on one machine give the same tokenizer and weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
import tokenize
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decoder_training as shared  # the machinery both bundled decoders share

# Folders left out: tests (much generated and adversarial text), installed packages (not the standard
# library), the codecs' generated charmap tables (encodings) and pydoc's generated help text.
SKIP = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings", "pydoc_data"}
HELD_OUT_EVERY = 20
VOCAB = 4096
CONTEXT = 2048
BUCKETS = ((0, 128), (128, 512), (512, 2048))
EVAL_STRIDE = 256  # held-out windows start this many tokens apart: each token is scored at 8 positions
# Model sizes the pilot compared (tokens per second on two shared cores); the default is the one trained.
SIZES = {
    "s": {"d_model": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "d_ff": 384},
    "m": {"d_model": 192, "num_layers": 4, "num_heads": 6, "num_kv_heads": 2, "d_ff": 512},
    "l": {"d_model": 256, "num_layers": 6, "num_heads": 8, "num_kv_heads": 2, "d_ff": 704},
}
COMMON = {"vocab_size": VOCAB, "max_positions": CONTEXT, "positions": "rotary", "norm": "rmsnorm", "norm_eps": 1e-5,
          "ffn": "gated", "activation": "silu", "bias": False, "ffn_bias": False, "causal": True,
          "tie_embeddings": True, "family": "llama"}
OUT = Path(__file__).resolve().parents[1] / "src/attnlab/transformer/decoder_long"


def source_files(root: Path | None = None) -> list[tuple[str, str]]:
    """(path relative to the standard library folder, text) of every source file of the corpus, in sorted order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if SKIP & set(rel.parts[:-1]):
            continue
        try:
            with tokenize.open(path) as f:
                out.append((rel.as_posix(), f.read()))
        except (SyntaxError, UnicodeDecodeError):  # a file Python could not read either: left out, the hash says so
            continue
    return out


def split(files: list) -> tuple[list, list]:
    """(training files, held-out files): every HELD_OUT_EVERY-th file (from the 10th on) is held out."""
    return ([f for i, f in enumerate(files) if i % HELD_OUT_EVERY != 10],
            [f for i, f in enumerate(files) if i % HELD_OUT_EVERY == 10])


def corpus_sha256(files: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for name, text in files:
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def data(log=print):
    """(tokenizer, training stream, held-out stream, facts about the corpus)."""
    files = source_files()
    train_files, held_files = split(files)
    start = time.perf_counter()
    tok = shared.train_tokenizer([t for _, t in train_files], VOCAB)
    train_ids = shared.encode(tok, [t for _, t in train_files])
    held_ids = shared.encode(tok, [t for _, t in held_files])
    log(f"{len(files)} files, {len(train_ids)} training tokens, {len(held_ids)} held out "
        f"(tokenizer and encoding: {time.perf_counter() - start:.0f} s)")
    facts = {
        "python": sys.version.split()[0], "corpus": "the standard library's *.py files (scripts/train_decoder_long.py)",
        "files": len(files), "held_out_files": [n for n, _ in held_files], "corpus_chars": sum(len(t) for _, t in files),
        "corpus_sha256": corpus_sha256(files), "held_out_every": HELD_OUT_EVERY, "vocab": VOCAB,
        "train_tokens": len(train_ids), "held_out_tokens": len(held_ids),
        "held_out_chars_per_token": round(sum(len(t) + 1 for _, t in held_files) / len(held_ids), 4),
    }
    return tok, train_ids, held_ids, facts


def figures(model, train_ids, held_ids, chars_per_token: float) -> dict:
    """The held-out loss overall, by position bucket and in steps of 128 positions, with bits per character.

    Windows of CONTEXT tokens start every EVAL_STRIDE tokens of the held-out stream, so every token is scored
    at CONTEXT / EVAL_STRIDE positions (once in each 256-position step, but near the stream's ends): the
    positions' means are over the same tokens, and differ by the context before them, not by which text
    happens to sit at the start of a window (whole windows from the stream's start, 89 of them, left the
    buckets to the content: a file's first lines sit at a window's start more often than at its end)."""
    by_pos = shared.losses_by_position(model, held_ids, CONTEXT, batch=4, stride=EVAL_STRIDE)
    nats, uni = float(by_pos.mean()), shared.unigram_nats(train_ids, held_ids, VOCAB)
    bpc = lambda n: round(n / math.log(2) / chars_per_token, 4)
    return {
        "held_out_windows": len(shared.windows(held_ids, CONTEXT, EVAL_STRIDE)[0]), "held_out_window_stride": EVAL_STRIDE,
        "held_out_nats_per_token": round(nats, 4), "unigram_nats_per_token": round(uni, 4),
        "held_out_bits_per_char": bpc(nats), "unigram_bits_per_char": bpc(uni),
        "held_out_nats_by_position": {f"{a}-{b - 1}": round(float(by_pos[a:b].mean()), 4) for a, b in BUCKETS},
        "held_out_nats_per_128_positions": [round(float(by_pos[a:a + 128].mean()), 4) for a in range(0, CONTEXT, 128)],
        "held_out_copy_nats": copying(model, held_ids),
    }


def copying(model, held_ids, distances=(100, 400, 1500), length: int = 48, samples: int = 16) -> dict:
    """Does the model read back? ``samples`` stretches of ``length`` held-out tokens, each written again
    ``distance`` tokens after it (over the text that was there): the mean loss (nats per token, the
    stretch's first token left out) of the first copy and of the second, per distance. A model that copies
    (an induction head) pays far less for the second; one that reads only nearby text pays about the same,
    or more, since the second copy breaks the text before it."""
    import torch

    out = {}
    with torch.no_grad():
        for distance in distances:
            gen, first, second = torch.Generator().manual_seed(123), 0.0, 0.0
            for _ in range(samples):
                at = int(torch.randint(0, len(held_ids) - distance - length - 200, (1,), generator=gen))
                x = held_ids[at:at + 64 + distance + length].clone()  # 64 tokens of context, then the stretch
                x[64 + distance:] = held_ids[at + 64:at + 64 + length]
                nats = shared.token_losses(model, x[None, :-1], x[None, 1:])[0]
                first += float(nats[64:64 + length - 1].mean())
                second += float(nats[64 + distance:].mean())
            out[str(distance)] = {"first": round(first / samples, 3), "second": round(second / samples, 3)}
    return out


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} logical CPUs)"
    except OSError:
        pass
    import platform

    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} logical CPUs)"


def run(args, log=print) -> None:
    import torch

    from attnlab.transformer import Transformer, TransformerConfig

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    tok, train_ids, held_ids, facts = data(log)
    config = TransformerConfig(**SIZES[args.size], **COMMON)
    model = Transformer(config, backend=args.backend).train()
    shared.init(model)
    before = continue_from(model, args.init, args.backend) if args.init else None
    params = sum(p.numel() for p in model.parameters())
    log(f"size {args.size}: {params / 1e6:.2f} M parameters, {args.threads} thread(s), backend {args.backend}")
    report = {**facts, "size": args.size, "parameters": params, "seed": args.seed, "schedule_steps": args.steps,
              "batch": args.batch, "repeat": args.repeat, "spans": args.spans, "plant": args.plant,
              "plant_kind": args.plant_kind, "context": args.context, "lr": args.lr, "threads": args.threads,
              "backend": args.backend, "cpu": cpu(), "torch": torch.__version__}
    earlier = before["tokens_seen"] if before else 0
    if before:  # a second phase: what the first ran, and its command's numbers
        kept = ("seed", "schedule_steps", "steps", "lr", "tokens_seen", "train_seconds", "threads", "batch", "context",
                "repeat", "spans", "plant", "plant_kind", "held_out_nats_by_position", "held_out_copy_nats", "continued_from")
        report["continued_from"] = {k: before[k] for k in kept if k in before}

    def checkpoint(done: int) -> None:
        shared.save(model, tok, {**report, "steps": done, "tokens_seen": earlier + done * args.batch * args.context,
                                 "checkpoint": True}, args.out)
        log(f"checkpoint at step {done} in {args.out}")

    ran = shared.fit(model, train_ids, steps=args.steps, batch=args.batch, context=args.context, lr=args.lr,
                     seed=args.seed, log=log, until=args.until, minutes=args.minutes, every=10,
                     checkpoint=checkpoint, checkpoint_s=60 * args.checkpoint_minutes, repeat=args.repeat, spans=args.spans,
                     plant=args.plant, plant_kind=args.plant_kind)
    model.eval()
    seen = ran["steps"] * args.batch * args.context
    report.update(steps=ran["steps"], tokens_seen=earlier + seen, train_seconds=ran["seconds"],
                  tokens_per_second=round(seen / max(ran["seconds"], 1e-9), 1))
    if ran["steps"] < args.steps:
        report["stopped"] = (f"after {ran['steps']} of {args.steps} scheduled steps (--minutes {args.minutes}); "
                             f"reproduce with --steps {args.steps} --until {ran['steps']}")
    if args.no_eval:
        shared.save(model, tok, report, args.out)
        return
    start = time.perf_counter()
    report.update(figures(model, train_ids, held_ids, facts["held_out_chars_per_token"]))
    report["eval_seconds"] = round(time.perf_counter() - start, 1)
    shared.save(model, tok, report, args.out)
    log(json.dumps({k: v for k, v in report.items() if k != "held_out_files"}, indent=2))


def continue_from(model, folder: Path, backend: str) -> dict:
    """Load the weights of a saved folder (an earlier phase) into ``model``; its training.json."""
    from attnlab.transformer import Transformer

    saved = Transformer.from_pretrained(folder, backend=backend)
    model.load_state_dict(saved.state_dict())
    return json.loads((folder / "training.json").read_text())


def evaluate(folder: Path, threads: int, log=print) -> None:
    """Add the held-out figures to a saved folder's training.json (a checkpoint's, or to check a run)."""
    import torch

    from attnlab.transformer import Transformer

    torch.set_num_threads(threads)
    report = json.loads((folder / "training.json").read_text())
    _, train_ids, held_ids, facts = data(log)
    if facts["corpus_sha256"] != report["corpus_sha256"]:
        log(f"note: this corpus ({facts['corpus_sha256'][:12]}) is not the one trained on ({report['corpus_sha256'][:12]})")
    model = Transformer.from_pretrained(folder, backend="sdpa").eval()  # float32 from the float16 file; SDPA: ~4x faster here
    start = time.perf_counter()
    report.update(figures(model, train_ids, held_ids, facts["held_out_chars_per_token"]))
    report["eval_seconds"] = round(time.perf_counter() - start, 1)
    (folder / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    log(json.dumps({k: v for k, v in report.items() if k != "held_out_files"}, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--size", choices=sorted(SIZES), default="s")
    ap.add_argument("--steps", type=int, default=720, help="the schedule's length (warmup, cosine to the last step)")
    ap.add_argument("--until", type=int, default=None, help="stop after this many steps (default: --steps)")
    ap.add_argument("--minutes", type=float, default=None, help="stop when this much wall time has passed")
    ap.add_argument("--checkpoint-minutes", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=2, help="windows per step")
    ap.add_argument("--context", type=int, default=CONTEXT, help="tokens per training window (the model and its "
                    "held-out figures keep 2,048: a shorter window is a curriculum phase)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--repeat", type=float, default=0.0, help="the share of windows in which one stretch of 16-256 "
                    "tokens is written again further on (decoder_training.repeated): rewards reading far back")
    ap.add_argument("--spans", type=int, default=1, help="stretches written again in each such window")
    ap.add_argument("--plant", type=float, default=0.0, help="the share of windows carrying random-token stretches "
                    "written again (decoder_training.planted): forms an induction head")
    ap.add_argument("--plant-kind", choices=("pairs", "periodic"), default="pairs",
                    help="periodic: one stretch repeated to the window's end; pairs: --spans stretches, each twice")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", default="sdpa", help="attnlab attention backend for training (sdpa: torch's fused CPU "
                    "kernel, ~4x the torch backend's speed at 2,048 tokens in the pilot)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", type=Path, default=None, help="start from this saved folder's weights (a second phase; "
                    "its training.json is kept under continued_from)")
    ap.add_argument("--no-eval", action="store_true", help="skip the held-out figures (a pilot)")
    ap.add_argument("--evaluate", type=Path, default=None, help="only add the held-out figures to this saved folder")
    args = ap.parse_args()
    for name in ("steps", "batch", "threads", "spans"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in ("repeat", "plant"):
        if not 0 <= getattr(args, name) <= 1:
            ap.error(f"--{name} is a share of windows, from 0 to 1, got {getattr(args, name)}")
    if not 128 <= args.context <= CONTEXT:
        ap.error(f"--context must be from 128 to {CONTEXT} tokens, got {args.context}")
    if args.plant and args.plant_kind == "pairs" and args.context < 160:
        ap.error(f"--plant-kind pairs writes stretches of up to 64 tokens twice: --context must be at least 160, got {args.context}")
    log = lambda line: print(line, flush=True)
    if args.evaluate is not None:
        evaluate(args.evaluate, args.threads, log)
    else:
        run(args, log)


if __name__ == "__main__":
    main()
