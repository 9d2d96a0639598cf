"""configurator.load_config: presets, overrides, and the errors that keep a typo from training silently."""
import glob
import os
from dataclasses import dataclass

import pytest

import configurator
from configurator import ConfigError, load_config


@dataclass
class Cfg:
    name: str = "run"
    steps: int = 10
    lr: float = 1e-3
    compile: bool = False


def test_preset_then_overrides_in_order(tmp_path):
    preset = tmp_path / "p.py"
    preset.write_text("steps = 500\nlr = 2e-4\nimport math  # modules are not config keys\n")
    cfg = load_config(Cfg, [str(preset), "--steps=7", "--name=relay_s2", "--compile=True"])
    assert cfg == Cfg(name="relay_s2", steps=7, lr=2e-4, compile=True)


def test_int_accepted_for_float_but_not_the_reverse():
    assert load_config(Cfg, ["--lr=1"]).lr == 1.0
    with pytest.raises(ConfigError, match="'steps' expects int"):
        load_config(Cfg, ["--steps=1.5"])


def test_unknown_key_and_bad_forms_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'stesp'"):
        load_config(Cfg, ["--stesp=3"])
    with pytest.raises(ConfigError, match="--key=value"):
        load_config(Cfg, ["--compile"])
    with pytest.raises(ConfigError, match="True/False"):
        load_config(Cfg, ["--compile=1"])
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(Cfg, [str(tmp_path / "missing.py")])


def test_help_lists_the_keys(capsys):
    with pytest.raises(SystemExit) as e:
        load_config(Cfg, ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "steps" in out and "= 10" in out


def test_errors_inside_a_preset_file_are_one_line_naming_file_and_line(tmp_path):
    """Bug checked: exec() of the preset outside a try; a syntax error or a NameError in a preset came out as
    a traceback instead of a ConfigError (which the scripts print as one line)."""
    broken = tmp_path / "broken.py"
    broken.write_text("steps = 5\nlr = (1e-3\n")
    with pytest.raises(ConfigError, match=f"config file {broken}, line 2: syntax error") as e:
        load_config(Cfg, [str(broken)])
    assert "\n" not in str(e.value)
    typo = tmp_path / "typo.py"
    typo.write_text("steps = 5\nlr = 1e-3 * scale\n")
    with pytest.raises(ConfigError, match=f"config file {typo}, line 2: NameError: name 'scale' is not defined"):
        load_config(Cfg, [str(typo)])
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not a text file"):
        load_config(Cfg, [str(binary)])


def test_argument_parser_refuses_in_one_line(capsys):
    """Checked: with plain argparse the refusal was two lines (the usage block, then the error)."""
    p = configurator.ArgumentParser(prog="script.py")
    p.add_argument("--n", type=int, default=1)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--n=abc"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "--n" in err and "'abc'" in err, err


def test_every_script_refuses_through_the_one_line_parser():
    """A script that builds a plain argparse parser prints two lines on a bad flag (checked: fails with one
    script switched back to argparse.ArgumentParser). examples/ stay plain argparse: they are to be copied
    out alone."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    scripts = glob.glob(os.path.join(root, "*.py")) + glob.glob(os.path.join(root, "scripts", "**", "*.py"),
                                                               recursive=True)
    scripts += glob.glob(os.path.join(root, "bench", "*.py")) + glob.glob(os.path.join(root, "fastdllm", "*.py"))
    plain = [os.path.relpath(s, root) for s in scripts if "argparse.ArgumentParser(" in open(s).read()]
    assert plain == [], plain
