"""NeMo's interpreter started once per test session: a fork server for the tests' NeMo processes.

Importing NeMo's SD stack (Lightning, torchmetrics, transformers, open_clip, Megatron) costs about 14 s
of CPU on the 2-core test machine, and the suite starts NeMo's interpreter dozens of times: directly and
through the launcher's jobs (data_check, encode_latents, samples, evaluation, the benchmark's tasks, on
the local backend and on the Slurm test cluster). This server imports those modules once; each request
forks it, and the child runs the program as `python [-u] (SCRIPT | -m MODULE | -c CODE) ARGS` would,
with the caller's argv, environment, working folder and stdin/stdout/stderr (passed as file
descriptors), then exits with its exit status. The program is NeMo's own code, unchanged; only the
interpreter's start-up is shared. `forkclient.py` is the `python` the tests hand out
(`fixtures/nemo.py`); NEMO_FORKSERVER=0 makes the tests use the real interpreter instead.

    <nemo python> forkserver.py SOCKET CLIENT  # serves until killed; prints "ready" once listening
                                               # CLIENT: the `python` that forwards to SOCKET
"""

from __future__ import annotations

import array
import atexit
import contextlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback

# The modules every NeMo program of the tests imports; nothing of the project (data_prep.nemo_compat
# patches NeMo when a program imports it, and must do so in the program's own process).
PRELOAD = (
    "torch",
    "lightning.pytorch",
    "nemo.collections.multimodal.models.text_to_image.stable_diffusion.ldm.ddpm",
    "nemo.collections.nlp.parts.megatron_trainer_builder",
    "nemo.utils.exp_manager",
    "open_clip",
)
FDS = 3  # stdin, stdout, stderr


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: JSON (argv, env, cwd) with the caller's three standard file descriptors."""
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_LEN(FDS * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("request cut short")
        data += more
    return json.loads(data), list(fds)


def _stdio(unbuffered: bool) -> None:
    """sys.std* now write to the caller's descriptors (the same numbers): buffered as a fresh interpreter
    would buffer them there. The objects are kept, so logging handlers made at import write through."""
    for stream in (sys.stdout, sys.stderr):
        fd = stream.fileno()
        stream.reconfigure(line_buffering=fd == 2 or os.isatty(fd), write_through=unbuffered)


def _exit_code(error: SystemExit) -> int:
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _run(argv: list[str]) -> int:
    """`argv` as python's own command line: [-u] then SCRIPT, -m MODULE or -c CODE, then the args."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    while argv and argv[0] == "-u":
        unbuffered, argv = True, argv[1:]
    _stdio(unbuffered)
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in _SERVER_PATH]
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[:] = ["", *entries, *base]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:] = [os.getcwd(), *entries, *base]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *entries, *base]
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as error:
        code = _exit_code(error)
    except BaseException as error:  # printed as the interpreter prints it: from the program's frames on
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        code = 1
    # What the interpreter does on its way out: join threads, run atexit handlers, flush.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the caller's program and exit with its status."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # A program that starts Python again (the rehearsal runs each step in a process of its own with
    # sys.executable) starts it through the server too, as the tests' `python` would.
    sys.executable = _CLIENT
    os._exit(_run(request["argv"]))


def _serve_one(conn: socket.socket) -> None:
    """In a forked handler: start the program, relay signals the client asks for, report its status.
    The client gone (killed) means the program is killed too, as a process of its own would die with it."""
    request, fds = _receive(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            return
        if select.select([conn], [], [], 0.05)[0]:
            message = conn.recv(64).split()
            os.kill(pid, int(message[0]) if message else signal.SIGKILL)


def serve(path: str) -> None:
    for name in PRELOAD:
        __import__(name)
    sys.stdout.flush()  # nothing the imports printed may reach a program's output
    sys.stderr.flush()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o666)
    server.listen(64)
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    print("ready", flush=True)
    # The fixture reads this output to its end (the imports print too): fd 1 is /dev/null from now on.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    while True:
        try:
            conn, _ = server.accept()
        except InterruptedError:
            continue
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _serve_one(conn)
            finally:
                os._exit(0)
        conn.close()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


_SERVER_PATH = {sys.path[0]} | {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}

if __name__ == "__main__":
    _CLIENT = sys.argv[2]
    serve(sys.argv[1])
