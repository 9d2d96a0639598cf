"""Export a Sudoku run's EMA weights as a small safetensors file (the quick start's reference models).

    python scripts/sudoku/export_reference.py --ckpt=runs/budget_clean/relay_cold_s1 --out=reference/relay.safetensors
    python scripts/sudoku/export_reference.py --ckpt=old.safetensors --out=new.safetensors   # an export again: portable paths
    python scripts/sudoku/export_reference.py --ckpt=older.safetensors --out=new.safetensors --allow_unverified
        # an export from before digests (no sha256: its weights cannot be verified): written again with one

Writes only what decoding needs: the EMA weights (fp32, what the run's own validation used), the
model config, the run's config (its paths under this repository made relative to it, so a committed
export names no machine's directories), the step it stopped at and the sha256 of all of them (checked
on load).
common.load_model reads the file like a run directory, so sample.py --ckpt=reference/relay.safetensors
works too.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
from common import CheckpointError, load_checkpoint  # noqa: E402
from common import load_weights, save_weights  # noqa: E402
from model import model_from_checkpoint  # noqa: E402
from sudoku.report import portable_path  # noqa: E402

PATH_KEYS = ("out_dir", "data_dir", "init_from")  # the run config's paths


def portable_config(config: dict) -> dict:
    """The run's config with each absolute path inside this repository made relative to it (relative paths
    were relative to the training command's directory, the repository root, and stay as they are)."""
    return {k: portable_path(v) if k in PATH_KEYS and isinstance(v, str) and os.path.isabs(v) else v
            for k, v in config.items()}


def main(argv: list[str] | None = None) -> None:
    p = configurator.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--ckpt", required=True, help="a train_sudoku.py out_dir or its ckpt.pt, or an exported "
                   ".safetensors file (written again with a digest and portable paths)")
    p.add_argument("--out", required=True, help="the .safetensors file to write")
    p.add_argument("--allow_unverified", action="store_true", help="read a checkpoint or exported file that has no "
                   "checksum (written before checksums were added, or damaged: only a file you trust) and write it with one")
    args = p.parse_args(argv)
    if not args.out.endswith(".safetensors"):
        raise SystemExit(f"--out {args.out}: give a path ending in .safetensors")
    if args.ckpt.endswith(".safetensors"):  # an exported file again: same weights, metadata and a fresh digest
        try:
            model, meta = load_weights(args.ckpt, allow_unverified=args.allow_unverified)
        except ValueError as e:
            raise SystemExit(f"--ckpt: {e}") from None
        config = portable_config(meta.pop("config"))
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        save_weights(model, args.out, {**meta, "config": json.dumps(config)})
        print(f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB): the weights of {args.ckpt}, digest and portable paths")
        return
    path = os.path.join(args.ckpt, "ckpt.pt") if os.path.isdir(args.ckpt) else args.ckpt
    try:
        ckpt = load_checkpoint(path, map_location="cpu", required=("model", "model_config", "step"),
                               allow_unverified=args.allow_unverified)
    except (CheckpointError, ValueError, OSError) as e:
        raise SystemExit(f"--ckpt: {str(e).strip().splitlines()[0]}") from None
    if ckpt.get("ema") is None:
        raise SystemExit(f"--ckpt {args.ckpt}: the run kept no EMA weights (ema_decay=0); nothing to export")
    model, config = model_from_checkpoint(ckpt, ema=True), portable_config(dict(ckpt.get("config", {})))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_weights(model, args.out, {"config": json.dumps(config), "step": str(ckpt["step"]), "weights": "ema"})
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB): {config.get('objective')} at step "
          f"{ckpt['step']}, EMA weights")


if __name__ == "__main__":
    main()
