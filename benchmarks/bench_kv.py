"""Every smaller KV cache on one scale: attnlab.kv_report on a real text, the table, JSON and the Pareto plot.

The model reads the first P tokens of the text as its prompt, then the next N one at a time (teacher-forced);
each setting (dense float32 and bfloat16, the quantized dtypes the cache offers, h2o/snapkv/knorm/random at 25 %
and 50 % of P + N) runs in float32 and is scored against the same model in float64 with a dense cache. The
text defaults to the source of the standard library's ``textwrap`` module (code and comments: every machine
has it, and attnlab:decoder was trained on docstrings, not on this file as a whole).

    python benchmarks/bench_kv.py [--model attnlab:decoder] [--text FILE] [--prompt-tokens 96] [--scored-tokens 32] [--threads 1]

Writes benchmarks/results/kv_<model>.json and .png; prints the table. Step times are medians within one run,
side by side; compare them as ratios, and only on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import textwrap
from dataclasses import replace
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="attnlab:decoder")
    ap.add_argument("--text", default=textwrap.__file__)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--scored-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (one: a tiny model's step is dominated "
                                                           "by thread start-up, and by contention on a busy machine)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)

    from attnlab.cli.common import print_table
    from attnlab.cli.kv import _table
    from attnlab.interventions.kv_report import kv_report
    from attnlab.transformer import Transformer
    from attnlab.viz.kvplot import kv_figure

    model = Transformer.from_pretrained(args.model)
    text = Path(args.text).read_text(encoding="utf-8")
    report = replace(kv_report(model, text, prompt_tokens=args.prompt_tokens, scored_tokens=args.scored_tokens),
                     model=args.model)
    print_table(_table(report))
    for line in report.skipped:
        print("skipped", line)
    stem = RESULTS / f"kv_{args.model.replace(':', '_').replace('/', '_')}"
    out = {**report.to_dict(), "text": os.path.basename(args.text), "cpu": platform.processor() or platform.machine(),
           "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg()[0]}
    stem.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    kv_figure(report.to_dict()).savefig(stem.with_suffix(".png"), dpi=110)
    print(f"wrote {stem}.json and .png (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
