"""The report of Table 2 in miniature (scripts/table2/mini_study.py), from the kept result JSONs alone.

    python scripts/table2/mini_study.py --report_only        # same as: python scripts/table2/mini_report.py results/mini_study

One JSON per (model, step, protocol, tau): the eval_code.py summary and, per task, the base / plus verdicts and
the NFE, so tasks can be paired. The report (out/mini_study.md, figures in --figures):
- Table 2's columns: pass@1 base / plus and mean NFE at tau 0.85, mean +- s.d. over seeds, per split
  (held-out compositions, seen compositions);
- the primary outcomes, fixed before the runs: NFE at tau 0.85, and pass@1 at matched NFE, Relay - SFT, with
  per-task paired standard errors (tasks are the unit; each task's difference averaged over the seeds);
- NFE at matched pass@1; the accuracy-NFE frontier figure; the gap against fine-tuning compute (light protocol).
pass@1 is the plus column (plus inputs alone, the authors' rule of Table 2) unless a table says base.
"""
import hashlib
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402

RESULT_KEYS = ("pass1_base", "pass1_plus_authors", "pass1_plus_evalplus", "mean_nfe")
SPLITS = {"heldout": "held-out compositions", "seen": "seen compositions"}
METHODS = {"base": "Fast-dLLM v2 (stage B)", "sft": "Vanilla SFT", "rollout": "Rollout", "relay_sg": "Relay (sg)",
           "relay": "Relay"}
TABLE_TAU = 0.85
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
    record = dict(meta, **{k: summary[k] for k in RESULT_KEYS}, n=len(ids), task_ids=ids,
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
    carry its digests (stamp.py writes them into results kept before they existed); pins: {data file: sha256},
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
                    problem = "digest: missing (python scripts/table2/stamp.py stamps results kept before digests)"
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
# one result, one split


def select(r: dict, split: str, key: str) -> list[float]:
    """The per-task values of `key` ("base", "plus", "nfe") over one split ("all" = every task)."""
    return [v for t, v in zip(r["task_ids"], r[key]) if split == "all" or t.split("/")[1] == split]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def sd(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def rate(r: dict, split: str, key: str = "plus") -> float:
    return 100 * mean(select(r, split, key))


def print_gate(out: str) -> None:
    for r in (r for r in load(out) if r["protocol"] == "gate"):
        line = " | ".join(f"{s}: base {rate(r, s, 'base'):.1f}%, plus {rate(r, s):.1f}%, NFE {mean(select(r, s, 'nfe')):.1f}"
                          for s in SPLITS)
        inside = all(20 <= rate(r, s, "base") <= 80 for s in SPLITS)
        print(f"gate (tau {r['tau']:g}, step {r['step']}): {line} -> {'in' if inside else 'OUTSIDE'} the 20-80% band")


# -----------------------------------------------------------------------------
# curves over tau and matched NFE


def method_of(model: str) -> str:
    return model.rsplit("_s", 1)[0] if "_s" in model and model.rsplit("_s", 1)[1].isdigit() else model


def curves(results: list[dict], protocol: str) -> dict[tuple[str, int], list[dict]]:
    """{(model, step): its results of one protocol, ordered by tau}."""
    out: dict[tuple[str, int], list[dict]] = {}
    for r in results:
        if r["protocol"] == protocol:
            out.setdefault((r["model"], r["step"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["tau"]) for k, v in out.items()}


def at_nfe(curve: list[dict], split: str, budget: float, key: str = "plus") -> list[float] | None:
    """Per-task scores at mean NFE `budget`: between the two taus whose mean NFE brackets it, each task's verdict
    weighted as the curve's mean is (so their mean is the curve's linear interpolation); None outside the curve."""
    points = sorted(curve, key=lambda r: mean(select(r, split, "nfe")))
    nfes = [mean(select(r, split, "nfe")) for r in points]
    if not points or not nfes[0] <= budget <= nfes[-1]:
        return None
    for i in range(len(points)):
        j = min(i + 1, len(points) - 1)
        if nfes[i] <= budget <= nfes[j]:
            w = 0.0 if nfes[j] == nfes[i] else (budget - nfes[i]) / (nfes[j] - nfes[i])
            return [(1 - w) * a + w * b for a, b in zip(select(points[i], split, key), select(points[j], split, key))]
    return None


def nfe_range(curve: list[dict], split: str) -> tuple[float, float]:
    nfes = [mean(select(r, split, "nfe")) for r in curve]
    return min(nfes), max(nfes)


def paired(pairs: list[tuple[list[float], list[float]]]) -> tuple[float, float, float]:
    """(mean difference b - a, its per-task paired s.e., the s.d. of the seeds' differences) over seed pairs of
    per-task values on the same tasks: each task's difference is averaged over the seeds first."""
    per_seed = [[b - a for a, b in zip(x, y)] for x, y in pairs]
    per_task = [mean(list(d)) for d in zip(*per_seed)]
    return mean(per_task), sd(per_task) / math.sqrt(len(per_task)), sd([mean(d) for d in per_seed])


def seed_pairs(found: dict, step: int | None, a: str, b: str) -> list[tuple[list[dict], list[dict]]]:
    """(curve of a, curve of b) for every seed both have (at `step`, or each one's last step)."""
    def last(model: str) -> list[dict] | None:
        steps = sorted(s for m, s in found if m == model)
        chosen = step if step is not None else (steps[-1] if steps else None)
        return found.get((model, chosen))
    seeds = sorted({int(m.rsplit("_s", 1)[1]) for m, _ in found if method_of(m) == a})
    return [(last(f"{a}_s{s}"), last(f"{b}_s{s}")) for s in seeds if last(f"{a}_s{s}") and last(f"{b}_s{s}")]


def matched_budgets(pairs: list, split: str, k: int = 4) -> list[float]:
    """k budgets spread over the NFE range every curve of every pair covers."""
    ranges = [nfe_range(c, split) for pair in pairs for c in pair]
    lo, hi = max(r[0] for r in ranges), min(r[1] for r in ranges)
    if lo > hi:
        return []
    return [lo + (hi - lo) * i / (k - 1) for i in range(k)] if k > 1 and hi > lo else [lo]


def matched_rows(pairs: list, split: str, key: str = "plus") -> list[tuple]:
    """(budget, pass@1 of a, of b, difference, paired s.e., seed s.d.) at each matched budget."""
    rows = []
    for budget in matched_budgets(pairs, split):
        scored = [(at_nfe(x, split, budget, key), at_nfe(y, split, budget, key)) for x, y in pairs]
        d, se, spread = paired(scored)
        rows.append((budget, 100 * mean([mean(x) for x, _ in scored]), 100 * mean([mean(y) for _, y in scored]),
                     100 * d, 100 * se, 100 * spread))
    return rows


def nfe_at_pass(curve: list[dict], split: str, target: float) -> list[float] | None:
    """Per-task NFE where the curve's pass@1 (plus, %) reaches target: between the two taus whose pass@1 brackets
    it, each task's NFE weighted as the curve's pass@1 is (so their mean is the curve's interpolated NFE); None
    outside the curve."""
    points = sorted(curve, key=lambda r: rate(r, split))
    for lo, hi in zip(points, points[1:]):
        a, b = rate(lo, split), rate(hi, split)
        if a <= target <= b:
            w = 0.0 if a == b else (target - a) / (b - a)
            return [(1 - w) * x + w * y for x, y in zip(select(lo, split, "nfe"), select(hi, split, "nfe"))]
    return None


def at_tau(curve: list[dict], tau: float) -> dict | None:
    return next((r for r in curve if abs(r["tau"] - tau) < 1e-9), None)


# -----------------------------------------------------------------------------
# the report


def one(value: float) -> str:
    """One decimal, or "-" where there is no value (a seed s.d. from one seed)."""
    return "-" if math.isnan(value) else f"{value:.1f}"


def fmt(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    return f"{mean(values):.{digits}f}" + (f" ± {sd(values):.{digits}f}" if len(values) > 1 else "")


def table2(found: dict) -> list[str]:
    """Table 2's columns at TABLE_TAU, full protocol, each model's last step; mean +- s.d. over seeds."""
    head = "| model | seeds | " + " | ".join(f"{n}: base | plus | NFE" for n in SPLITS.values()) + " |"
    lines = [head, "|" + " --- |" * (2 + 3 * len(SPLITS))]
    for method, label in METHODS.items():
        models = sorted({m for m, _ in found if method_of(m) == method})
        chosen = [at_tau(found[(m, max(s for mm, s in found if mm == m))], TABLE_TAU) for m in models]
        chosen = [r for r in chosen if r is not None]
        if not chosen:
            continue
        cells = []
        for split in SPLITS:
            cells += [fmt([rate(r, split, "base") for r in chosen]), fmt([rate(r, split) for r in chosen]),
                      fmt([mean(select(r, split, "nfe")) for r in chosen])]
        lines.append(f"| {label} | {len(chosen)} | " + " | ".join(cells) + " |")
    return lines


def primary(found: dict, a: str = "sft", b: str = "relay") -> list[str]:
    """NFE at tau 0.85 (paired per task) and pass@1 at matched NFE, b - a, per split."""
    pairs = seed_pairs(found, None, a, b)
    if not pairs:
        return []
    lines = [f"{len(pairs)} seed pairs, each model's last kept step. Differences are {METHODS[b]} - {METHODS[a]}; "
             "s.e. is per-task paired (each task's difference averaged over the seeds), s.d. is over the seeds.", ""]
    for split, name in SPLITS.items():
        tau_pairs = [(at_tau(x, TABLE_TAU), at_tau(y, TABLE_TAU)) for x, y in pairs]
        if all(x and y for x, y in tau_pairs):
            d, se, spread = paired([(select(x, split, "nfe"), select(y, split, "nfe")) for x, y in tau_pairs])
            nfe_a = mean([mean(select(x, split, "nfe")) for x, _ in tau_pairs])
            nfe_b = mean([mean(select(y, split, "nfe")) for _, y in tau_pairs])
            lines.append(f"**{name}, NFE at tau {TABLE_TAU:g}:** {METHODS[a]} {nfe_a:.1f}, {METHODS[b]} {nfe_b:.1f}, "
                         f"difference {d:+.1f} (s.e. {se:.1f}, seed s.d. {one(spread)})")
            lines.append("")
        lines += [f"**{name}, pass@1 (plus) at matched NFE:**", "",
                  f"| NFE | {METHODS[a]} | {METHODS[b]} | difference | s.e. | seed s.d. |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {n:.1f} | {x:.1f} | {y:.1f} | {d:+.1f} | {se:.1f} | {one(s)} |"
                  for n, x, y, d, se, s in matched_rows(pairs, split)] or ["| (the NFE ranges do not overlap) |"]
        lines.append("")
    return lines


def nfe_at_matched_pass(found: dict, a: str = "sft", b: str = "relay") -> list[str]:
    """NFE of a and b at three pass@1 (plus) levels every curve of every seed pair reaches, per split; b - a
    paired per task, as at matched NFE."""
    pairs = seed_pairs(found, None, a, b)
    if not pairs:
        return []
    lines = []
    for split, name in SPLITS.items():
        lo = max(min(rate(r, split) for r in c) for pair in pairs for c in pair)
        hi = min(max(rate(r, split) for r in c) for pair in pairs for c in pair)
        lines += [f"**{name}:**", ""]
        if lo > hi:
            lines += ["the pass@1 ranges do not overlap", ""]
            continue
        lines += [f"| pass@1 (%) | {METHODS[a]} NFE | {METHODS[b]} NFE | difference | s.e. | seed s.d. |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for target in sorted({lo, (lo + hi) / 2, hi}):
            nfes = [(nfe_at_pass(x, split, target), nfe_at_pass(y, split, target)) for x, y in pairs]
            d, se, spread = paired(nfes)
            lines.append(f"| {target:.1f} | {mean([mean(x) for x, _ in nfes]):.1f} | {mean([mean(y) for _, y in nfes]):.1f} "
                         f"| {d:+.1f} | {se:.1f} | {one(spread)} |")
        lines.append("")
    return lines


def gap_over_compute(results: list[dict], a: str = "sft", b: str = "relay") -> list[str]:
    """Light protocol at every kept step: b - a pass@1 (plus) at matched NFE and NFE at tau 0.85, per split."""
    found = curves(results, "light")
    steps = sorted({s for m, s in found if method_of(m) == a})
    lines = ["| step | " + " | ".join(f"{n}: matched-NFE gap (s.e.) | NFE at 0.85, {METHODS[a]} / {METHODS[b]}"
                                      for n in SPLITS.values()) + " |", "|" + " --- |" * (1 + 2 * len(SPLITS))]
    for step in steps:
        pairs = seed_pairs(found, step, a, b)
        if not pairs:
            continue
        cells = []
        for split in SPLITS:
            rows = matched_rows(pairs, split)
            mid = rows[len(rows) // 2] if rows else None
            cells.append(f"{mid[3]:+.1f} ({mid[4]:.1f}) at NFE {mid[0]:.1f}" if mid else "-")
            nfes = [(mean(select(at_tau(x, TABLE_TAU), split, "nfe")), mean(select(at_tau(y, TABLE_TAU), split, "nfe")))
                    for x, y in pairs if at_tau(x, TABLE_TAU) and at_tau(y, TABLE_TAU)]
            cells.append(f"{mean([p[0] for p in nfes]):.1f} / {mean([p[1] for p in nfes]):.1f}" if nfes else "-")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def training_cost(out: str) -> list[str]:
    """Each fine-tune's throughput from its kept train_metrics.jsonl: the median of its logged tokens/s (wall
    clock, one thread; the study's two lanes share the machine, so runs are compared within the study only)."""
    lines = ["| run | steps | median tokens/s | relative to Vanilla SFT (same seed) |", "| --- | --- | --- | --- |"]
    rates = {}
    for model in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        path = os.path.join(out, model, "train_metrics.jsonl")
        if model in ("pretrain", "base", "gate") or not os.path.isfile(path):
            continue
        rows = [r for r in read_jsonl(path) if "tokens_per_s" in r]
        if rows:
            speeds = sorted(r["tokens_per_s"] for r in rows)
            rates[model] = (rows[-1]["step"], speeds[len(speeds) // 2] if len(speeds) % 2 else
                            (speeds[len(speeds) // 2 - 1] + speeds[len(speeds) // 2]) / 2)
    for model, (steps, rate_) in rates.items():
        seed = model.rsplit("_s", 1)[1]
        sft = rates.get(f"sft_s{seed}")
        lines.append(f"| {model} | {steps} | {rate_:.0f} | {rate_ / sft[1]:.2f} |" if sft else
                     f"| {model} | {steps} | {rate_:.0f} | - |")
    return lines


def plot_frontier(found: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"base": "0.5", "sft": "tab:blue", "rollout": "tab:green", "relay_sg": "tab:purple", "relay": "tab:red"}
    fig, axes = plt.subplots(1, len(SPLITS), figsize=(11, 4.2))
    for ax, (split, name) in zip(axes, SPLITS.items()):
        for method, label in METHODS.items():
            models = sorted({m for m, _ in found if method_of(m) == method})
            for i, m in enumerate(models):
                curve = found[(m, max(s for mm, s in found if mm == m))]
                ax.plot([mean(select(r, split, "nfe")) for r in curve], [rate(r, split) for r in curve], "o-",
                        color=colors[method], alpha=0.9 if i == 0 else 0.45, ms=3, label=label if i == 0 else None)
        ax.set(title=name, xlabel="mean NFE per task", ylabel="pass@1 plus (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Table 2 in miniature: pass@1 against forward passes over tau (each seed one curve)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: str, figures: str | None = None) -> str:
    results = load(out)
    if not results:  # a report of nothing would pass for a study with no outcome
        raise SystemExit(f"no kept results in {out}: run the study first (scripts/table2/mini_study.py), or give the "
                         "folder that holds them (--out)")
    print_gate(out)
    found = curves(results, "full")
    lines = ["# Table 2 in miniature: report", "", "Drawn by scripts/table2/mini_report.py from the JSONs in this folder alone.", "",
             f"## Table 2's columns (tau {TABLE_TAU:g}, full protocol, last kept step)", "", *table2(found), "",
             "## Primary outcomes: NFE at tau 0.85 and pass@1 at matched NFE", "", *primary(found), "",
             "## NFE at matched pass@1 (plus)", "", *nfe_at_matched_pass(found), "",
             "## The gap against fine-tuning compute (light protocol)", "", *gap_over_compute(results), "",
             "## Training cost (equal steps x batch; throughput as logged)", "", *training_cost(out), ""]
    for extra in ("rollout", "relay_sg"):
        if any(method_of(m) == extra for m, _ in found):
            lines += [f"## {METHODS[extra]} against Vanilla SFT (seed 1)", "", *primary(found, "sft", extra), ""]
    text = "\n".join(lines)
    with open(os.path.join(out, "mini_study.md"), "w") as f:
        f.write(text)
    if found:
        os.makedirs(figures or out, exist_ok=True)
        plot_frontier(found, os.path.join(figures or out, "mini_frontier.png"))
    print(text)
    return text


def main(argv: list[str] | None = None) -> str:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("out", nargs="?", default="results/mini_study", help="the folder of kept results")
    args = p.parse_args(argv)
    if not os.path.isdir(args.out):
        raise SystemExit(f"mini_report.py: {args.out} is not a folder of kept results (scripts/table2/mini_study.py --out)")
    if not load(args.out):  # every kept JSON read and checked before anything is written
        raise SystemExit(f"mini_report.py: {args.out} holds no kept results (model/step_*.json)")
    return report(args.out)


if __name__ == "__main__":
    main()
