#!/usr/bin/env bash
# What a GPU loan needs carried, built here on the CPU (docs/gpu.md): the stand-in's files for the 7.1M pair
# (scripts/gpu/gpu_standin.py) and the stand-in study, checked against the CPU study's puzzles; the v3 code-task
# study's data, checked against its kept results and gzipped; and the wheels.
#
#     bash scripts/gpu/gpu_prepare.sh      # -> data/sudoku-standin-gpu/ (32 MB), data/mini3-gpu/ (7 MB) and
#                                          #    gpu_wheels/ (11 MB), all gitignored
#
# Where data/sudoku-standin/ is missing it is built first (`prepare_data.py --source=standin`, about 23 minutes
# on 2 cores; it needs larsdoku, else it builds other hard puzzles and the check below refuses them).
# STANDIN=<dir> takes the stand-in from another folder; NO_WHEELS=1 skips the wheels (they need PyPI).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
STANDIN=${STANDIN:-data/sudoku-standin}
OUT=data/sudoku-standin-gpu

if [ ! -f "$STANDIN/test_hard.parquet" ]; then
    "$PY" prepare_data.py --source=standin --out_dir="$STANDIN"
fi
mkdir -p "$OUT"
# what training and evaluation read: the splits' arrays, meta.json and the three evaluation sets
for f in train.npy val.npy test.npy meta.json top1465.parquet test.parquet test_hard.parquet; do
    cp "$STANDIN/$f" "$OUT/$f"
done
# the puzzles the full protocol scores must be the CPU study's, or the two pairs are not read side by side
"$PY" scripts/gpu/gpu_standin.py --check_only --data_dir="$OUT"
# the v3 study's data as its GPU part reads it (study.py --study=v3 --prebuilt): what its runs read, checked against
# the pins of its kept results (and again on the device), gzipped to fit the 64 MiB carried; with the canonical
# solutions' outputs its judge caches, so that eight lanes do not compute them at once. Part T (mini3_t) reads the same
# files: v2's, byte for byte
if [ -f data/mini3/build.json ]; then
    "$PY" -c "from scripts.table2 import study as s; s.pack_prebuilt(s.study('v3', False), 'data/mini3-gpu')"
    if [ -d runs/mini3/p/gt_cache ]; then
        mkdir -p data/mini3-gpu/gt_cache && cp runs/mini3/p/gt_cache/groundtruth-*.json data/mini3-gpu/gt_cache/
    fi
else
    echo "gpu_prepare.sh: data/mini3 is not built (python scripts/table2/study.py --study=v3 builds it first), so the" \
         "GPU check's mini3_seeds part has no data to carry" >&2
fi
if [ "${NO_WHEELS:-0}" != 1 ]; then
    bash scripts/gpu/gpu_wheels.sh
fi
du -sh "$OUT" data/mini3-gpu gpu_wheels 2>/dev/null || true
