"""What the Table 2 miniature studies keep, and how every reader checks it.

Results: one JSON per (model, step, protocol, tau) in a study's out folder (result_path), compacted from eval_code.py's
output (compact): per task the base / plus verdicts, the NFE, the answer's tokens and blocks; stamped with the study,
the data file's sha256, the decoded model's manifest digest, a digest of its task ids and of its whole content (stamp).
read_kept and load check each one against its name, its fields, the study's data pins and its digests, and refuse a
mismatch in one line naming the file and the field.

Models: a bf16 copy of a run's checkpoint (keep), verified file by file against its manifest (verify_kept), from
which the next stage starts; and the training runs themselves (finetune, resumed from their last save).
"""
import hashlib
import json
import math
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import common  # noqa: E402
from scripts import runs  # noqa: E402

PY = sys.executable
RESULT_KEYS = ("pass1_base", "pass1_plus_authors", "pass1_plus_evalplus", "mean_nfe")  # eval_code.py's summary, kept


# -----------------------------------------------------------------------------
# results


# what the report reads from each kept JSON; base, plus and nfe hold one value per task id
KEPT_FIELDS = ("model", "step", "tau", "protocol", "task_ids", "base", "plus", "nfe")


def result_path(out: str, model: str, step: int, tau: float, protocol: str) -> str:
    return os.path.join(out, model, result_name(step, tau, protocol))


def read_jsonl(path: str) -> list[dict]:
    """The rows of a JSON-lines file; a line cut short stops the script in one line naming the file and line."""
    with open(path) as f:
        lines = [(number, line) for number, line in enumerate(f, 1) if line.strip()]
    rows = []
    for number, line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path} line {number} is cut short or not JSON ({e})") from None
    return rows


METRIC_NUMBERS = ("loss", "lr", "grad_norm", "clipped", "tokens_per_s", "val_loss", "new_rows", "finished_rows",
                  "distinct_rows", "mask_ratio", "relay_gamma_norm", "relay_h_norm")


def read_metrics(path: str) -> list[dict]:
    """A run's kept train_metrics.jsonl, checked: records with increasing whole steps, numbers where numbers are
    logged, and throughput logged at least once; else one line naming the file, the line and the field."""
    rows = read_jsonl(path)
    if not rows:
        raise SystemExit(f"{path} holds no records: restore it (git checkout), or copy it again from the run")
    last = 0
    for number, r in enumerate(rows, 1):
        bad = None
        if not isinstance(r, dict) or not isinstance(r.get("step"), int) or isinstance(r.get("step"), bool):
            bad = "step: missing or not a whole number"
        elif r["step"] <= last:
            bad = f"step: {r['step']} does not follow {last}"
        else:
            bad = next((f"{k}: not a number" for k in METRIC_NUMBERS if k in r and not _is_number(r[k])), None)
        if bad:
            raise SystemExit(f"{path} line {number}: {bad}: restore it (git checkout), or copy it again from the run")
        last = r["step"]
    if not any("tokens_per_s" in r for r in rows):
        raise SystemExit(f"{path}: tokens_per_s: logged in no record: restore it (git checkout)")
    return rows


def read_json(path: str, fields: tuple[str, ...]) -> dict:
    """A small kept JSON (b3.json, regime.json) with the fields a reader needs, or one line naming what is wrong."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path} cannot be read ({e}): restore it (git checkout)") from None
    missing = [k for k in fields if not isinstance(record, dict) or k not in record]
    if missing:
        raise SystemExit(f"{path} lacks the field {', '.join(missing)}: restore it (git checkout)")
    return record


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# what every kept result must hold, field by field: (rule, its test); per-task lists also one value per task id
FIELD_RULES = {
    "model": ("a run name (text)", lambda v: isinstance(v, str) and bool(v)),
    "step": ("a whole number of steps >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "tau": ("a threshold in (0, 1]", lambda v: _is_number(v) and 0 < v <= 1),
    "protocol": ("the protocol's name (text)", lambda v: isinstance(v, str) and bool(v)),
    "task_ids": ("a list of task ids (text)", lambda v: isinstance(v, list) and bool(v) and all(isinstance(t, str) for t in v)),
    "base": ("a list of 0 / 1 verdicts", lambda v: isinstance(v, list) and all(x in (0, 1) and not isinstance(x, float) for x in v)),
    "plus": ("a list of 0 / 1 verdicts", lambda v: isinstance(v, list) and all(x in (0, 1) and not isinstance(x, float) for x in v)),
    "nfe": ("a list of forward-pass counts (numbers)", lambda v: isinstance(v, list) and all(_is_number(x) and x >= 0 for x in v)),
}


PER_TASK = ("base", "plus", "nfe", "tokens", "blocks")


def result_problem(record, file_name: str, folder: str | None) -> str | None:
    """What is wrong with a kept result, as '<field>: <why>', or None. Its name must be the one its own fields give:
    folder = model and file = step_<step>_<protocol>_tau_<tau>.json (folder None: a layout that names its files
    otherwise, checked by its caller); a stamped result's digests must match its content."""
    if not isinstance(record, dict):
        return "the file: not a JSON object"
    for key, (rule, ok) in FIELD_RULES.items():
        if key not in record:
            return f"{key}: missing"
        if not ok(record[key]):
            return f"{key}: must be {rule}, got {str(record[key])[:40]}"
    for key in PER_TASK:
        if key in record and (not isinstance(record[key], list) or len(record[key]) != len(record["task_ids"])):
            return f"{key}: does not hold one value per task id ({len(record['task_ids'])})"
    if "n" in record and record["n"] != len(record["task_ids"]):
        return f"n: {record['n']}, but the result holds {len(record['task_ids'])} task ids"
    if folder is not None and folder != record["model"]:
        return f"model: {record['model']!r}, but the file is in {folder}/"
    if folder is not None and file_name != result_name(record["step"], record["tau"], record["protocol"]):
        return (f"step/protocol/tau: the fields say {result_name(record['step'], record['tau'], record['protocol'])}, "
                f"the file is named {file_name}")
    if "digest" in record:
        if record.get("task_digest") != task_digest(record["task_ids"]):
            return "task_digest: does not match the task ids"
        if record["digest"] != content_digest(record):
            return "digest: does not match the content (a field was edited after the result was kept)"
    return None


def result_name(step: int, tau: float, protocol: str) -> str:
    return f"step_{step}_{protocol}_tau_{tau:g}.json"


def read_kept(path: str, named_by_fields: bool = True) -> dict:
    """One kept result, checked field by field and against its own name (result_problem): a file cut short by a
    killed study, one written by another version, or one renamed or edited, stops the reader in one line naming
    the file and the field, instead of a traceback or a silently wrong report."""
    redo = "restore it (git checkout), or delete it and the study decodes it again"
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path} is cut short or not JSON ({e}): {redo}") from None
    folder = os.path.basename(os.path.dirname(os.path.abspath(path))) if named_by_fields else None
    problem = result_problem(record, os.path.basename(path), folder)
    if problem:
        raise SystemExit(f"{path}: {problem}: {redo}")
    return record


def compact(eval_dir: str, path: str, meta: dict) -> dict:
    """eval_code.py's out_dir (results.json, samples.jsonl, judged.jsonl) as one small JSON at path: per task the
    verdicts, the NFE, the answer's tokens and the blocks it was decoded in (when eval_code.py recorded them); with
    meta's "digest" key, the record is stamped (task_digest, then digest of its whole content: stamp)."""
    with open(os.path.join(eval_dir, "results.json")) as f:
        summary = json.load(f)
    samples = {r["task_id"]: r for r in read_jsonl(os.path.join(eval_dir, "samples.jsonl"))}
    judged = {r["task_id"]: r for r in read_jsonl(os.path.join(eval_dir, "judged.jsonl"))}
    ids = sorted(samples, key=lambda t: (t.split("/")[1], int(t.rsplit("/", 1)[1])))
    judged_in = {"sandbox": summary["sandbox"]} if "sandbox" in summary else {}  # how the programs were isolated
    record = dict(meta, **{k: summary[k] for k in RESULT_KEYS}, **judged_in, n=len(ids), task_ids=ids,
                  base=[int(bool(judged[t]["base"])) for t in ids],
                  plus=[int(bool(judged[t]["plus_inputs"])) for t in ids], nfe=[samples[t]["nfe"] for t in ids])
    if all("blocks" in samples[t] for t in ids):
        record.update(tokens=[samples[t]["n_tokens"] for t in ids], blocks=[samples[t]["blocks"] for t in ids])
    if "digest" in meta:
        record = stamp(record)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)
    return record


def task_digest(task_ids: list[str]) -> str:
    """sha256 of the task ids in the record's order, one per line: which tasks a result claims to score."""
    return hashlib.sha256("\n".join(task_ids).encode()).hexdigest()


def content_digest(record: dict) -> str:
    """sha256 of the record's canonical JSON without its digest field: any edit of a field changes it."""
    body = {k: v for k, v in record.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def stamp(record: dict) -> dict:
    """The record with its task_digest and digest set."""
    record = dict(record, task_digest=task_digest(record["task_ids"]))
    return dict(record, digest=content_digest(record))


def load(out: str, tasks: dict[str, int] | None = None, stamped: bool = False,
         pins: dict[str, str] | None = None) -> list[dict]:
    """Every kept result under out (out/<model>/step_*.json), each checked (read_kept). tasks: the number of tasks
    each protocol decodes, checked with the ids' order (<study>/<split>/0, 1, ...); stamped: every result must
    carry its digests; pins: {data file: sha256},
    which a stamped result's data file must match."""
    found = []
    for model in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        folder = os.path.join(out, model)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if name.startswith("step_") or name.endswith(".json"):
                path = os.path.join(folder, name)
                record = read_kept(path)
                problem = task_problem(record, tasks) if tasks else None
                if stamped and "digest" not in record:
                    problem = "digest: missing (every kept result carries its digests)"
                problem = problem or (pin_problem(record, pins) if pins else None)
                if problem:
                    raise SystemExit(f"{path}: {problem}: restore it (git checkout), or delete it and the study "
                                     "decodes it again")
                found.append(record)
    return found


def pin_problem(record: dict, pins: dict[str, str]) -> str | None:
    """Whether a stamped result decoded the data its study pinned (data file and sha256)."""
    if "data_sha256" not in record:
        return None
    if record.get("data_file") not in pins:
        return f"data_file: {record.get('data_file')!r} is not among the study's pinned files"
    if record["data_sha256"] != pins[record["data_file"]]:
        return f"data_sha256: not the pinned {record['data_file']} (the result scored other data)"
    return None


def task_problem(record: dict, tasks: dict[str, int]) -> str | None:
    """Whether a result scores the protocol's task set: its count, and the ids the data files give in order."""
    want = tasks.get(record["protocol"])
    if want is None:
        return f"protocol: {record['protocol']!r} is none of {', '.join(sorted(tasks))}"
    if len(record["task_ids"]) != want:
        return f"task_ids: {len(record['task_ids'])} tasks, the protocol decodes {want}"
    prefix = record["task_ids"][0].rsplit("/", 1)[0]
    if record["task_ids"] != [f"{prefix}/{i}" for i in range(want)]:
        return f"task_ids: not the protocol's tasks {prefix}/0..{want - 1} in order"
    return None


# -----------------------------------------------------------------------------
# models and runs


CARRY = {"sft": False, "rollout": False, "relay_sg": True, "relay": True}  # decode with the relay carry


def is_complete(ckpt_dir: str) -> bool:
    return os.path.isfile(os.path.join(ckpt_dir, "manifest.json"))


def manifest_step(ckpt_dir: str) -> int:
    """The step in ckpt_dir's manifest, read by the verifying reader: a damaged manifest stops in one line."""
    try:
        manifest = common.read_manifest(ckpt_dir, fields=("files", "step"),
                                        way_out="restore it from a copy (reference/mini/: git checkout), or train it again")
    except common.CheckpointError as e:
        raise SystemExit(str(e)) from None
    if manifest is None:
        raise SystemExit(f"{os.path.join(ckpt_dir, common.MANIFEST)} is missing: the directory is not complete")
    return manifest["step"]


def keep(src: str, dst: str, step: int | None = None) -> None:
    """A bf16 copy of the checkpoint directory src at dst (config, weights, tokenizer, manifest), written beside
    and swapped in: what the next stage starts from, and what the repository keeps. Its manifest holds step (that
    of a run made in stages), else src's. Skipped when dst already holds that step (a resumed study)."""
    import torch
    from fastdllm.model import load_fastdllm, save_fastdllm
    step = manifest_step(src) if step is None else step
    if is_complete(dst) and manifest_step(dst) == step:
        verify_kept(dst)
        return print(f"{dst} holds step {step} already, kept")
    try:
        model, tokenizer = load_fastdllm(src, dtype=torch.bfloat16)
    except (ValueError, OSError) as e:  # common.CheckpointError and the loader's other refusals: one line
        raise SystemExit(f"cannot keep {src}: {str(e).strip().splitlines()[0]}") from None
    save_fastdllm(model, tokenizer, dst + ".tmp", info={"step": step})
    common.swap_in(dst + ".tmp", dst)
    print(f"kept {src} as {dst} (bf16)")


def verify_kept(folder: str) -> None:
    """Every file of a kept checkpoint against its manifest (no file missing, none added, none changed)."""
    way_out = "restore it (git checkout), or delete it and the study keeps it again"
    try:
        common.verify_manifest(folder, common.read_manifest(folder, fields=("files", "step"), way_out=way_out), way_out)
    except common.CheckpointError as e:
        raise SystemExit(str(e)) from None


def keep_log(run_dir: str, name: str, out: str) -> None:
    """The run's metrics.jsonl (losses, rows seen, tokens/s) among the kept results in out/name/."""
    os.makedirs(os.path.join(out, name), exist_ok=True)
    shutil.copyfile(os.path.join(run_dir, "metrics.jsonl"), os.path.join(out, name, "train_metrics.jsonl"))


def last_ckpt(run_dir: str) -> str | None:
    steps = kept_steps(run_dir)
    return os.path.join(run_dir, f"ckpt-{steps[-1]}") if steps else None


def kept_steps(run_dir: str) -> list[int]:
    names = os.listdir(run_dir) if os.path.isdir(run_dir) else []
    return sorted(int(n[5:]) for n in names if n.startswith("ckpt-") and n[5:].isdigit()
                  and is_complete(os.path.join(run_dir, n)))


def resume_flags(out: str) -> list[str]:
    """How train_fastdllm.py goes on with the run in out: from its last save, or again from scratch when it was
    killed before its first save (only log lines are there)."""
    if os.path.exists(os.path.join(out, "resume")):
        return ["--resume=True"]
    if os.path.exists(os.path.join(out, "metrics.jsonl")):
        print(f"{out}: interrupted before its first checkpoint; starting it again", flush=True)
        return ["--overwrite=True"]
    return []


def finetune(config: str, out: str, extra: list[str], lanes: int, log: str, echo: bool = True) -> None:
    """train_fastdllm.py until its max_iters (resumed from out/resume when there is one), one process per lane."""
    launch = [PY, "train_fastdllm.py"] if lanes == 1 else [PY, "-m", "torch.distributed.run", "--standalone",
                                                             f"--nproc_per_node={lanes}", "train_fastdllm.py"]
    done = os.path.join(out, "DONE.json")
    if os.path.exists(done):
        return
    runs.sh(launch + [config, f"--out_dir={out}", *extra, *resume_flags(out)], log=log, echo=echo)
    runs.write_marker(done, {"cmd": [config, *extra]})
