"""The prepared Sudoku splits on disk: one (N, 2, 81) uint8 array of question and answer digits per split.

data_dir/{split}.npy holds puzzle i's clues at [i, 0] and its solution at [i, 1], as digits
(0 = blank, 1-9) in row-major cell order. prepare_data.py writes these files (next to
{split}.parquet, which keeps every column for inspection and the cohorts); training reads
one with a single memory-mapped np.load, without pandas.

    from sudoku.data import load_split, split_tokens
    question, answer = split_tokens(load_split("train"))  # (N, 81) uint8 token ids, blanks = [MASK]
"""
import os

import numpy as np

import sudoku.board

SPLITS = ("train", "val", "test")
DATA_DIR = "data/sudoku"

# digit -> token id (blank -> [MASK]), as sudoku.board.digits_to_tokens but staying uint8 (ids < 17)
_TOKEN_OF_DIGIT = sudoku.board.digits_to_tokens(np.arange(10)).astype(np.uint8)


def split_path(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, f"{split}.npy")


def prepare_command(data_dir: str) -> str:
    """The command that builds data_dir (the default directory needs no flag)."""
    flag = "" if os.path.normpath(data_dir) == os.path.normpath(DATA_DIR) else f" --out_dir={data_dir}"
    return f"python prepare_data.py{flag}"


def save_split(path: str, question: np.ndarray, answer: np.ndarray) -> None:
    """Write (N, 81) question and answer digits as one (N, 2, 81) uint8 array, atomically."""
    boards = np.stack([np.asarray(question), np.asarray(answer)], axis=1).astype(np.uint8)
    with open(path + ".tmp", "wb") as f:
        np.save(f, boards)
    os.replace(path + ".tmp", path)


def load_split(split: str, data_dir: str = DATA_DIR) -> np.ndarray:
    """A prepared split as its (N, 2, 81) uint8 digit array, memory-mapped; a missing or bad file ends
    the program with one line naming the command to run."""
    path = split_path(data_dir, split)
    command = prepare_command(data_dir)
    if os.path.isfile(data_dir):
        raise SystemExit(f"data_dir={data_dir} is a file, not a data directory")
    if not os.path.exists(path):
        if os.path.exists(os.path.join(data_dir, f"{split}.parquet")):
            raise SystemExit(f"{data_dir} was written by an older prepare_data.py ({split}.parquet but no {split}.npy): "
                             f"rerun the command that built it (its arguments are in {data_dir}/meta.json), "
                             f"e.g. `{command}`; with the same arguments it only adds the .npy files")
        raise SystemExit(f"{path} not found: build the Sudoku data first with `{command}`")
    try:
        boards = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path} is not a readable array file ({type(e).__name__}): rebuild it with "
                         f"`{command} --force`") from None
    if boards.dtype != np.uint8 or boards.ndim != 3 or boards.shape[1:] != (2, sudoku.board.N_CELLS):
        raise SystemExit(f"{path} holds a {boards.dtype} array of shape {boards.shape}, not (N, 2, 81) uint8 digits: "
                         f"rebuild it with `{command} --force`")
    return boards


def split_tokens(boards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, 2, 81) digits -> question and answer (N, 81) uint8 token ids (blanks = [MASK])."""
    if boards.size and boards.max() > 9:
        raise SystemExit("a Sudoku split holds values above 9: not digits as prepare_data.py writes them; rebuild it "
                         "with --force")
    return _TOKEN_OF_DIGIT[boards[:, 0]], _TOKEN_OF_DIGIT[boards[:, 1]]
