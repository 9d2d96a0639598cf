"""config/*.py: each preset resolves to the config it always had, and restates nothing it inherits.

tests/data/presets.json pins every preset's final config (defaults + shared base + preset), written
before the presets were cut down to their differences. Regenerate it only for a deliberate change:
    python tests/test_presets.py --write
"""
import ast
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import config_to_dict, load_config  # noqa: E402

PIN = os.path.join(ROOT, "tests", "data", "presets.json")


IDENTITY = ("objective", "tie_embeddings", "out_dir")  # what a preset is: stated even when it is the default


def presets() -> list[str]:
    """The runnable presets; config/base_*.py are the shared settings they execute."""
    paths = glob.glob(os.path.join(ROOT, "config", "*.py"))
    return sorted(os.path.relpath(p, ROOT) for p in paths if not os.path.basename(p).startswith("base_"))


def bases() -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "config", "base_*.py")))


def config_class(preset: str):
    if os.path.basename(preset).startswith(("fastdllm_", "base_fastdllm")):
        from train_fastdllm import TrainConfig
    else:
        from train_sudoku import TrainConfig
    return TrainConfig


def resolve(preset: str) -> dict:
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return config_to_dict(load_config(config_class(preset), [preset]))
    finally:
        os.chdir(cwd)


def own_assignments(preset: str) -> dict:
    """The keys a preset file assigns itself, with their values (not those of the base it executes)."""
    tree = ast.parse(open(os.path.join(ROOT, preset)).read())
    return {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def inherited(preset: str) -> dict:
    """What the preset would get without its own assignments: the trainer's defaults and its base file."""
    values = config_to_dict(config_class(preset)())
    for node in ast.parse(open(os.path.join(ROOT, preset)).read()).body:
        src = ast.unparse(node)
        if "exec(" in src:  # the shared base it executes
            base = next(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and str(n.value).endswith(".py"))
            values.update(own_assignments(os.path.join("config", base)))
    return values


def test_pin_every_preset_config():
    """Fails when a preset's final config changes (checked by dropping data_dir from config/base_table1.py
    and batch_size from config/fastdllm_tiny.py)."""
    pinned = json.load(open(PIN))
    assert sorted(pinned) == presets(), "a preset was added or removed: pin it deliberately (--write)"
    changed = {p: {k: (v, resolve(p)[k]) for k, v in cfg.items() if resolve(p)[k] != v} for p, cfg in pinned.items()}
    assert not any(changed.values()), {p: c for p, c in changed.items() if c}


def test_presets_hold_only_their_differences():
    """Fails when a preset assigns a key to the value it already inherits from the trainer's defaults or its base
    (checked by adding batch_size = 512 to config/relay_tied.py and n_layer = 4 to config/base_cpu.py).
    The keys that say what a preset is (IDENTITY) are stated even when they equal the default."""
    restated = {p: [k for k, v in own_assignments(p).items() if k not in IDENTITY and inherited(p).get(k, object()) == v]
                for p in presets() + bases()}
    assert not any(restated.values()), {p: ks for p, ks in restated.items() if ks}


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    json.dump({p: resolve(p) for p in presets()}, open(PIN, "w"), indent=1, sort_keys=True)
    print(f"wrote {PIN}")
