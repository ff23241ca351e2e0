"""download_assets with the real huggingface_hub client against the fake Hub on 127.0.0.1, running
the very argv the launcher plans for the `pretrained_assets` job (repo ids, pinned revisions and file
lists from conf/assets/default.yaml)."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import REPO
from hf_fake_hub import FakeHub

from data_prep.safetensors_file import read_header
from launcher.context import Facts
from launcher.pipeline import build_plan
from launcher.registry import RootConfig
from launcher.stages import assets

TOKEN = "hf_assets_secret_456"
OLD_COMMIT = "0123456789abcdef0123456789abcdef01234567"
BIG = 3 << 20  # the stand-in weights: big enough to stall part way, small enough to be quick
# Files the real repos hold besides the ones the config asks for: none of them may be fetched.
EXTRA = {
    "text_encoder": [
        "pytorch_model.bin",
        "tf_model.h5",
        "flax_model.msgpack",
        "tokenizer.json",
        "preprocessor_config.json",
        "README.md",
        ".gitattributes",
    ],
    "vae": ["diffusion_pytorch_model.bin", "README.md", ".gitattributes"],
    "open_clip_bigg": ["open_clip_model.safetensors", "config.json", "README.md"],
    "sdxl_vae": ["vae_1_0/diffusion_pytorch_model.safetensors", "unet/config.json", "README.md"],
}


def _fill(folder: Path, names: list[str], seed: str) -> None:
    """Small files named as in the real repo; weights are random bytes (nothing here parses them)."""
    for name in names:
        size = BIG if name.endswith(".safetensors") else 200
        data = os.urandom(size) if size == BIG else f"{seed} {name}\n".encode().ljust(size, b"#")
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


class Setup:
    def __init__(self, cfg: RootConfig, hub: FakeHub, repos: dict[str, Path]) -> None:
        self.cfg, self.hub, self.repos = cfg, hub, repos
        self.by_name = assets.by_name(cfg)

    def argv(self) -> list[str]:
        plan = build_plan(self.cfg, Facts(python=sys.executable, code_dir=str(REPO)))
        return list(plan.job(assets.JOB_NAME).argv)

    def run(self, *, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_ENDPOINT": self.hub.url, "HF_TOKEN": token or ""}
        return subprocess.run(self.argv(), env=env, capture_output=True, text=True, timeout=120, check=False)

    def repo_requests(self) -> list[tuple[str, str, str | None]]:
        ids = [asset.repo_id for asset in self.by_name.values()]
        return [r for r in self.hub.requests if any(f"/{repo}/" in r[1] for repo in ids)]

    def local(self, name: str) -> Path:
        return Path(self.by_name[name].local_dir)


@pytest.fixture
def setup(tmp_path: Path, make_config: Callable[..., RootConfig]) -> Iterator[Setup]:
    cfg = make_config("stages=[assets]", f"container.python={sys.executable}")
    yield from _serve(tmp_path, cfg)


def _serve(tmp_path: Path, cfg: RootConfig) -> Iterator[Setup]:
    """The fake Hub serving the assets `cfg` stages, at their pinned commits and at OLD_COMMIT."""
    repos: dict[str, dict[str, Path]] = {}
    folders = {}
    for name, asset in assets.by_name(cfg).items():
        folder = tmp_path / "hub" / name
        _fill(folder, asset.files + EXTRA[name], seed="pinned")
        # An older commit with other bytes: the fixture for a revision bump.
        _fill(tmp_path / "hub-old" / name, asset.files + EXTRA[name], seed="old")
        repos[asset.repo_id] = {OLD_COMMIT: tmp_path / "hub-old" / name, asset.revision: folder}
        folders[name] = folder
    with FakeHub({}, models=repos) as hub:
        yield Setup(cfg, hub, folders)


def _assert_staged(setup: Setup) -> None:
    for name, asset in setup.by_name.items():
        local = setup.local(name)
        staged = sorted(p.name for p in local.iterdir() if not p.name.startswith("."))
        assert staged == sorted(asset.files), name
        for file in asset.files:
            assert (local / file).read_bytes() == (setup.repos[name] / file).read_bytes(), file
        record = json.loads((local / ".complete.json").read_text())
        assert (record["repo_id"], record["revision"]) == (asset.repo_id, asset.revision)
        assert {f: info["size"] for f, info in record["files"].items()} == {
            f: (local / f).stat().st_size for f in asset.files
        }


def test_downloads_the_pinned_files_and_a_rerun_makes_no_request(setup: Setup) -> None:
    first = setup.run()
    assert first.returncode == 0, first.stderr
    _assert_staged(setup)
    requests = setup.repo_requests()
    revisions = {asset.revision for asset in setup.by_name.values()}
    resolved = {path.split("/resolve/")[1].split("/")[0] for _, path, _ in requests if "/resolve/" in path}
    assert resolved == revisions
    assert {auth for _, _, auth in requests} == {f"Bearer {TOKEN}"}
    assert TOKEN not in first.stdout + first.stderr and "HF_TOKEN is set" in first.stdout
    before = {p: p.stat().st_mtime_ns for p in setup.local("text_encoder").parent.rglob("*")}
    setup.hub.requests.clear()
    second = setup.run()
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("nothing to do") == 2
    assert setup.repo_requests() == []
    assert {p: p.stat().st_mtime_ns for p in setup.local("text_encoder").parent.rglob("*")} == before


@pytest.mark.parametrize(
    ("name", "file", "record_kept"),
    [
        ("text_encoder", "model.safetensors", False),  # LFS file: checked by size, then sha256
        ("text_encoder", "model.safetensors", True),  # truncated after completion: the record's size
        ("vae", "config.json", False),  # plain git file, same size, other bytes: git blob sha1
    ],
)
def test_a_damaged_file_is_downloaded_again(setup: Setup, name: str, file: str, record_kept: bool) -> None:
    assert setup.run().returncode == 0
    path = setup.local(name) / file
    data, before = path.read_bytes(), path.stat()
    if file.endswith(".safetensors"):
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data[:-1] + b"!")
    # Damage that keeps the file's time (a disk error, a copy with -p): huggingface_hub then trusts its own
    # metadata and hands the file back, and only the job's check can see it. Left newer, the file is
    # re-hashed by hf itself when more than a second has passed (slow, loaded machines), not by the check.
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    if not record_kept:
        (setup.local(name) / ".complete.json").unlink()
    again = setup.run()
    assert again.returncode == 0, again.stderr
    assert f"{file} has " in again.stdout and "downloading it again" in again.stdout
    _assert_staged(setup)


def _get_seen(hub: FakeHub, repo_id: str, file: str) -> bool:
    return any(
        method == "GET" and path.startswith(f"/{repo_id}/") and path.endswith(f"/{file}")
        for method, path, _ in hub.requests
    )


def test_a_download_stopped_by_slurm_is_completed_by_the_rerun(setup: Setup) -> None:
    setup.hub.stall_after = BIG // 3
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_ENDPOINT": setup.hub.url, "HF_TOKEN": TOKEN}
    job = subprocess.Popen(setup.argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    clip = setup.cfg.assets.text_encoder.repo_id
    while not _get_seen(setup.hub, clip, "model.safetensors") and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # part of the file is in flight
    job.terminate()  # SIGTERM, as Slurm sends at a time limit or scancel
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 143, out
    local = setup.local("text_encoder")
    assert (local / "config.json").is_file() and not (local / ".complete.json").exists()
    setup.hub.stall_after = None
    setup.hub.requests.clear()
    done = setup.run()
    assert done.returncode == 0, done.stderr
    _assert_staged(setup)
    assert _get_seen(setup.hub, clip, "model.safetensors") and not _get_seen(setup.hub, clip, "config.json")
    assert list(local.rglob("*.incomplete")) == []  # no partial copy left behind on the shared disk


def test_a_record_of_another_revision_downloads_the_pinned_one(setup: Setup) -> None:
    pinned = setup.cfg.assets.vae.revision
    setup.cfg.assets.vae.revision = OLD_COMMIT  # as staged by an earlier config
    assert setup.run().returncode == 0
    assert (setup.local("vae") / "config.json").read_bytes().startswith(b"old ")
    setup.cfg.assets.vae.revision = pinned
    setup.hub.requests.clear()
    bumped = setup.run()
    assert bumped.returncode == 0, bumped.stderr
    _assert_staged(setup)
    fetched = {path.rsplit("/", 1)[1] for method, path, _ in setup.repo_requests() if method == "GET"}
    assert {"config.json", "diffusion_pytorch_model.safetensors"} <= fetched
    assert "model.safetensors" not in fetched  # the text encoder's record still matched


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"revision": "f" * 40}, "RevisionNotFound"),
        ({"repo_id": "stabilityai/sd-vae-nope"}, "RepositoryNotFound"),
        (
            {"files": ["config.json", "vae.safetensors"]},
            "no vae.safetensors in the repo at this revision; its files: .gitattributes, README.md, config.json",
        ),
    ],
)
def test_a_wrong_repo_revision_or_file_fails_before_any_transfer(
    setup: Setup, change: dict[str, object], message: str
) -> None:
    for key, value in change.items():
        setattr(setup.cfg.assets.vae, key, value)
    setup.cfg.assets.text_encoder.files = ["config.json"]  # keep the test quick
    done = setup.run()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "vae (" in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (setup.local("vae") / "config.json").exists()
    assert [p for _, p, _ in setup.repo_requests() if "sd-vae" in p and "/resolve/" in p] == []


def test_help_explains_the_asset_arguments() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "data_prep.download_assets", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert "NAME REPO_ID REVISION LOCAL_DIR FILE" in done.stdout and ".complete.json" in done.stdout


SDXL = "training=sdxl/sdxl_base_train_res_256_stage_1"
WIDTH = 4  # the mid attention's channels in the stand-in VAE


def _write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    """A float32 safetensors file (stdlib only: the launcher's venv has no safetensors) of distinct values."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, shape in tensors.items():
        count = math.prod(shape)
        values = struct.pack(f"<{count}f", *(len(data) + i for i in range(count)))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(values)]}
        data += values
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _current_diffusers_vae(path: Path) -> None:
    """The SDXL VAE's middle attention as current diffusers saves it (Linear weights), and a conv."""
    tensors = {"encoder.conv_in.weight": [WIDTH, 3, 3, 3]}
    for half in ("encoder", "decoder"):
        attention = f"{half}.mid_block.attentions.0"
        tensors |= {f"{attention}.group_norm.weight": [WIDTH], f"{attention}.group_norm.bias": [WIDTH]}
        for name in ("to_q", "to_k", "to_v", "to_out.0"):
            tensors |= {f"{attention}.{name}.weight": [WIDTH, WIDTH], f"{attention}.{name}.bias": [WIDTH]}
    _write_safetensors(path, tensors)


@pytest.fixture
def sdxl_setup(tmp_path: Path, make_config: Callable[..., RootConfig]) -> Iterator[Setup]:
    cfg = make_config("stages=[assets]", SDXL, f"container.python={sys.executable}")
    for served in _serve(tmp_path, cfg):
        _current_diffusers_vae(served.repos["sdxl_vae"] / cfg.assets.sdxl_vae.nemo_vae.source)
        yield served


def test_sdxl_stages_its_encoders_and_a_vae_named_as_nemo_reads_it_once(sdxl_setup: Setup) -> None:
    assert list(sdxl_setup.by_name) == ["text_encoder", "open_clip_bigg", "sdxl_vae"]  # not the SD VAE
    first = sdxl_setup.run()
    assert first.returncode == 0, first.stderr
    vae = sdxl_setup.cfg.assets.sdxl_vae
    local, source = sdxl_setup.local("sdxl_vae"), vae.nemo_vae.source
    assert (local / source).read_bytes() == (sdxl_setup.repos["sdxl_vae"] / source).read_bytes()
    converted = local / vae.nemo_vae.file
    header, start = read_header(converted)
    original, original_start = read_header(local / source)
    attention = "decoder.mid_block.attentions.0"
    assert header[f"{attention}.proj_attn.weight"]["shape"] == [WIDTH, WIDTH, 1, 1]
    assert header[f"{attention}.query.bias"] == original[f"{attention}.to_q.bias"]
    assert header[f"{attention}.group_norm.weight"] == original[f"{attention}.group_norm.weight"]
    assert not [key for key in header if ".to_" in key] and len(header) == len(original)
    assert converted.read_bytes()[start:] == (local / source).read_bytes()[original_start:]  # same tensors
    assert "sdxl_vae: diffusion_pytorch_model.safetensors written from vae/" in first.stdout
    assert "16 key(s) renamed" in first.stdout
    record = json.loads((local / ".complete.json").read_text())
    size = converted.stat().st_size
    assert record["written"] == [{"kind": "nemo-vae", "args": [source, vae.nemo_vae.file], "size": size}]

    sdxl_setup.hub.requests.clear()
    again = sdxl_setup.run()  # the record matches: no request, nothing converted again
    assert again.returncode == 0 and again.stdout.count("nothing to do") == 3
    assert sdxl_setup.repo_requests() == [] and "renamed" not in again.stdout

    converted.unlink()  # the record no longer holds: converted again from the file in place
    third = sdxl_setup.run()
    assert third.returncode == 0, third.stderr
    assert converted.stat().st_size == size and "16 key(s) renamed" in third.stdout
    assert not _get_seen(sdxl_setup.hub, vae.repo_id, source)  # not downloaded again


def test_a_nemo_vae_must_name_a_downloaded_file(tmp_path: Path) -> None:
    source, file = "vae/diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors"
    args = ["--asset", "sdxl_vae", "org/repo", "a" * 40, str(tmp_path), "vae/config.json"]
    done = subprocess.run(
        [sys.executable, "-m", "data_prep.download_assets", *args, "--nemo-vae", "sdxl_vae", source, file],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "SOURCE must be the asset's files and FILE none of them" in done.stderr
