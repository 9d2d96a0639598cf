"""The --device option of tests/conftest.py (docs/developing.md): a GPU run must run on the GPU or stop.

Both tests run pytest in-process on a two-test file with torch.cuda patched, so they check the same
thing on a machine with or without CUDA.
"""
import os

import pytest
import torch

pytest_plugins = ["pytester"]

CONFTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
TWO_TESTS = """
def test_takes_the_device(device):
    assert device.type == "cuda"

def test_cpu_only():
    pass
"""
NO_DEVICE_TESTS = """
import a_module_this_machine_lacks

def test_data_file():
    pass
"""


def run(pytester, monkeypatch, cuda: bool, *args, cpu_file: bool = True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(cuda))
    pytester.makeconftest(open(CONFTEST).read())
    pytester.makepyfile(test_two=TWO_TESTS, **({"test_cpu_file": NO_DEVICE_TESTS} if cpu_file else {}))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def test_cuda_without_cuda_stops_with_one_line(pytester, monkeypatch):
    """--device=cuda where torch sees no CUDA is a usage error before any test runs, never a run that
    passes with everything skipped or on the CPU. Checked: fails when check_device returns None for
    an unavailable CUDA (the silent CPU fallback: both tests then run and pass)."""
    result = run(pytester, monkeypatch, False, "--device=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert errors == [errors[0]] and "--device=cuda" in errors[0] and "no CUDA device" in errors[0], errors
    assert "passed" not in result.stdout.str() and "skipped" not in result.stdout.str()  # nothing ran
    for bad in ("gpu", "cuda:3"):
        assert run(pytester, monkeypatch, True, f"--device={bad}").ret == pytest.ExitCode.USAGE_ERROR


def test_accelerator_run_keeps_the_device_tests_and_counts_them(pytester, monkeypatch):
    """With a (patched) CUDA, --device=cuda runs only the tests that take the fixture, hands them
    torch.device("cuda") and says how many ran; a test file without device tests is not imported (its
    missing import would stop the run); the default run is unchanged. Checked: fails when the
    deselection is dropped, when the fixture returns cpu, when the summary line is not printed, and
    when pytest_ignore_collect is removed (collection error)."""
    result = run(pytester, monkeypatch, True, "--device=cuda")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["--device=cuda: 1 tests ran on cuda (1 passed, 0 failed, 0 skipped); "
                                 "1 tests that do not take the device fixture were deselected and 1 test files "
                                 "without one were not collected*"])
    assert run(pytester, monkeypatch, True).ret == pytest.ExitCode.INTERRUPTED  # the default run imports every file
    (pytester.path / "test_cpu_file.py").unlink()
    default = run(pytester, monkeypatch, True, cpu_file=False)
    default.assert_outcomes(passed=1, failed=1)  # device is cpu there, so the cuda assertion fails
    assert "tests ran on" not in default.stdout.str()
