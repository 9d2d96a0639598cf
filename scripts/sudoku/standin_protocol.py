"""What the stand-in study scores and where it keeps each result: shared by the study, which writes them
(scripts/sudoku/standin_study.py), and its report, which reads them (scripts/sudoku/standin_report.py).

Layout of the kept results: <out>/<run>/<set>/<protocol>_<equivalents>.json, one sample.py --out file
(with --per_puzzle) per run (<objective>_s<seed>), puzzle set, protocol and training compute in MLM-step
equivalents.
"""
import os
import re

# the puzzle file in the data directory of each set
SETS = {"Top1465": "top1465.parquet", "test": "test.parquet", "test hard cohort": "test_hard.parquet"}
# the protocols: the τs swept and the first n puzzles of each set scored (n = 0: all of them); light at
# every kept step, full at the last one
LIGHT = {"taus": (0.02, 0.05, 0.15, 0.25), "n": {"Top1465": 200, "test": 400, "test hard cohort": 130}}
FULL = {"taus": (0.01, 0.02, 0.05, 0.10, 0.15, 0.25), "n": {"Top1465": 500, "test": 1000, "test hard cohort": 0}}
RUN = re.compile(r"^(mlm|rollout|relay_sg|relay)_s(\d+)$")
FILE = re.compile(r"^(light|full)_(\d+)\.json$")


def slug(name: str) -> str:
    return re.sub(r"\W+", "_", name).strip("_").lower()


def result_path(out: str, run: str, set_name: str, protocol: str, equivalents: int) -> str:
    return os.path.join(out, run, slug(set_name), f"{protocol}_{equivalents}.json")
