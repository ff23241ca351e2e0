"""An offline stand-in for the few Hugging Face Hub HTTP routes that `HfFileSystem` calls.

The real huggingface_hub client code runs unchanged against it: point `HF_ENDPOINT` (or the
`endpoint` argument) at `FakeHub.url`. Datasets are local folders; every file is served with
byte ranges, as the Hub's `resolve` route does, so pyarrow reads parquet footers lazily.

Routes answered (dataset repos only; any revision name, except for a repo given a pinned commit in
`revisions`, which answers only that commit and `main`, and 404 RevisionNotFound otherwise):
  GET  /api/datasets/<ns>/<name>[/revision/<rev>]          repo info
  GET  /api/datasets/<ns>/<name>/tree/<rev>[/<path>]       listing (?recursive=true)
  POST /api/datasets/<ns>/<name>/paths-info/<rev>          info of given paths
  GET  /datasets/<ns>/<name>/resolve/<rev>/<path>          file bytes (Range honoured)

Example:
    with FakeHub({"laion/laion-art": folder}) as hub:
        os.environ["HF_ENDPOINT"] = hub.url
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

_REPO = r"(?P<repo>[^/]+/[^/]+)"
_API = re.compile(rf"^/api/datasets/{_REPO}(?:/revision/[^/]+)?$")
_TREE = re.compile(rf"^/api/datasets/{_REPO}/tree/[^/]+(?:/(?P<path>.*))?$")
_PATHS_INFO = re.compile(rf"^/api/datasets/{_REPO}/paths-info/[^/]+$")
_RESOLVE = re.compile(rf"^/datasets/{_REPO}/resolve/[^/]+/(?P<path>.+)$")
_REVISION = re.compile(rf"^(?:/api)?/datasets/{_REPO}/(?:revision|tree|paths-info|resolve)/(?P<rev>[^/]+)")


def _entry(root: Path, path: Path) -> dict[str, Any]:
    rel = path.relative_to(root).as_posix()
    oid = hashlib.sha1(rel.encode()).hexdigest()  # stable id; the client only stores it
    if path.is_dir():
        return {"type": "directory", "path": rel, "oid": oid}
    return {"type": "file", "path": rel, "size": path.stat().st_size, "oid": oid}


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet; requests are recorded in hub.requests instead

    def _send_json(self, body: Any, status: int = 200, error_code: str | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if error_code:
            self.send_header("X-Error-Code", error_code)
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> str:
        self.hub.requests.append((self.command, self.path, self.headers.get("Authorization")))
        return unquote(urlsplit(self.path).path)

    def _unknown_revision(self, path: str) -> bool:
        """For a pinned repo, answer an unknown revision as the Hub does; True when answered."""
        match = _REVISION.match(path)
        pinned = self.hub.revisions.get(match["repo"]) if match else None
        if match is None or pinned is None or match["rev"] in (pinned, "main"):
            return False
        self._send_json({"error": f"Invalid rev id: {match['rev']}"}, 404, "RevisionNotFound")
        return True

    def do_GET(self) -> None:
        path = self._record()
        if self._unknown_revision(path):
            return
        for pattern, route in ((_TREE, self._tree), (_RESOLVE, self._resolve), (_API, self._info)):
            match = pattern.match(path)
            if match:
                root = self.hub.datasets.get(match["repo"])
                if root is None:
                    self._send_json({"error": "Repository not found"}, 404, "RepoNotFound")
                else:
                    route(root, match)
                return
        self._send_json({"error": f"no route {path}"}, 404)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        path = self._record()
        if self._unknown_revision(path):
            return
        match = _PATHS_INFO.match(path)
        root = self.hub.datasets.get(match["repo"]) if match else None
        if root is None:
            self._send_json({"error": "Repository not found"}, 404, "RepoNotFound")
            return
        form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
        found = [root / p for p in form.get("paths", []) if (root / p).exists()]
        self._send_json([_entry(root, p) for p in found])

    def _info(self, root: Path, match: re.Match[str]) -> None:
        sha = self.hub.revisions.get(match["repo"], "0" * 40)
        self._send_json({"id": match["repo"], "sha": sha, "private": False})

    def _tree(self, root: Path, match: re.Match[str]) -> None:
        base = root / (match["path"] or "")
        if not base.is_dir():
            self._send_json({"error": "Entry not found"}, 404, "EntryNotFound")
            return
        query = parse_qs(urlsplit(self.path).query)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        children = base.rglob("*") if recursive else base.iterdir()
        self._send_json([_entry(root, p) for p in sorted(children)])

    def _resolve(self, root: Path, match: re.Match[str]) -> None:
        file = root / match["path"]
        if not file.is_file():
            self._send_json({"error": "Entry not found"}, 404, "EntryNotFound")
            return
        data = file.read_bytes()
        start, end, status = 0, len(data), 200
        ranged = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if ranged:
            start = int(ranged[1])
            end = min(int(ranged[2]) + 1, len(data)) if ranged[2] else len(data)
            status = 206 if start < len(data) else 416
        body = data[start:end] if status != 416 else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)


class FakeHub:
    """A threaded HTTP server on 127.0.0.1 serving `datasets` ({repo_id: folder}); `revisions`
    ({repo_id: commit sha}) pins a repo to one commit."""

    def __init__(self, datasets: dict[str, Path], revisions: dict[str, str] | None = None) -> None:
        self.datasets = datasets
        self.revisions = revisions or {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
