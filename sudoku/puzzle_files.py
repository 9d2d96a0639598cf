"""Puzzle files: read CSV / parquet / JSONL / text puzzles, check every row against seven rules, load puzzles for evaluation.

A row is rejected for the first of REASONS it meets. The first five are cheap, vectorised
checks; the last two need the exact solver (prepare_data.py --source=file runs it).

    from sudoku.puzzle_files import load_puzzles
    test = load_puzzles("test")         # a prepared split: .question / .answer tokens and .frame (all columns)
    mine = load_puzzles("my.csv")       # or any puzzle file, checked with the cheap rules
"""
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

import sudoku.board
from sudoku.data import DATA_DIR, SPLITS, load_split, prepare_command

# every way a row can be bad, in the order they are checked
REASONS = ("wrong length", "bad character", "contradicting clues", "answer not a valid grid",
           "answer disagrees with clues", "no solution", "several solutions")

_DIGIT_OF_BYTE = np.full(256, -1, dtype=np.int8)
_DIGIT_OF_BYTE[ord("0"):ord("9") + 1] = np.arange(10)
_DIGIT_OF_BYTE[ord(".")] = 0


def strings_to_digits(strings) -> np.ndarray:
    """Clean 81-character boards ('.' or '0' blank) -> (N, 81) int8 digits, vectorised."""
    strings = list(strings)
    if not strings:
        return np.zeros((0, sudoku.board.N_CELLS), dtype=np.int8)
    raw = np.frombuffer("".join(strings).encode("latin-1", errors="replace"), dtype=np.uint8)
    if raw.size != len(strings) * sudoku.board.N_CELLS:
        raise ValueError("boards must be 81 characters each")
    return _DIGIT_OF_BYTE[raw].reshape(len(strings), sudoku.board.N_CELLS)


def digits_to_strings(digits: np.ndarray) -> list[str]:
    """(N, 81) digits -> 81-character strings with '.' blanks (the hub's format)."""
    text = np.frombuffer(b".123456789", dtype=np.uint8)[np.asarray(digits, dtype=np.int64)].tobytes().decode()
    return [text[i:i + sudoku.board.N_CELLS] for i in range(0, len(text), sudoku.board.N_CELLS)]


# -----------------------------------------------------------------------------
# loading puzzles for evaluation

@dataclass
class Puzzles:
    question: np.ndarray  # (N, 81) int64 token ids, blanks = MASK
    answer: np.ndarray | None  # (N, 81) int64 token ids, None if the source has no answers
    frame: pd.DataFrame  # all columns in the hub's names: question, answer, source, rating, ...

    def __len__(self) -> int:
        return len(self.question)


def load_puzzles(spec: str, data_dir: str = DATA_DIR) -> Puzzles:
    """Puzzles of a prepared split ('train' | 'val' | 'test') or of a CSV / parquet / JSONL / text file.

    Files get the cheap checks (not uniqueness, which needs the solver: prepare_data.py
    --source=file does that) and every problem ends the program with one line naming the
    file, row and reason, like a missing split.
    """
    if spec in SPLITS:
        boards = load_split(spec, data_dir)
        path = os.path.join(data_dir, f"{spec}.parquet")
        rebuild = f"rebuild it with `{prepare_command(data_dir)} --force`"
        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path} cannot be read ({type(e).__name__}): {rebuild}") from None
        if len(frame) != len(boards) or not np.array_equal(strings_to_digits(frame["question"]), boards[:, 0]):
            raise SystemExit(f"{path} and {spec}.npy hold different puzzles: {rebuild}")
        return Puzzles(sudoku.board.digits_to_tokens(boards[:, 0]), sudoku.board.digits_to_tokens(boards[:, 1]), frame)
    if not os.path.isfile(spec):
        raise SystemExit(f"no split or file named {spec!r}: use train, val, test or a path to a "
                         ".csv / .parquet / .jsonl / .txt file of puzzles")
    try:
        frame, where = read_puzzle_file(spec)
        frame, _ = check_puzzles(frame, where, spec, skip_invalid=False)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    question = sudoku.board.digits_to_tokens(strings_to_digits(frame["question"]))
    answer = None
    if "answer" in frame and frame["answer"].notna().all():
        answer = sudoku.board.digits_to_tokens(strings_to_digits(frame["answer"]))
    return Puzzles(question, answer, frame)


# -----------------------------------------------------------------------------
# reading files

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
            if len(fields) == 2 and len(fields[0]) == len(fields[1]) == sudoku.board.N_CELLS:
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


# -----------------------------------------------------------------------------
# checking rows

def _parse_column(values) -> tuple[np.ndarray, np.ndarray]:
    """Boards as text (whitespace ignored) -> (N, 81) digits and a per-row status: 0 ok, 1 wrong length, 2 bad character."""
    cleaned = ["".join(v.split()) if isinstance(v, str) else "" for v in values]
    lengths = np.fromiter(map(len, cleaned), dtype=np.int64, count=len(cleaned))
    status = np.where(lengths == sudoku.board.N_CELLS, 0, 1)
    digits = np.zeros((len(cleaned), sudoku.board.N_CELLS), dtype=np.int8)
    ok = np.flatnonzero(status == 0)
    if ok.size:
        raw = np.frombuffer("".join(cleaned[i] for i in ok).encode("latin-1", errors="replace"), dtype=np.uint8)
        d = _DIGIT_OF_BYTE[raw.reshape(ok.size, sudoku.board.N_CELLS)]
        bad = (d < 0).any(axis=1)
        status[ok[bad]] = 2
        digits[ok] = np.maximum(d, 0)
    return digits, status


def _violations(digits: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    return np.concatenate([sudoku.board.count_violations_batch(digits[i:i + chunk])
                           for i in range(0, len(digits), chunk)] or [np.zeros(0, dtype=np.int64)])


def solve_row(question: str) -> tuple[int, str | None, int]:
    """An 81-character question -> (number of solutions, capped at 2; the solution or None; backtracks)."""
    n, solution, backtracks = sudoku.board.analyse(sudoku.board.parse_board(question))
    return n, (sudoku.board.format_board(solution) if solution is not None else None), backtracks


def check_puzzles(frame: pd.DataFrame, where: list[str], origin: str, skip_invalid: bool,
                  solve_all: Callable[[list[str]], list] | None = None) -> tuple[pd.DataFrame, Counter]:
    """Check every row; return the good rows (questions/answers normalised to '.' blanks) and counts of dropped rows per reason.

    A bad row raises ValueError naming origin, row and reason unless skip_invalid. With
    solve_all (solve_row over a list of questions, e.g. in worker processes) the exact solver
    also rejects puzzles with no or several solutions and fills missing answers (and missing
    ratings, with this solver's backtrack count).
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
    if solve_all is not None:
        todo = np.flatnonzero(reason < 0)
        rows = solve_all(digits_to_strings(q[todo]))
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
            sudoku.board.parse_board(str(frame["question"].iloc[i]))
        except ValueError as e:
            return f" ({e})"
    return ""
