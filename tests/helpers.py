"""What several test files share: stand-in models, tiny data and small file utilities. Test files import
from here, never from each other.

Sections: Sudoku training data (tiny runs of train_sudoku.py), Sudoku decoding stand-ins (sample.py and
sudoku.decode), Fast-dLLM v2 decoding stand-in (fastdllm.generate), files, Sudoku data sources.
"""
import gzip
import hashlib
import json
import math
import os
import struct
import types
import zipfile
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

import sudoku.board
import sudoku.hard
import sudoku.puzzle_files as F
import sudoku.symmetry as Y
from model import ModelConfig, SudokuTransformer
from sudoku.board import DIGIT0, digits_to_tokens, format_board, random_grid, tokens_to_digits


# -----------------------------------------------------------------------------
# Sudoku training data: tiny runs of train_sudoku.py

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--d_ff=64", "--batch_size=16", "--eval_puzzles=16",
        "--log_interval=1", "--device=cpu", "--warmup_iters=2", "--learning_rate=3e-3"]


def random_grids(n: int, rng: np.random.Generator) -> np.ndarray:
    """Valid solved grids: a pattern grid with shuffled digits, rows within bands, bands, columns, stacks."""
    r = np.arange(9)
    base = (r[:, None] * 3 + r[:, None] // 3 + r[None, :]) % 9
    out = []
    for _ in range(n):
        rows = np.concatenate([b * 3 + rng.permutation(3) for b in rng.permutation(3)])
        cols = np.concatenate([b * 3 + rng.permutation(3) for b in rng.permutation(3)])
        out.append((rng.permutation(9) + 1)[base[rows][:, cols]].reshape(81))
    return np.stack(out)


def tiny_split(n: int, clues: tuple[int, int], seed: int) -> types.SimpleNamespace:
    """Tiny data with prepare_data.load_puzzles' interface (.question/.answer token arrays)."""
    rng = np.random.default_rng(seed)
    solution = random_grids(n, rng)
    question = solution.copy()
    for row in question:
        row[rng.permutation(81)[: 81 - rng.integers(clues[0], clues[1] + 1)]] = 0
    return types.SimpleNamespace(question=digits_to_tokens(question), answer=digits_to_tokens(solution))


TRAIN, VAL = tiny_split(96, (30, 44), 0), tiny_split(16, (30, 44), 1)


# -----------------------------------------------------------------------------
# Sudoku decoding: stand-in models (logits built from a rule, so confidences are exact), puzzles, checkpoints

def make_puzzles(n: int, seed: int = 0, blank: tuple[float, float] = (0.3, 0.7)):
    """n random solved grids with a random fraction of cells blanked -> (questions, answers) token ids."""
    rng = np.random.default_rng(seed)
    qs, ans = [], []
    for _ in range(n):
        sol = random_grid(rng)
        q = sol.copy()
        q[rng.random(81) < rng.uniform(*blank)] = 0
        qs.append(digits_to_tokens(q))
        ans.append(digits_to_tokens(sol))
    return torch.tensor(np.array(qs)), torch.tensor(np.array(ans))


def logits_from(conf: torch.Tensor, digit: torch.Tensor) -> torch.Tensor:
    """(B, 81) confidence and digit 1..9 -> (B, 81, 17) logits whose softmax max is exactly conf at that digit."""
    probs = ((1 - conf) / 16)[..., None].expand(*conf.shape, 17).clone()
    probs.scatter_(-1, (DIGIT0 + digit)[..., None], conf[..., None])
    return probs.log()


class ScriptedDenoiser(nn.Module):
    """A stand-in model: rule(tokens, h) -> (conf, digit, h_out); records every call."""

    def __init__(self, rule, relay: bool = False):
        super().__init__()
        self.rule, self.config, self.calls = rule, SimpleNamespace(relay=relay), []

    def forward(self, tokens, h=None):
        if h is not None and not self.config.relay:
            raise ValueError("plain model got h")
        self.calls.append((tokens.clone(), None if h is None else h.clone()))
        conf, digit, h_out = self.rule(tokens, h)
        return logits_from(conf.float(), digit.long()), h_out


def fixed_rule(conf81, digits81):
    """The same confidence and digit per cell at every step."""
    def rule(tokens, h):
        B = tokens.size(0)
        return conf81.expand(B, 81), digits81.expand(B, 81), torch.zeros(B, 81, 2, device=tokens.device)
    return rule


def tiny_sudoku(relay: bool, seed: int = 0) -> SudokuTransformer:
    torch.manual_seed(seed)
    return SudokuTransformer(ModelConfig(n_layer=2, n_head=2, n_embd=32, d_ff=64, dropout=0.0, relay=relay)).eval()


def one_puzzle(n_blank_cells: list[int]):
    sol = random_grid(np.random.default_rng(1))
    q = sol.copy()
    q[n_blank_cells] = 0
    return torch.tensor(digits_to_tokens(q))[None], torch.tensor(digits_to_tokens(sol))[None], sol


def constant_checkpoint(path, digit: int = 5, conf: float = 0.9, objective: str = "mlm", seed: int = 0) -> str:
    """A real SudokuTransformer checkpoint that predicts `digit` with confidence `conf` at every cell."""
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=16, d_ff=32, dropout=0.0, relay=objective.startswith("relay"))
    model = SudokuTransformer(cfg)
    logp = torch.full((17,), math.log((1 - conf) / 16))
    logp[DIGIT0 + digit] = math.log(conf)
    with torch.no_grad():  # final LayerNorm outputs its bias e_0 whatever the input; the head maps e_0 to logp
        model.final_norm.weight.zero_()
        model.final_norm.bias.zero_()
        model.final_norm.bias[0] = 1.0
        model.head.weight.zero_()
        model.head.weight[:, 0] = logp
    return write_checkpoint(path, model, objective, seed)


def write_checkpoint(path, model, objective: str = "relay", seed: int = 1, ema_shadow: dict | None = None) -> str:
    """model as train_sudoku.py writes it (checksummed by common.save_checkpoint), with the entries loaders read."""
    from dataclasses import asdict
    from common import save_checkpoint
    save_checkpoint({"model": model.state_dict(), "model_config": asdict(model.config),
                     "ema": {"shadow": ema_shadow, "num_updates": 1} if ema_shadow else None,
                     "config": {"objective": objective, "tie_embeddings": False, "seed": seed}}, str(path))
    return str(path)


def puzzle_csv(path, n: int = 6) -> str:
    q, a = make_puzzles(n, seed=11)
    rows = ["question,answer"] + [f"{format_board(tokens_to_digits(x.numpy()))},{format_board(tokens_to_digits(y.numpy()))}"
                                  for x, y in zip(q, a)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


# -----------------------------------------------------------------------------
# Fast-dLLM v2 decoding: a scripted stand-in whose logit at position q predicts token q+1 with a fixed confidence

BLOCK_VOCAB, BLOCK_MASK, BLOCK_STOP = 16, 0, 1


def block_script(j: int, stop_at: int) -> tuple[int, float]:
    """Token and confidence the stand-in gives to absolute position j."""
    if j == stop_at:
        return BLOCK_STOP, 0.4
    return 2 + j % 11, 0.95 if j % 3 == 0 else 0.2 + 0.01 * (j % 7)


class ScriptedBlockModel(torch.nn.Module):
    def __init__(self, stop_at: int = -1):
        super().__init__()
        self.config = SimpleNamespace(bd_size=8, mask_token_id=BLOCK_MASK, eos_token_id=BLOCK_STOP, num_hidden_layers=1)
        self.relay_layer_norm = None
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.stop_at = stop_at
        self.calls = []

    def forward(self, input_ids, relay_h=None, attention_mask=None, position_ids=None, past_key_values=None):
        pos = position_ids[0].tolist()
        self.calls.append((input_ids.shape[0], pos[0], len(pos)))
        logits = torch.full((input_ids.shape[0], len(pos), BLOCK_VOCAB), 0.0, device=input_ids.device)
        for k, q in enumerate(pos):
            tok, conf = block_script(q + 1, self.stop_at)
            # softmax(log p) = p: conf on tok, the rest spread evenly
            p = torch.full((BLOCK_VOCAB,), (1 - conf) / (BLOCK_VOCAB - 1), device=input_ids.device)
            p[tok] = conf
            logits[:, k] = p.log()
        return SimpleNamespace(logits=logits, hidden=torch.zeros(input_ids.shape[0], len(pos), 4, device=input_ids.device))


# -----------------------------------------------------------------------------
# files

def corrupt_tensor_byte(path) -> None:
    """Flip one bit of one byte inside the largest tensor record of a torch.save zip (torch.load checks no CRC)."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    raw = bytearray(open(path, "rb").read())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26: info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + info.file_size // 2] ^= 0x40
    open(path, "wb").write(bytes(raw))


def snapshot(path) -> dict | None:
    """{relative path: sha256} of every file under path (None when path does not exist)."""
    if not os.path.exists(path):
        return None
    if os.path.isfile(path):
        return {"": hashlib.sha256(open(path, "rb").read()).hexdigest()}
    return {os.path.relpath(os.path.join(d, f), path): hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
            for d, _, files in os.walk(path) for f in files}


# -----------------------------------------------------------------------------
# Sudoku data sources: symmetric copies and a stand-in for the larsdoku package

NORVIG_HARD = "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"


def transformed(question: str, answer: str, seed: int) -> tuple[str, str]:
    """A relabelled, transposed (and row/column-shuffled) copy of a puzzle and its solution."""
    relabel, rows, cols, _ = Y.random_symmetry(np.random.default_rng(seed))
    sym = (relabel, rows, cols, True)
    q, a = (Y.apply_symmetry(F.strings_to_digits([s])[0], sym) for s in (question, answer))
    return F.digits_to_strings(q[None])[0], F.digits_to_strings(a[None])[0]


def fake_larsdoku(tmp_path, monkeypatch, classes: int, copies: int, top_puzzles: int) -> tuple[pd.DataFrame, list[str]]:
    """A small stand-in for the larsdoku package's two data files: `classes` puzzles with `copies`
    symmetric copies each, over two sub-collections, and a Top1465 list of `top_puzzles` other puzzles,
    one of which is also planted (transformed) in the collection."""
    rng = np.random.default_rng(5)
    made = [sudoku.board.generate_puzzle(rng, 24)[:2] for _ in range(classes + top_puzzles)]
    rows = []
    for i, (q, a) in enumerate(made[:classes] + made[classes:classes + 1]):
        for k in range(copies if i < classes else 1):
            sym = Y.random_symmetry(np.random.default_rng([i, k]))
            rows.append((Y.apply_symmetry(q, sym), Y.apply_symmetry(a, sym)))
    entries = [{"mask": "".join("1" if d else "0" for d in q), "solution": "".join(map(str, a))} for q, a in rows]
    data = {"meta": {}, "fn_fc_day1": entries[::2], "killer_combo": entries[1::2]}
    collection, top = tmp_path / "puzzle_collection.json.gz", tmp_path / "top1465.py"
    with gzip.open(collection, "wt") as f:
        json.dump(data, f)
    top_strings = F.digits_to_strings(np.stack([q for q, _ in made[classes:]]))
    top.write_text(f'"""stand-in"""\nTOP1465 = {top_strings!r}\n')
    monkeypatch.setattr(sudoku.hard, "larsdoku_file", lambda name: str(tmp_path / name))
    sudoku.hard.read_top1465.cache_clear()
    return pd.DataFrame(rows, columns=["question", "answer"]), top_strings


# Table 2 in miniature's task words, read independently of the generators' code templates (fastdllm/tasks.py,
# fastdllm/tasks_v2.py): what each filter and map means.
FILTER_MEANING = {"all": lambda v, k: True, "even": lambda v, k: v % 2 == 0, "odd": lambda v, k: v % 2 != 0,
                  "positive": lambda v, k: v > 0, "negative": lambda v, k: v < 0, "greater": lambda v, k: v > k,
                  "less": lambda v, k: v < k, "divisible": lambda v, k: v % k == 0,
                  "indivisible": lambda v, k: v % k != 0}
MAP_MEANING = {"same": lambda v, k: v, "square": lambda v, k: v ** 2, "cube": lambda v, k: v * v * v,
               "times": lambda v, k: k * v, "plus": lambda v, k: v + k, "minus": lambda v, k: v - k,
               "abs": lambda v, k: v if v >= 0 else -v, "negate": lambda v, k: 0 - v,
               "mod": lambda v, k: v - k * (v // k), "floordiv": lambda v, k: (v - v % k) // k}
