"""Prepare the Sudoku data: train/val/test parquet files in the hub's column names plus token caches.

    python prepare_data.py                                   # offline default: generate 50k/1k/2k puzzles (~4 min, 2 cores)
    python prepare_data.py --derive                          # + Tim Vink's solver fields: trajectory, num_steps, strategies_used
    python prepare_data.py --source=hf                       # the paper's data set from the Hugging Face hub
    python prepare_data.py --source=file --path=my.csv       # your puzzles: CSV / parquet / JSONL / text, one puzzle a line
    python prepare_data.py --task=sft ...                    # Fast-dLLM v2 SFT data instead (fastdllm_data.py)

Output (default data/sudoku/): {train,val,test}.parquet with columns source, question,
answer, rating (+ trajectory, num_steps, strategies_used, derive_status after --derive),
{split}.npz token caches that load_puzzles() reads, and meta.json (the arguments: the
same arguments again reuse the data instead of rebuilding it).

In code, `load_puzzles("train")` gives token arrays ready for training, and
`deduction_only_mask(frame)` the paper's deduction-only cohort.
"""
import argparse
import ast
import json
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm import tqdm

import sudoku

SPLITS = ("train", "val", "test")
HUB_DATASET = "brozonoyer/sapientinc-sudoku-extreme-timvink-sudoku-solver"  # the paper's data (sapientinc + Tim's solver)
DATA_DIR = "data/sudoku"
DEFAULT_SIZES = {"train": 50_000, "val": 1_000, "test": 2_000}  # generate: ~4 min on 2 cores, fits the CPU presets

# every way a row can be bad, in the order they are checked
REASONS = ("wrong length", "bad character", "contradicting clues", "answer not a valid grid",
           "answer disagrees with clues", "no solution", "several solutions")


# -----------------------------------------------------------------------------
# loading prepared data (what training and evaluation call)

@dataclass
class Puzzles:
    question: np.ndarray  # (N, 81) int64 token ids, blanks = MASK
    answer: np.ndarray | None  # (N, 81) int64 token ids, None if the source has no answers
    frame: pd.DataFrame  # all columns in the hub's names: question, answer, source, rating, ...

    def __len__(self) -> int:
        return len(self.question)


_DIGIT_OF_BYTE = np.full(256, -1, dtype=np.int8)
_DIGIT_OF_BYTE[ord("0"):ord("9") + 1] = np.arange(10)
_DIGIT_OF_BYTE[ord(".")] = 0


def strings_to_digits(strings) -> np.ndarray:
    """Clean 81-character boards ('.' or '0' blank) -> (N, 81) int8 digits, vectorised."""
    strings = list(strings)
    if not strings:
        return np.zeros((0, sudoku.N_CELLS), dtype=np.int8)
    raw = np.frombuffer("".join(strings).encode("latin-1", errors="replace"), dtype=np.uint8)
    if raw.size != len(strings) * sudoku.N_CELLS:
        raise ValueError("boards must be 81 characters each")
    return _DIGIT_OF_BYTE[raw].reshape(len(strings), sudoku.N_CELLS)


def digits_to_strings(digits: np.ndarray) -> list[str]:
    """(N, 81) digits -> 81-character strings with '.' blanks (the hub's format)."""
    text = np.frombuffer(b".123456789", dtype=np.uint8)[np.asarray(digits, dtype=np.int64)].tobytes().decode()
    return [text[i:i + sudoku.N_CELLS] for i in range(0, len(text), sudoku.N_CELLS)]


def _parquet_stamp(path: str) -> np.ndarray:
    st = os.stat(path)
    return np.array([st.st_size, st.st_mtime_ns], dtype=np.int64)


def _write_token_cache(frame: pd.DataFrame, parquet_path: str) -> tuple[np.ndarray, np.ndarray]:
    question = sudoku.digits_to_tokens(strings_to_digits(frame["question"]))
    answer = sudoku.digits_to_tokens(strings_to_digits(frame["answer"]))
    cache = parquet_path[: -len(".parquet")] + ".npz"
    try:
        with open(cache + ".tmp", "wb") as f:  # uint8 keeps the file small; stamp ties it to this parquet file
            np.savez(f, question=question.astype(np.uint8), answer=answer.astype(np.uint8),
                     stamp=_parquet_stamp(parquet_path))
        os.replace(cache + ".tmp", cache)
    except OSError:
        pass  # a read-only data directory still loads, just without the cache
    return question, answer


def load_puzzles(spec: str, data_dir: str = DATA_DIR) -> Puzzles:
    """Puzzles of a prepared split ('train' | 'val' | 'test') or of a CSV / parquet / JSONL / text file.

    Files are checked (length, characters, clue and answer consistency; not uniqueness,
    which needs the solver: prepare_data.py --source=file does that) and every problem
    ends the program with one line naming the file, row and reason, like a missing split.
    """
    if spec in SPLITS:
        path = os.path.join(data_dir, f"{spec}.parquet")
        if not os.path.exists(path):
            flag = "" if os.path.normpath(data_dir) == os.path.normpath(DATA_DIR) else f" --out_dir={data_dir}"
            raise SystemExit(f"{path} not found: build the Sudoku data first with `python prepare_data.py{flag}`")
        frame = pd.read_parquet(path)
        cache = os.path.join(data_dir, f"{spec}.npz")
        if os.path.exists(cache):
            with np.load(cache) as z:
                if np.array_equal(z["stamp"], _parquet_stamp(path)) and len(z["question"]) == len(frame):
                    return Puzzles(z["question"].astype(np.int64), z["answer"].astype(np.int64), frame)
        question, answer = _write_token_cache(frame, path)
        return Puzzles(question, answer, frame)
    if not os.path.isfile(spec):
        raise SystemExit(f"no split or file named {spec!r}: use train, val, test or a path to a "
                         ".csv / .parquet / .jsonl / .txt file of puzzles")
    try:
        frame, where = read_puzzle_file(spec)
        frame, _ = check_puzzles(frame, where, spec, skip_invalid=False, use_solver=False)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    question = sudoku.digits_to_tokens(strings_to_digits(frame["question"]))
    answer = None
    if "answer" in frame and frame["answer"].notna().all():
        answer = sudoku.digits_to_tokens(strings_to_digits(frame["answer"]))
    return Puzzles(question, answer, frame)


# -----------------------------------------------------------------------------
# reading files and checking rows

def read_puzzle_file(path: str) -> tuple[pd.DataFrame, list[str]]:
    """A file's rows as a frame with a `question` column (+ answer/source/rating if present), and row labels.

    .csv / .parquet / .jsonl (.json) use the hub's column names; anything else is plain
    text with one puzzle per line ("question" or "question answer"; '#' starts a comment).
    """
    name = path.lower()
    try:
        if name.endswith((".csv", ".csv.gz")):
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        elif name.endswith(".parquet"):
            frame = pd.read_parquet(path)
        elif name.endswith((".jsonl", ".json", ".jsonl.gz")):
            frame = pd.read_json(path, lines=True, dtype=False)
        else:
            return _read_text(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read it ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if "question" not in frame.columns:
        raise ValueError(f"{path}: no 'question' column (columns: {', '.join(map(str, frame.columns))}); "
                         "use the hub's names question[,answer,source,rating] or a text file with one puzzle a line")
    for col in ("question", "answer"):
        if col in frame:  # numbers in JSON/parquet would lose leading zeros: only text is a board
            frame[col] = [v if isinstance(v, str) else (None if v is None or v != v else str(v)) for v in frame[col]]
    if "answer" in frame:
        frame["answer"] = [None if (v is None or not v.strip()) else v for v in frame["answer"]]
    if "rating" in frame:
        frame["rating"] = pd.to_numeric(frame["rating"], errors="coerce")
    return frame.reset_index(drop=True), [f"row {i + 1}" for i in range(len(frame))]


def _read_text(path: str) -> tuple[pd.DataFrame, list[str]]:
    questions, answers, where = [], [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            if len(fields) == 2 and len(fields[0]) == len(fields[1]) == sudoku.N_CELLS:
                questions.append(fields[0])
                answers.append(fields[1])
            else:
                questions.append(line)
                answers.append(None)
            where.append(f"line {lineno}")
    frame = pd.DataFrame({"question": questions})
    if any(a is not None for a in answers):
        frame["answer"] = answers
    return frame, where


def _parse_column(values) -> tuple[np.ndarray, np.ndarray]:
    """Boards as text (whitespace ignored) -> (N, 81) digits and a per-row status: 0 ok, 1 wrong length, 2 bad character."""
    cleaned = ["".join(v.split()) if isinstance(v, str) else "" for v in values]
    lengths = np.fromiter(map(len, cleaned), dtype=np.int64, count=len(cleaned))
    status = np.where(lengths == sudoku.N_CELLS, 0, 1)
    digits = np.zeros((len(cleaned), sudoku.N_CELLS), dtype=np.int8)
    ok = np.flatnonzero(status == 0)
    if ok.size:
        raw = np.frombuffer("".join(cleaned[i] for i in ok).encode("latin-1", errors="replace"), dtype=np.uint8)
        d = _DIGIT_OF_BYTE[raw.reshape(ok.size, sudoku.N_CELLS)]
        bad = (d < 0).any(axis=1)
        status[ok[bad]] = 2
        digits[ok] = np.maximum(d, 0)
    return digits, status


def _violations(digits: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    return np.concatenate([sudoku.count_violations_batch(digits[i:i + chunk])
                           for i in range(0, len(digits), chunk)] or [np.zeros(0, dtype=np.int64)])


def _solve_row(question: str) -> tuple[int, str | None, int]:
    n, solution, backtracks = sudoku.analyse(sudoku.parse_board(question))
    return n, (sudoku.format_board(solution) if solution is not None else None), backtracks


def check_puzzles(frame: pd.DataFrame, where: list[str], origin: str, skip_invalid: bool,
                  use_solver: bool = True, workers: int = 1) -> tuple[pd.DataFrame, Counter]:
    """Check every row; return the good rows (questions/answers normalised to '.' blanks) and counts of dropped rows per reason.

    A bad row raises ValueError naming origin, row and reason unless skip_invalid. With
    use_solver the exact solver also rejects puzzles with no or several solutions and
    fills missing answers (and missing ratings, with this solver's backtrack count).
    """
    n = len(frame)
    reason = np.full(n, -1)  # index into REASONS of the first problem, -1 = fine

    def flag(mask, r):
        reason[(reason < 0) & mask] = REASONS.index(r)

    q, qstatus = _parse_column(frame["question"])
    flag(qstatus == 1, "wrong length")
    flag(qstatus == 2, "bad character")
    flag(_violations(q) > 0, "contradicting clues")
    has_answer = np.zeros(n, dtype=bool)
    a = np.zeros_like(q)
    if "answer" in frame:
        has_answer = np.array([isinstance(v, str) for v in frame["answer"]], dtype=bool)
        a, astatus = _parse_column(frame["answer"])
        bad_grid = (astatus != 0) | (a == 0).any(axis=1) | (_violations(a) > 0)
        flag(has_answer & bad_grid, "answer not a valid grid")
        flag(has_answer & ((q != 0) & (q != a)).any(axis=1), "answer disagrees with clues")

    rating = None
    if use_solver:
        todo = np.flatnonzero(reason < 0)
        rows = _pool_map(_solve_row, digits_to_strings(q[todo]), workers, "solving")
        rating = np.full(n, np.nan)
        for i, (count, solution, backtracks) in zip(todo, rows):
            if count == 0:
                reason[i] = REASONS.index("no solution")
            elif count > 1:
                reason[i] = REASONS.index("several solutions")
            else:
                rating[i] = backtracks
                if not has_answer[i]:
                    a[i] = strings_to_digits([solution])[0]
                    has_answer[i] = True

    bad = np.flatnonzero(reason >= 0)
    if bad.size and not skip_invalid:
        i = bad[0]
        more = f" (and {bad.size - 1} more bad rows; --skip_invalid drops them)" if bad.size > 1 else ""
        raise ValueError(f"{origin}, {where[i]}: {REASONS[reason[i]]}{_detail(frame, i, REASONS[reason[i]])}{more}")
    keep = reason < 0
    out = frame[keep].copy()
    out["question"] = digits_to_strings(q[keep])
    if has_answer[keep].all() and keep.any():
        out["answer"] = digits_to_strings(a[keep])
    elif "answer" in out:
        out["answer"] = [s if h else None for s, h in zip(digits_to_strings(a[keep]), has_answer[keep])]
    if rating is not None and ("rating" not in out or out["rating"].isna().any()):
        old = out["rating"].to_numpy(dtype=float) if "rating" in out else np.full(keep.sum(), np.nan)
        out["rating"] = np.where(np.isnan(old), rating[keep], old).astype(np.int64)
    return out.reset_index(drop=True), Counter(REASONS[r] for r in reason[bad])


def _detail(frame: pd.DataFrame, i: int, reason: str) -> str:
    if reason in ("wrong length", "bad character"):
        try:
            sudoku.parse_board(str(frame["question"].iloc[i]))
        except ValueError as e:
            return f" ({e})"
    return ""


# -----------------------------------------------------------------------------
# parallel helpers

def _pool_map(fn, items: list, workers: int, desc: str, chunksize: int = 64) -> list:
    """fn over items in order, in `workers` processes, with a progress bar; the order makes results worker-count independent."""
    if workers <= 1 or len(items) < 2 * chunksize:
        return [fn(x) for x in tqdm(items, desc=desc, disable=len(items) < 100, leave=False)]
    with multiprocessing.Pool(workers) as pool:
        return list(tqdm(pool.imap(fn, items, chunksize=chunksize), total=len(items), desc=desc, leave=False))


# -----------------------------------------------------------------------------
# sources

def _generate_one(job: tuple) -> tuple[str, str, int]:
    seed, stream, index, min_clues, max_clues = job
    # one generator per (seed, split, index): the data set does not depend on the worker count
    rng = np.random.default_rng([seed, stream, index])
    puzzle, solution, rating = sudoku.generate_puzzle(rng, int(rng.integers(min_clues, max_clues + 1)))
    return sudoku.format_board(puzzle), sudoku.format_board(solution), rating


def generate_splits(seed: int, sizes: dict[str, int], min_clues: int, max_clues: int,
                    workers: int) -> tuple[dict[str, pd.DataFrame], int]:
    """Fresh puzzles for each split with no puzzle in two splits; also returns how many duplicates were replaced.

    Each split has its own random stream, so the test set stays the same when --n_train changes.
    """
    seen: set[str] = set()
    frames, duplicates = {}, 0
    for stream, split in reversed(list(enumerate(SPLITS))):  # test first: it never loses a puzzle to train
        rows, start = [], 0
        while len(rows) < sizes[split]:
            need = sizes[split] - len(rows)
            jobs = [(seed, stream, i, min_clues, max_clues) for i in range(start, start + need)]
            start += need
            for question, answer, rating in _pool_map(_generate_one, jobs, workers, f"generating {split}", chunksize=16):
                if question in seen:
                    duplicates += 1
                    continue
                seen.add(question)
                rows.append((f"generated-seed{seed}", question, answer, rating))
        frames[split] = pd.DataFrame(rows, columns=["source", "question", "answer", "rating"])
    return {s: frames[s] for s in SPLITS}, duplicates


def _caused_by(e: BaseException | None, kind: type) -> bool:
    while e is not None:
        if isinstance(e, kind):
            return True
        e = e.__cause__ or e.__context__
    return False


def load_hub_splits(name: str | None = None) -> dict[str, pd.DataFrame]:
    """The hub data set's train and test splits as frames (a local directory of its files works too, also offline)."""
    name = name or os.environ.get("RELAY_SUDOKU_HF_DATASET") or HUB_DATASET
    import datasets  # slow import, only needed here

    try:
        try:
            ds = datasets.load_dataset(name)
        except Exception as e:
            if not _caused_by(e, OverflowError):
                raise
            # sapientinc/sudoku-extreme is CSV: its 81-digit answers look like integers to the type
            # inference and overflow, so read its four columns as declared text instead
            text = datasets.Value("string")
            features = datasets.Features(source=text, question=text, answer=text, rating=datasets.Value("int64"))
            ds = datasets.load_dataset(name, features=features)
    except Exception as e:  # offline, unknown id, no access: all end the same way for the user
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise SystemExit(f"could not load the Sudoku data set '{name}' ({type(e).__name__}: {first}); "
                         "offline, use --source=generate (the default) or --source=file --path=<your puzzles>") from None
    missing = [s for s in ("train", "test") if s not in ds]
    if missing:
        raise SystemExit(f"data set '{name}' has no {' or '.join(missing)} split (it has: {', '.join(ds)})")
    return {split: ds[split].to_pandas() for split in ("train", "test")}


def _split_in_order(frame: pd.DataFrame, sizes: dict[str, int | None]) -> dict[str, pd.DataFrame]:
    """test = last n_test rows, val = the n_val rows before them, train = the first n_train of the rest."""
    n_val, n_test = sizes["val"], sizes["test"]
    if n_val + n_test >= len(frame):
        raise SystemExit(f"only {len(frame)} puzzles: not enough for --n_val={n_val} and --n_test={n_test} plus training")
    rest = len(frame) - n_val - n_test
    n_train = rest if sizes["train"] is None else min(sizes["train"], rest)
    return {"train": frame.iloc[:n_train], "val": frame.iloc[rest:rest + n_val], "test": frame.iloc[rest + n_val:]}


def _drop_overlap(splits: dict[str, pd.DataFrame]) -> Counter:
    """Remove repeated puzzles: within a split, and from train/val when they occur in a later split (test wins)."""
    dropped = Counter()
    seen: set[str] = set()
    for split in reversed(SPLITS):
        frame = splits[split]
        dup = frame["question"].duplicated().to_numpy() | frame["question"].isin(seen).to_numpy()
        if dup.any():
            dropped[split] = int(dup.sum())
            splits[split] = frame[~dup].reset_index(drop=True)
        seen.update(splits[split]["question"])
    return dropped


# -----------------------------------------------------------------------------
# Tim Vink's solver: trajectory, num_steps, strategies_used

class _Timeout(Exception):
    pass


_TIM = None


def _tim_solver():
    """Import sudoku_solver_tim quietly, once per process: it configures root logging at import and prints every step."""
    global _TIM
    if _TIM is None:
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        import sudoku_solver_tim.puzzle as tim
        from rich.console import Console

        root.handlers[:] = handlers
        root.setLevel(level)
        tim.console = Console(file=open(os.devnull, "w"))
        _TIM = tim
    return _TIM


def _on_alarm(signum, frame):
    raise _Timeout


def derive_one(job: tuple[str, str, float]) -> dict:
    """(question, answer, time limit in s) -> trajectory (boards from question to solution), num_steps, strategies_used, derive_status.

    A puzzle that runs out of time (in practice: inside the solver's naive brute force) is
    recorded as solved by "Brute Force" in one last step, which is what the solver would
    have done, with derive_status 'timeout'.
    """
    question, answer, time_limit = job
    tim = _tim_solver()
    puzzle = tim.Puzzle.from_string(question)
    boards, status = [question], "ok"
    timer = hasattr(signal, "setitimer")  # Unix; elsewhere puzzles run without a time limit
    previous = signal.signal(signal.SIGALRM, _on_alarm) if timer else None
    try:
        if timer:
            signal.setitimer(signal.ITIMER_REAL, time_limit)
        # pitfall 7.4: check is_solved() first, a solve_step on a solved board records "Brute Force"
        while not puzzle.is_solved():
            if not puzzle.solve_step():
                status = "stuck"
                break
            boards.append("".join(str(v) if v else "." for row in puzzle.grid for v in row))
    except _Timeout:
        status = "timeout"
        puzzle.strategies_used.add("Brute Force")
        boards.append(answer)
    except Exception as e:  # the solver's own checks (e.g. an invalid grid); recorded, never silent
        status = f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    finally:
        if timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return {"trajectory": boards, "num_steps": len(boards) - 1,
            "strategies_used": sorted(puzzle.strategies_used, key=_strategy_rank), "derive_status": status}


def derive(frame: pd.DataFrame, workers: int, time_limit: float, desc: str = "deriving") -> pd.DataFrame:
    """Frame + trajectory, num_steps, strategies_used, derive_status, with Tim Vink's solver."""
    jobs = [(q, a, time_limit) for q, a in zip(frame["question"], frame["answer"])]
    rows = _pool_map(derive_one, jobs, workers, desc, chunksize=8)
    out = frame.copy()
    for col in ("trajectory", "num_steps", "strategies_used", "derive_status"):
        out[col] = [r[col] for r in rows]
    return out


# -----------------------------------------------------------------------------
# cohorts

TIERS = ("Easy", "Medium", "Advanced", "Master", "Brute Force")
_TIER_OF = {
    **dict.fromkeys(["single candidate", "single position"], "Easy"),
    **dict.fromkeys(["candidate line", "double pair", "multiple line"], "Medium"),
    **dict.fromkeys(["naked pair", "naked triple", "naked quad", "hidden pair", "hidden triple", "hidden quad"], "Advanced"),
    # Jellyfish and Forcing Chain are in xlm-core's lists though solver 0.1.1 never reports them
    **dict.fromkeys(["x-wing", "swordfish", "jellyfish", "forcing chain"], "Master"),
    "brute force": "Brute Force",
}
_ORDER = ["single candidate", "single position", "candidate line", "double pair", "multiple line", "naked pair",
          "naked triple", "naked quad", "hidden pair", "hidden triple", "hidden quad", "x-wing", "swordfish",
          "jellyfish", "forcing chain", "brute force"]


def _canonical(name: str) -> str:
    """'Naked Pairs' / 'naked pair ' -> 'naked pair' (xlm-core matches singular and plural forms)."""
    name = str(name).strip().lower()
    if name not in _TIER_OF and name.endswith("s") and name[:-1] in _TIER_OF:
        name = name[:-1]
    return name


def _strategy_rank(name: str) -> int:
    name = _canonical(name)
    return _ORDER.index(name) if name in _ORDER else len(_ORDER)


def strategy_names(value) -> list[str]:
    """A strategies_used cell (list, array, set, or its text form "['A', 'B']" / "A, B") -> list of names."""
    if value is None or (isinstance(value, float) and value != value):
        return []
    if isinstance(value, str):
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        if isinstance(parsed, str):
            return [s.strip() for s in parsed.split(",") if s.strip()]
        value = parsed
    return [str(s) for s in value]


def hardest_tier(names) -> str:
    """Hardest tier among the strategies (an unknown name counts as brute force); 'none' if there are none."""
    tiers = [_TIER_OF.get(_canonical(n), "Brute Force") for n in strategy_names(names)]
    return max(tiers, key=TIERS.index) if tiers else "none"


def deduction_only_mask(frame: pd.DataFrame) -> np.ndarray:
    """The paper's deduction-only cohort: no "Brute Force" and at least one Advanced or Master strategy."""
    if "strategies_used" not in frame:
        raise ValueError("these puzzles have no strategies_used column: run `python prepare_data.py --derive` "
                         "(or use the hub data, --source=hf) to add the solver-derived fields")
    mask = []
    for value in frame["strategies_used"]:
        tiers = {_TIER_OF.get(_canonical(n)) for n in strategy_names(value)}
        mask.append("Brute Force" not in tiers and bool(tiers & {"Advanced", "Master"}))
    return np.array(mask, dtype=bool)


# -----------------------------------------------------------------------------
# writing and summarising

def _write_splits(splits: dict[str, pd.DataFrame], out_dir: str, meta: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    meta_path = os.path.join(out_dir, "meta.json")
    if os.path.exists(meta_path):
        os.remove(meta_path)  # the data is only complete (and reusable) once meta.json is back
    for split, frame in splits.items():
        path = os.path.join(out_dir, f"{split}.parquet")
        frame.to_parquet(path + ".tmp", index=False)
        os.replace(path + ".tmp", path)
        _write_token_cache(frame, path)
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".tmp", meta_path)


def summarize(splits: dict[str, pd.DataFrame]) -> str:
    """Counts, clue and rating statistics per split, a clue histogram and, if derived, cohort sizes."""
    lines = [f"{'split':<6} {'puzzles':>8} {'clues min/mean/max':>19} {'rating mean/max':>16}"]
    clues_all = []
    for split, frame in splits.items():
        clues = (strings_to_digits(frame["question"]) > 0).sum(axis=1) if len(frame) else np.zeros(1, dtype=int)
        clues_all.append(clues[: len(frame)])
        rating = frame["rating"].to_numpy(dtype=float) if "rating" in frame and len(frame) else np.zeros(1)
        lines.append(f"{split:<6} {len(frame):>8} {clues.min():>7} /{clues.mean():>5.1f} /{clues.max():>3}"
                     f" {np.nanmean(rating):>9.1f} /{np.nanmax(rating):>5.0f}")
    clues = np.concatenate(clues_all)
    if clues.size:
        counts = np.bincount(clues, minlength=sudoku.N_CELLS + 1)
        lines.append("clue histogram (all splits):")
        top = counts.max()
        for c in range(clues.min(), clues.max() + 1):
            lines.append(f"  {c:>2} clues {counts[c]:>7}  {'#' * int(round(40 * counts[c] / top))}")
    if all("strategies_used" in f for f in splits.values()):
        lines.append(f"{'split':<6} {'deduction_only':>14}  hardest strategy tier: " + " / ".join(TIERS)
                     + "   num_steps mean/max   not derived (timeout / stuck / error)")
        for split, frame in splits.items():
            tiers = Counter(hardest_tier(v) for v in frame["strategies_used"])
            status = Counter(str(s).split(":")[0] for s in frame.get("derive_status", []))
            steps = frame["num_steps"].to_numpy(dtype=float) if len(frame) else np.zeros(1)
            lines.append(f"{split:<6} {int(deduction_only_mask(frame).sum()):>14}  "
                         + " / ".join(str(tiers[t]) for t in TIERS)
                         + f"   {steps.mean():.1f} / {steps.max():.0f}"
                         + f"   {status['timeout']} / {status['stuck']} / {status['error']}")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# command line

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Prepare the Sudoku data (see the module docstring).")
    p.add_argument("--task", choices=["sudoku", "sft"], default="sudoku", help="sft: Fast-dLLM v2 data (fastdllm_data.py)")
    p.add_argument("--source", choices=["generate", "hf", "file"], default="generate")
    p.add_argument("--path", help="--source=file: CSV / parquet / JSONL / text file of puzzles")
    p.add_argument("--out_dir", default=DATA_DIR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min_clues", type=int, default=17, help="generate: fewest clues; below ~22 a puzzle stops at minimal")
    p.add_argument("--max_clues", type=int, default=45, help="generate: most clues (targets are uniform in between)")
    p.add_argument("--n_train", type=int, help=f"default {DEFAULT_SIZES['train']} (generate) / all (hf, file)")
    p.add_argument("--n_val", type=int, help=f"default {DEFAULT_SIZES['val']} (file: at most a tenth)")
    p.add_argument("--n_test", type=int, help=f"default {DEFAULT_SIZES['test']} (hf: the whole test split; file: at most a tenth)")
    p.add_argument("--derive", action="store_true", help="add trajectory, num_steps, strategies_used with Tim Vink's solver")
    p.add_argument("--derive_timeout", type=float, default=10.0, help="seconds per puzzle before it counts as brute force")
    p.add_argument("--skip_invalid", action="store_true", help="drop bad rows (counted per reason) instead of stopping")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--force", action="store_true", help="rebuild even if out_dir holds data made with the same arguments")
    args = p.parse_args(argv)
    if not 0 <= args.min_clues <= args.max_clues <= sudoku.N_CELLS:
        p.error(f"need 0 <= --min_clues <= --max_clues <= 81, got {args.min_clues} and {args.max_clues}")
    for key in ("n_train", "n_val", "n_test"):
        if getattr(args, key) is not None and getattr(args, key) < 0:
            p.error(f"--{key} must be >= 0")
    if args.source == "file" and not args.path:
        p.error("--source=file needs --path=<csv / parquet / jsonl / txt file>")
    if args.path and not os.path.isfile(args.path):
        p.error(f"--path={args.path}: no such file")
    if args.derive_timeout <= 0 or args.workers < 1:
        p.error("--derive_timeout must be > 0 and --workers >= 1")
    return args


def _cache_key(args: argparse.Namespace) -> dict:
    """Everything that changes the puzzles (not --derive, which only adds columns, nor speed settings)."""
    key = {k: getattr(args, k) for k in ("source", "seed", "n_train", "n_val", "n_test", "skip_invalid")}
    if args.source == "generate":
        key.update(min_clues=args.min_clues, max_clues=args.max_clues, generator=sudoku.GENERATOR_VERSION)
    if args.source == "hf":
        key["dataset"] = os.environ.get("RELAY_SUDOKU_HF_DATASET") or HUB_DATASET
    if args.source == "file":
        st = os.stat(args.path)
        key.update(path=os.path.abspath(args.path), size=st.st_size, mtime_ns=st.st_mtime_ns)
    return key


def _read_meta(out_dir: str) -> dict | None:
    try:
        with open(os.path.join(out_dir, "meta.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def build(args: argparse.Namespace) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The three splits for the chosen source, and notes for the summary (what was dropped and why)."""
    notes = []
    if args.source == "generate":
        sizes = {s: DEFAULT_SIZES[s] if getattr(args, f"n_{s}") is None else getattr(args, f"n_{s}") for s in SPLITS}
        splits, dups = generate_splits(args.seed, sizes, args.min_clues, args.max_clues, args.workers)
        if dups:
            notes.append(f"{dups} generated puzzles repeated an earlier one and were replaced")
        return splits, notes

    if args.source == "hf":
        name = os.environ.get("RELAY_SUDOKU_HF_DATASET") or HUB_DATASET
        hub = load_hub_splits(name)
        n_val = DEFAULT_SIZES["val"] if args.n_val is None else args.n_val
        if n_val >= len(hub["train"]):
            raise SystemExit(f"the hub train split has {len(hub['train'])} rows: --n_val={n_val} leaves none for training")
        rest = len(hub["train"]) - n_val
        n_train = rest if args.n_train is None else min(args.n_train, rest)
        # val is held out from the END of the hub's train split; test is the hub's test split in its order
        # (the paper's evaluation slices are its first rows)
        raw = {"train": hub["train"].iloc[:n_train], "val": hub["train"].iloc[rest:],
               "test": hub["test"] if args.n_test is None else hub["test"].iloc[:args.n_test]}
        notes.append(f"val = the last {n_val} rows of {name} [train]; test = the first {len(raw['test'])} rows of [test]")
        splits = {}
        for split, frame in raw.items():
            # trusted source (sapientinc: every puzzle unique): cheap checks only, the solver would take hours here
            where = [f"row {i + 1}" for i in range(len(frame))]
            splits[split], dropped = check_puzzles(frame.reset_index(drop=True), where, f"{name} [{split}]",
                                                   args.skip_invalid, use_solver=False)
            notes += [f"dropped from {split}: {n} x {r}" for r, n in dropped.items()]
    else:
        try:
            frame, where = read_puzzle_file(args.path)
            frame, dropped = check_puzzles(frame, where, args.path, args.skip_invalid, True, args.workers)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        notes += [f"dropped {n} x {r}" for r, n in dropped.items()]
        if "source" not in frame:
            frame.insert(0, "source", os.path.basename(args.path))
        frame = frame.drop_duplicates("question").reset_index(drop=True)  # counted below, with the split overlap
        tenth = max(1, len(frame) // 10)
        sizes = {"train": args.n_train,
                 "val": min(DEFAULT_SIZES["val"], tenth) if args.n_val is None else args.n_val,
                 "test": min(DEFAULT_SIZES["test"], tenth) if args.n_test is None else args.n_test}
        splits = _split_in_order(frame, sizes)
        notes.append(f"split in file order: train = first rows, val = next {sizes['val']}, test = last {sizes['test']}")
    for split, n in _drop_overlap(splits).items():
        notes.append(f"dropped {n} repeated puzzles from {split} (already in that split or a later one)")
    return splits, notes


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--task", choices=["sudoku", "sft"], default="sudoku")
    task, rest = pre.parse_known_args(argv)
    if task.task == "sft":
        try:
            import fastdllm_data  # owned by the Fast-dLLM side; imported only for this task
        except ImportError as e:
            raise SystemExit(f"--task=sft needs fastdllm_data.py, which cannot be imported ({e})") from None
        return fastdllm_data.main(rest)
    args = parse_args(argv)
    t0 = time.time()
    key = _cache_key(args)
    meta = _read_meta(args.out_dir)
    cached = meta is not None and meta.get("key") == key and not args.force
    if cached and (meta["derived"] or not args.derive):
        print(f"{args.out_dir}: reusing the data built on {meta['built']} with the same arguments "
              "(--force rebuilds it)")
        print(meta["summary"])
        return
    if cached:  # same puzzles, only the derived columns are missing
        print(f"{args.out_dir}: reusing the puzzles built on {meta['built']}, adding the derived fields")
        splits = {s: pd.read_parquet(os.path.join(args.out_dir, f"{s}.parquet")) for s in SPLITS}
        notes = meta["notes"]
    else:
        if meta is not None and meta.get("key") != key:
            print(f"{args.out_dir}: holds data built with other arguments (see its meta.json): rebuilding it")
        splits, notes = build(args)
    derived = all({"trajectory", "num_steps", "strategies_used"} <= set(f.columns) for f in splits.values())
    if args.derive and not derived:
        for split in SPLITS:
            splits[split] = derive(splits[split], args.workers, args.derive_timeout, f"deriving {split}")
        derived = True
    elif args.derive:
        notes.append("the source already has trajectory / num_steps / strategies_used: kept as they are")
    summary = "\n".join([*notes, summarize(splits)])
    meta = {"key": key, "derived": derived, "notes": notes, "summary": summary,
            "built": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(time.time() - t0, 1)}
    _write_splits(splits, args.out_dir, meta)
    print(summary)
    print(f"wrote {', '.join(f'{s}.parquet' for s in SPLITS)} (+ .npz token caches) to {args.out_dir} "
          f"in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
