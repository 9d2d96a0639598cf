"""Tim Vink's solver fields (trajectory, num_steps, strategies_used) and the paper's deduction-only cohort.

derive_one runs the solver (PyPI sudoku-solver-tim) one solve_step at a time, recording the
board after each step, under a per-puzzle time limit (SIGALRM): the solver's last-resort
brute force is naive backtracking that can take minutes on a hard puzzle. The strategy
names map to the tiers Easy < Medium < Advanced < Master < Brute Force; the deduction-only
cohort of the paper's Table 1 is "no Brute Force, at least one Advanced or Master strategy".
"""
import ast
import logging
import os
import signal

import numpy as np
import pandas as pd

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
DERIVED_COLUMNS = ("trajectory", "num_steps", "strategies_used", "derive_status")


# -----------------------------------------------------------------------------
# running the solver

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

        root.handlers[:] = handlers
        root.setLevel(level)
        tim.console = type(tim.console)(file=open(os.devnull, "w"))  # a fresh console of its own kind, printing nowhere
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
        # check is_solved() first: a solve_step on a solved board falls through to (and records) "Brute Force"
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


# -----------------------------------------------------------------------------
# strategy names, tiers and the cohort

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
