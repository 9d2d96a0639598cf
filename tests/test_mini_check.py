"""Table 2 in miniature's kept models (reference/mini/pretrain, reference/mini2/) and the check
(scripts/table2/mini_check.py) whose table docs/table2_miniature.md states.

The kept directories are bf16 copies of v2's checkpoints: each is verified against its manifest, holds the step
and objective the study ran (the fine-tunes: their step of lowest validation loss), and together with v1's kept
pretrained model, v3's B3 (reference/mini3/b3, once its study keeps it) and B3's stage copies they stay inside 40 MB. Decoding the kept models here must give, task by task,
what the study measured (results/mini_study_v2/): an independent record, written by another process, for the
fine-tunes from the fp32 checkpoints they were copied from. bf16 rounding and CPU differences may flip a close
confidence comparison, so a few tasks may differ.
"""
import glob
import json
import os
import re
import sys

import pytest
import torch
from safetensors import safe_open

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import fastdllm.sandbox  # noqa: E402
from fastdllm.model import SHA256_IN, load_fastdllm  # noqa: E402
from scripts.table2 import mini_check  # noqa: E402

KEPT = os.path.join(ROOT, "reference")
RESULTS = os.path.join(ROOT, "results", "mini_study_v2")
# kept directory -> (step of the checkpoint it copies, trained with the relay)
EXPECTED = {"mini/pretrain": (4000, False), "mini2/adapt": (400, False), "mini2/sft_s1": (300, False),
            "mini2/relay_s1": (300, True)}
# stages A and B, v2's seed-1 pair (20.8 MB), v3's B3 (about 5 MB) and, while B3 trains, the copies of its stage ends
# that later stages start from (5 MB each, removed when B3 is kept)
MAX_BYTES = 40 * 2**20
NFES, VERDICTS = 8, 3  # of 32 tasks (measured on the 2-core Intel Xeon: at most 4 NFEs and no verdict differ)


def sandbox_mode() -> str:
    try:
        return fastdllm.sandbox.choose_mode("auto").mode
    except ValueError:
        return "unsafe"


def test_kept_models_are_verified_bf16_copies_of_the_right_steps():
    """Fails when a kept directory is not the step the study ran (checked by keeping ckpt-150 instead of the
    chosen step, and by a B3 whose b3.json names another stop), is saved in fp32, lacks the mark that demands its manifest, or a Relay copy lost its relay LayerNorm."""
    stages = {os.path.relpath(f, KEPT): (int(f.rsplit("_", 1)[1]), False) for f in glob.glob(f"{KEPT}/mini3/b3_stage_*")}
    stop = os.path.join(ROOT, "results", "mini_study_v3", "b3.json")  # kept B3: the step its plateau rule stopped at
    if os.path.exists(stop):
        stages["mini3/b3"] = (json.load(open(stop))["stop"], False)
    for name, (step, relay) in (EXPECTED | stages).items():
        folder = os.path.join(KEPT, name)
        model, _ = load_fastdllm(folder, dtype=torch.bfloat16)  # refuses a file that differs from manifest.json
        with open(os.path.join(folder, "manifest.json")) as f:
            assert json.load(f)["step"] == step, name
        with safe_open(os.path.join(folder, "model.safetensors"), framework="pt") as f:
            assert f.metadata().get(SHA256_IN[0]) == SHA256_IN[1], f"{name}: a deleted manifest would go unnoticed"
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}, name
        assert bool(model.config.use_relay) == relay, name
        if relay:  # trained: the zero-initialised relay LayerNorm has moved
            assert float(model.relay_layer_norm.weight.detach().float().abs().sum()) > 0, name
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(KEPT, "mini*", "**"), recursive=True)
                if os.path.isfile(p))
    assert total <= MAX_BYTES, f"reference/mini*/ hold {total / 2**20:.1f} MB, over {MAX_BYTES / 2**20:.0f}"


def lowest_validation_loss(log: str) -> int:
    """The step of lowest val_loss in a run's kept train_metrics.jsonl (a tie goes to the later step)."""
    losses = {}
    with open(log) as f:
        for line in f:
            record = json.loads(line)
            if "val_loss" in record:
                losses[record["step"]] = record["val_loss"]
    best = min(losses.values())
    return max(step for step, loss in losses.items() if loss == best)


def test_the_kept_fine_tunes_are_their_runs_checkpoints_of_lowest_validation_loss():
    """Fails when the study keeps another checkpoint than the one validation chose (checked by keeping ckpt-250)."""
    for name in ("sft_s1", "relay_s1"):
        with open(os.path.join(KEPT, "mini2", name, "manifest.json")) as f:
            step = json.load(f)["step"]
        assert step == lowest_validation_loss(os.path.join(RESULTS, name, "train_metrics.jsonl")), name


def test_the_kept_models_decode_the_study_s_test_tasks_as_it_measured():
    """The first 32 test tasks of held-out compositions, rebuilt without the corpus, decoded at tau 0.85 from the
    kept bf16 copies as the v2 study decoded them (batch, length, the carry for Relay), against the study's
    per-task records. Each task's NFE ranges 40-137, so the tasks must be the study's, in its order, at its length:
    fails when decoded with v1's 128 new tokens (27 of 32 of stage B's NFEs differ; checked), with tasks drawn
    from another seed or in another wording (checked with the first stage B), when Relay decodes without its carry
    (26 of 32 NFEs differ; checked), or when a model is read against another's record (SFT against Relay's: 32;
    checked). bf16 rounding moved 4 of SFT's 32 NFEs and 2 of Relay's, and no verdict."""
    n = 32
    records, study = mini_check.main([f"--n={n}", f"--sandbox={sandbox_mode()}"])
    assert list(records) == ["Fast-dLLM v2 (stage B)", "Vanilla SFT", "Relay"]
    for label, here in records.items():
        there = study[label]
        assert there is not None, f"no study record for {label} in results/mini_study_v2"
        assert here["task_ids"] == [f"mini2/test/{i}" for i in range(n)] == there["task_ids"]
        nfes = sum(a != b for a, b in zip(here["nfe"], there["nfe"]))
        verdicts = sum(a != b for a, b in zip(here["plus"], there["plus"]))
        assert nfes <= NFES and verdicts <= VERDICTS, f"{label}: {nfes} NFE and {verdicts} verdicts of {n} tasks differ from the study"


def readme_rows() -> dict[str, tuple[float, ...]]:
    """docs/table2_miniature.md's table printed by `python scripts/table2/mini_check.py`: {model: (base, plus, NFE)}."""
    text = open(os.path.join(ROOT, "docs", "table2_miniature.md"), encoding="utf-8").read()
    section = text.split("`python scripts/table2/mini_check.py` prints", 1)[1]
    rows = {}
    for label in ("Fast-dLLM v2 (stage B)", "Vanilla SFT", "Relay"):
        m = re.search(r"^\| " + re.escape(label) + r" \| ([\d.]+)% \| ([\d.]+)% \| ([\d.]+) \|", section, re.M)
        assert m, f"docs/table2_miniature.md's mini_check table has no row for {label}"
        rows[label] = tuple(float(x) for x in m.groups())
    return rows


@pytest.mark.slow
def test_the_readme_states_what_mini_check_prints():
    """mini_check.py as a user runs it (100 tasks): its numbers are the ones docs/table2_miniature.md states."""
    records, _ = mini_check.main([f"--sandbox={sandbox_mode()}"])
    for label, (base, plus, nfe) in readme_rows().items():
        got = mini_check.columns(records[label])
        assert abs(got[0] - base) <= 2 and abs(got[1] - plus) <= 2 and abs(got[2] - nfe) <= 0.5, (label, got)
