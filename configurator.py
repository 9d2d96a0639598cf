"""Typed configuration from Python preset files and --key=value overrides.

    python train_sudoku.py config/relay_tied.py --max_iters=1000 --device=cpu

Each positional argument is a Python file whose top-level assignments set config
fields (the presets that share settings first execute a base file, e.g. config/base_table1.py); each --key=value overrides one field, parsed as a Python literal (falling back
to a plain string). Unknown keys and wrong types are errors, so a typo never silently
leaves a default in place. The defaults and their meaning live in the script's
config dataclass, one field per line.

The scripts that take plain flags use ArgumentParser below: argparse whose refusals are one line.
"""
import argparse
import ast
import dataclasses
import os
import sys
import traceback
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    pass


class ArgumentParser(argparse.ArgumentParser):
    """argparse that refuses a bad flag in one line, `prog: error: <what> (--help lists the flags)`, exit
    status 2, instead of the usage block followed by the error."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def _coerce(name: str, value: Any, typ: Any) -> Any:
    if typing.get_origin(typ) is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None:
            return None
        typ = args[0]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(f"config key '{name}' expects True/False, got {value!r}")
    if isinstance(typ, type) and not isinstance(value, typ):
        raise ConfigError(f"config key '{name}' expects {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def _parse_literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # bare strings such as --device=cpu


def _run_config_file(source: str, path: str) -> dict[str, Any]:
    """Execute a preset file; any error in it becomes one ConfigError naming the file and line.
    __file__ is set as for a module, so a preset can execute a shared base next to it."""
    namespace: dict[str, Any] = {}
    try:
        exec(compile(source, path, "exec"), {"__file__": path}, namespace)
    except SyntaxError as e:
        raise ConfigError(f"config file {path}, line {e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
        where = f", line {lines[-1]}" if lines else ""
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"config file {path}{where}: {type(e).__name__}: {detail}") from None
    return namespace


def load_config(cls: type[T], argv: list[str] | None = None) -> T:
    """Build an instance of the dataclass `cls` from preset files and --key=value overrides."""
    argv = sys.argv[1:] if argv is None else argv
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    if "-h" in argv or "--help" in argv:
        print(f"usage: {os.path.basename(sys.argv[0])} [preset.py ...] [--key=value ...]\nkeys and defaults:")
        print_config(cls())
        raise SystemExit(0)
    values: dict[str, Any] = {}

    def set_value(key: str, value: Any, origin: str) -> None:
        if key not in fields:
            raise ConfigError(f"unknown config key '{key}' (from {origin}); known keys: {', '.join(fields)}")
        values[key] = _coerce(key, value, hints[key])

    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg:
                raise ConfigError(f"override '{arg}' must look like --key=value")
            key, text = arg[2:].split("=", 1)
            set_value(key, _parse_literal(text), arg)
        else:
            try:
                source = open(arg).read()
            except OSError as e:
                raise ConfigError(f"cannot read config file {arg}: {e.strerror}") from None
            except UnicodeDecodeError:
                raise ConfigError(f"config file {arg} is not a text file") from None
            namespace = _run_config_file(source, arg)
            for key, value in namespace.items():
                if not key.startswith("_") and not callable(value) and not isinstance(value, type(typing)):
                    set_value(key, value, arg)
    return cls(**values)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def print_config(cfg: Any) -> None:
    width = max(len(k) for k in config_to_dict(cfg))
    for key, value in config_to_dict(cfg).items():
        print(f"  {key:<{width}} = {value!r}")
