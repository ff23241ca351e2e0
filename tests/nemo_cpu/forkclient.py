"""The `python` that the tests hand out for NeMo: runs its command line in the fork server
(forkserver.py), or in the real interpreter where the server is not there or the command line is not
one it runs. Exits as the program exits; SIGTERM, SIGINT and SIGHUP are passed on to the program.

    forkclient.py SOCKET REAL_PYTHON [python's own arguments...]
"""

import array
import json
import os
import signal
import socket
import sys


def _runs_in_server(argv: list[str]) -> bool:
    """`[-u] (SCRIPT | -m MODULE | -c CODE) ARGS`: what the server runs; anything else runs as is."""
    while argv[:1] == ["-u"]:
        argv = argv[1:]
    if not argv:
        return False
    if argv[0] in ("-m", "-c"):
        return len(argv) > 1
    return not argv[0].startswith("-")


def main() -> None:
    path, real_python, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not _runs_in_server(argv):
            raise ConnectionError
        conn.connect(path)
    except OSError:
        os.execv(real_python, [real_python, *argv])
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}) + "\n"
    fds = array.array("i", [0, 1, 2])
    conn.sendmsg([request.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
    reader = conn.makefile("r")
    started, ended = reader.readline(), ""  # the program's pid, then its exit status
    if started:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda number, _: conn.sendall(f"{number}\n".encode()))
        ended = reader.readline()
    if not ended:
        sys.exit(f"forkclient: the NeMo fork server at {path} went away")
    code = int(ended)
    if code < 0:  # killed by a signal: so is this process, as its caller would see it
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
