"""The eight hostile completions and the control, judged in one harness process: a self-contained check
that tests/test_sandbox.py runs under other interpreters (a virtual environment under /tmp or /work).

    python tests/hostile.py MODE [MODE ...]

prints {"auto": what --sandbox=auto picks, "modes": {mode: {case: {"passed", "contained"}}}} as JSON.

Each hostile program is paired with a wrong `add`, so a pass can only be forged; "contained" says the
side effect it tries (a file written outside, a byte sent to the harness, a process left alive, the
harness's secret read, the harness killed) did not happen. Only stdlib, fastdllm/sandbox.py and fastdllm/judge.py:
it must run in a bare virtual environment. The harness's environment must hold RELAY_HOSTILE_SECRET (the test sets it).
"""
import json
import os
import random
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fastdllm.judge  # noqa: E402
import fastdllm.sandbox  # noqa: E402

TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(5, 7) == 12\n"
WRONG = "def add(x, y):\n    return x - y\n"
RIGHT = "def add(x, y):\n    return x + y\n"


def live(tok: str) -> list[int]:
    """Host pids of live (not zombie) processes whose command line holds `tok` (test_sandbox.py uses it too)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if tok.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def _programs(scratch: str, port: int, tok: str, secret: str) -> dict[str, str]:
    """case -> program (before the test code); `scratch` is a host directory outside the sandbox."""
    wrote, late = os.path.join(scratch, "outside.txt"), os.path.join(scratch, "late.txt")
    return {
        "sys.exit(0)": "import sys\nsys.exit(0)\n" + WRONG,
        "os._exit(0)": "import os\nos._exit(0)\n" + WRONG,
        "write outside": f"open({wrote!r}, 'w').write('pwned')\n" + WRONG,
        "read the parent's environ": (
            "import os\nfound = False\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
            f"        found = found or {secret.encode()!r} in open(f'/proc/{{pid}}/environ', 'rb').read()\n"
            "    except OSError:\n        pass\ndef add(x, y):\n    return x + y if found else x - y\n"),
        "kill the parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG,
        "setsid grandchild writes later": (
            "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 1.{tok}; echo pwned > {late}'])\n    os._exit(0)\n" + WRONG),
        "socket to 127.0.0.1": (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)"
                                ".sendall(b'pwned')\nexcept OSError:\n    pass\n" + WRONG),
        "forked child outlives the program": (f"import os\nif os.fork() == 0:\n    os.execv('/usr/bin/sleep', "
                                              f"['sleep', '30.{tok}9'])\n" + WRONG),
        "control": RIGHT,
    }


def run(modes: list[str]) -> dict[str, dict[str, dict]]:
    """Judge every case in each mode; then, once the grandchildren would have written, check each side
    effect from outside."""
    secret, tok = os.environ["RELAY_HOSTILE_SECRET"], str(random.randrange(10**8, 10**9))
    with tempfile.TemporaryDirectory(prefix="relay-hostile-") as scratch:
        verdicts, servers = {}, {}
        for mode in modes:
            os.mkdir(os.path.join(scratch, mode))
            servers[mode] = server = socket.socket()
            server.bind(("127.0.0.1", 0))
            server.listen(8)
            server.setblocking(False)
            programs = _programs(os.path.join(scratch, mode), server.getsockname()[1], tok + str(len(verdicts)), secret)
            verdicts[mode] = {case: fastdllm.judge.judge_check(code, TEST, "add", 10.0, 1.0, mode)["passed"]
                              for case, code in programs.items()}
        time.sleep(1.5)  # the setsid grandchildren would have written by now
        return {mode: _side_effects(verdicts[mode], os.path.join(scratch, mode), servers[mode], tok + str(k))
                for k, mode in enumerate(modes)}


def _side_effects(verdicts: dict[str, bool], scratch: str, server: socket.socket, tok: str) -> dict[str, dict]:
    try:
        received = server.accept()[0].recv(100)
    except OSError:
        received = b""
    server.close()
    held = {"write outside": not os.path.exists(os.path.join(scratch, "outside.txt")),
            "setsid grandchild writes later": not os.path.exists(os.path.join(scratch, "late.txt")) and not live(tok),
            "socket to 127.0.0.1": received == b"",
            "forked child outlives the program": not live(tok + "9")}
    # the harness survived "kill the parent" by getting here; the environ case holds if it did not pass
    return {case: {"passed": passed, "contained": held.get(case, case == "control" or not passed)}
            for case, passed in verdicts.items()}


if __name__ == "__main__":
    try:
        auto = fastdllm.sandbox.choose_mode("auto").mode
    except ValueError as e:
        auto = str(e)
    print(json.dumps({"auto": auto, "modes": run(sys.argv[1:])}))
