"""Serve a folder on 127.0.0.1 for the length of one command (the offline demo and the tests).

    python -m data_prep.serve --root DATA/demo_source/images [--port 0] -- python -m data_prep.download_images ...

The server's base URL (e.g. http://127.0.0.1:43117) is exported to the command as DEMO_BASE_URL;
the demo's parquet rows hold URLs of the form `${DEMO_BASE_URL}/<name>` that download_images
expands. With the default port 0 every array task starts its own server on a free port, so tasks
running at once on one machine never collide. Exits with the command's exit status.

Besides plain files it answers a few paths that imitate the web's failures:
  <name>.404            -> 404 Not Found, whether or not the file exists
  /as-html/<name>       -> 200 with Content-Type text/html and an HTML body, whatever the name says

Importable for tests:
    with serve_folder(Path("images")) as base_url:
        ...
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from data_prep.faults import step_main

ENV_NAME = "DEMO_BASE_URL"
HTML_PREFIX = "/as-html/"
HTML_BODY = b"<!doctype html><html><body>Not an image: a login page, say.</body></html>\n"


class _Handler(SimpleHTTPRequestHandler):
    """Static files plus the failure paths above; silent on success, as a job log is no access log."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_head(self) -> Any:
        path = self.path.split("?", 1)[0]
        if path.endswith(".404"):
            self.send_error(404, "Not Found (simulated)")
            return None
        if path.startswith(HTML_PREFIX):
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(HTML_BODY)))
            self.end_headers()
            return io.BytesIO(HTML_BODY)
        return super().send_head()


@contextmanager
def serve_folder(root: Path, port: int = 0) -> Iterator[str]:
    """Serve `root` on 127.0.0.1 in a background thread; yields the base URL (no trailing /)."""
    if not root.is_dir():
        raise FileNotFoundError(f"--root {root}: not a folder")
    server = ThreadingHTTPServer(("127.0.0.1", port), partial(_Handler, directory=str(root)))
    server.daemon_threads = True  # a stuck client never blocks shutdown
    thread = threading.Thread(target=server.serve_forever, name="serve-folder", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def exit_status(returncode: int) -> int:
    """A child killed by signal N reports -N; a shell would report 128+N."""
    return 128 - returncode if returncode < 0 else returncode


@step_main("serve")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", required=True, type=Path, help="folder to serve")
    parser.add_argument("--port", type=int, default=0, help="0 (default) = any free port")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...: run while serving")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- python -m data_prep.download_images ...")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0..65535, got {args.port}")
    if not args.root.is_dir():
        parser.error(f"--root {args.root}: not a folder")
    with serve_folder(args.root, args.port) as base_url:
        print(f"[serve] {args.root} at {base_url} (exported as {ENV_NAME})", flush=True)
        try:
            child = subprocess.run(command, env={**os.environ, ENV_NAME: base_url}, check=False)
        except FileNotFoundError:
            print(f"serve: error: command not found: {command[0]}", file=sys.stderr)
            return 127
    return exit_status(child.returncode)


if __name__ == "__main__":
    sys.exit(main())
