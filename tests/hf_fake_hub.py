"""An offline stand-in for the few Hugging Face Hub HTTP routes that `HfFileSystem` calls.

The real huggingface_hub client code runs unchanged against it: point `HF_ENDPOINT` (or the
`endpoint` argument) at `FakeHub.url`. Datasets are local folders; every file is served with
byte ranges, as the Hub's `resolve` route does, so pyarrow reads parquet footers lazily.

Routes answered for dataset repos (any revision name, except for a repo given a pinned commit in
`revisions`, which answers only that commit and `main`, and 404 RevisionNotFound otherwise):
  GET  /api/datasets/<ns>/<name>[/revision/<rev>]          repo info
  GET  /api/datasets/<ns>/<name>/tree/<rev>[/<path>]       listing (?recursive=true)
  POST /api/datasets/<ns>/<name>/paths-info/<rev>          info of given paths
  GET  /datasets/<ns>/<name>/resolve/<rev>/<path>          file bytes (Range honoured)

Routes answered for model repos (`hf_hub_download`, `model_info`), one folder per commit sha;
`main` is the last commit given, any other revision is RevisionNotFound:
  GET  /api/models/<ns>/<name>[/revision/<rev>]            repo info, siblings with sizes/LFS sha256
  GET|HEAD /<ns>/<name>/resolve/<rev>/<path>               file bytes with the headers the client
                                                           checks: X-Repo-Commit, ETag, X-Linked-Etag
                                                           and X-Linked-Size (LFS files), Range
Model files named like the Hub's default LFS patterns (*.safetensors, *.bin, ...) are LFS files
(etag = sha256), others plain git files (etag = git blob sha1), as on the Hub.

Example:
    with FakeHub({"laion/laion-art": folder}, models={"openai/clip": {sha: folder}}) as hub:
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
_MODEL_API = re.compile(rf"^/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?$")
_MODEL_RESOLVE = re.compile(rf"^/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
# A subset of the Hub's default .gitattributes: these files are stored with LFS.
_LFS_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".ckpt", ".pt", ".pth", ".onnx")


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


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
        for pattern, model_route in ((_MODEL_API, self._model_info), (_MODEL_RESOLVE, self._model_resolve)):
            match = pattern.match(path)
            if match:
                self._model_commit(match, model_route)
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
        self._send_file(file.read_bytes(), {})

    def _model_commit(self, match: re.Match[str], route: Any) -> None:
        """Resolve repo and revision to (commit, folder), or answer the error the Hub gives."""
        commits = self.hub.models.get(match["repo"])
        if commits is None:
            self._send_json({"error": "Repository not found"}, 404, "RepoNotFound")
            return
        if match["repo"] in self.hub.gated and not self.headers.get("Authorization"):
            # What the Hub answers a client without a token for a gated repo (whose licence must be accepted).
            self._send_json({"error": f"Access to model {match['repo']} is restricted"}, 401, "GatedRepo")
            return
        rev = match["rev"] or "main"
        commit = list(commits)[-1] if rev == "main" else rev
        if commit not in commits:
            self._send_json({"error": f"Invalid rev id: {rev}"}, 404, "RevisionNotFound")
            return
        route(match, commit, commits[commit])

    def _model_info(self, match: re.Match[str], commit: str, root: Path) -> None:
        siblings = []
        for file in sorted(p for p in root.rglob("*") if p.is_file()):
            data = file.read_bytes()
            entry: dict[str, Any] = {"rfilename": file.relative_to(root).as_posix()}
            if "blobs=true" in urlsplit(self.path).query.lower():
                entry |= {"size": len(data), "blobId": _git_blob_sha1(data)}
                if file.name.endswith(_LFS_SUFFIXES):
                    lfs = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
                    entry["lfs"] = lfs
            siblings.append(entry)
        self._send_json(
            {
                "id": match["repo"],
                "modelId": match["repo"],
                "sha": commit,
                "private": False,
                "siblings": siblings,
            }
        )

    def _model_resolve(self, match: re.Match[str], commit: str, root: Path) -> None:
        file = root / match["path"]
        if not file.is_file():
            self._send_json({"error": "Entry not found"}, 404, "EntryNotFound")
            return
        data = file.read_bytes()
        headers = {"X-Repo-Commit": commit, "ETag": f'"{_git_blob_sha1(data)}"'}
        if file.name.endswith(_LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            headers |= {"ETag": f'"{sha256}"', "X-Linked-Etag": f'"{sha256}"'}
            headers["X-Linked-Size"] = str(len(data))
        self._send_file(data, headers)

    def _send_file(self, data: bytes, headers: dict[str, str]) -> None:
        """The bytes with the Hub's byte-range answers; a GET may stall part way (hub.stall_after)."""
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
        for name, value in headers.items():
            self.send_header(name, value)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if self.command != "GET":
            return
        stall = self.hub.stall_after
        if stall is not None and len(body) > stall:
            # Part of the file, then nothing until the test kills the client (a job hitting its limit).
            self.wfile.write(body[:stall])
            self.wfile.flush()
            self.hub.release.wait()
            return
        self.wfile.write(body)


class FakeHub:
    """A threaded HTTP server on 127.0.0.1 serving `datasets` ({repo_id: folder}), `models`
    ({repo_id: {commit sha: folder}}); `revisions` ({repo_id: commit sha}) pins a dataset repo to one commit;
    a model repo in `gated` answers only a request with a token."""

    def __init__(
        self,
        datasets: dict[str, Path],
        models: dict[str, dict[str, Path]] | None = None,
        revisions: dict[str, str] | None = None,
        gated: set[str] | None = None,
    ) -> None:
        self.datasets = datasets
        self.models = models or {}
        self.revisions = revisions or {}
        self.gated = gated or set()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        # A file GET sends this many bytes, then waits for `release` (None: no stall).
        self.stall_after: int | None = None
        self.release = threading.Event()
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
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
