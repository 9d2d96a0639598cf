"""Cost of the checkpoint checksum: a full train_sudoku.py checkpoint of a preset's model (weights, EMA,
AdamW state) is hashed, saved and loaded with verification, next to a plain torch.load.

    python bench/bench_checkpoint.py                      # the paper's relay model (config/relay_tied.py)
    python bench/bench_checkpoint.py config/cpu_relay.py
"""
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import checksum, load_checkpoint, save_checkpoint  # noqa: E402
from configurator import ConfigError, load_config  # noqa: E402
from model import SudokuTransformer  # noqa: E402
from train_sudoku import EMA, TrainConfig, model_config, optimizer_groups  # noqa: E402


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = load_config(TrainConfig, argv or ["config/relay_tied.py"])
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    model = SudokuTransformer(model_config(cfg))
    optimizer = torch.optim.AdamW(optimizer_groups(model, cfg.weight_decay), lr=cfg.learning_rate)
    model(torch.zeros(2, 81, dtype=torch.long))[0].sum().backward()
    optimizer.step()  # fills AdamW's two moment buffers
    ckpt = {"model": model.state_dict(), "ema": EMA(model, cfg.ema_decay).state_dict(),
            "optimizer": optimizer.state_dict(), "config": vars(cfg), "step": 1}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt.pt")
        t_hash = timed(lambda: checksum(ckpt))
        t_save = timed(lambda: save_checkpoint(ckpt, path))
        t_load = timed(lambda: load_checkpoint(path))
        t_plain = timed(lambda: torch.load(path, weights_only=True))
        size = os.path.getsize(path) / 1e6
    print(f"{model.num_params():,} parameters | checkpoint {size:.1f} MB | checksum {t_hash:.2f} s | "
          f"save_checkpoint {t_save:.2f} s | load_checkpoint (verified) {t_load:.2f} s | torch.load {t_plain:.2f} s")


if __name__ == "__main__":
    main()
