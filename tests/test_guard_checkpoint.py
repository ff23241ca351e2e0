"""Checkpoints checked as checkpoints before submission, on the login node, without torch and without loading
a tensor: training.init_from's .ckpt (named, or the one the init job would take from a run folder) must be a
torch zip whose pickle reads and whose state_dict holds model.model.diffusion_model.* tensors of this preset's
shapes; anything else is refused in one line naming training.init_from.

The files are written by torch itself (NeMo's interpreter, tests/torch_checkpoints.py); a real NeMo
checkpoint passes the same check in tests/test_nemo_init_from.py.
"""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch_checkpoints
import yaml
from conftest import FIXED_FACTS, REPO
from fixtures.launches import UNET_860M as UNET_CONFIG
from torch_checkpoints import UNET_860M, UNET_PREFIX, VAE, unet_860m

from launcher import checkpoint_index
from launcher.cli import main
from launcher.errors import ConfigError
from launcher.validate import check_facts

GPU = ["cluster=slurm", "cluster.gpus_per_node=8", "data_check.enable=false", "stages=[training]"]
CKPT = "stable-diffusion--reduced_train_loss=0.99-step=8-consumed_samples=8.0-last.ckpt"
WIDE = {  # the same UNet at model_channels 384
    "time_embed.0.weight": (1536, 384),
    "input_blocks.0.0.weight": (384, 4, 3, 3),
    "out.1.weight": (4, 384, 3, 3),
}
MODEL = {"unet_config": UNET_CONFIG}  # a run of the 860M preset, as its hparams.yaml holds it


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, nemo_python: str) -> dict[str, Path]:
    """Torch checkpoints, one interpreter start for all, and two files torch would not read."""
    folder = tmp_path_factory.mktemp("checkpoints")
    written = {
        "unet_860m": unet_860m(),
        "compiled": unet_860m(compiled=True),
        "wide": unet_860m(**WIDE),
        "sd2_context": unet_860m(
            **{
                name: (dims[0], 1024)
                for name, dims in UNET_860M.items()
                if name.endswith("attn2.to_k.weight")
            }
        ),
        "fewer_blocks": {
            name: shape
            for name, shape in unet_860m().items()
            if not name.startswith(UNET_PREFIX + "input_blocks.11.")
        },
        "vae_only": dict(VAE),
    }
    written["legacy"] = written["unet_860m"]  # torch.save(..., _use_new_zipfile_serialization=False)
    paths = {name: folder / f"{name}.ckpt" for name in written}
    legacy = frozenset({paths["legacy"]})
    torch_checkpoints.write(nemo_python, {paths[name]: tensors for name, tensors in written.items()}, legacy)
    good = paths["unet_860m"].read_bytes()
    paths["truncated"] = folder / "truncated.ckpt"
    paths["truncated"].write_bytes(good[: len(good) // 2])  # a copy cut short: no zip index at the end
    paths["five_bytes"] = folder / "five_bytes.ckpt"
    paths["five_bytes"].write_bytes(b"hello")
    paths["no_state_dict"] = folder / "no_state_dict.ckpt"
    with zipfile.ZipFile(paths["no_state_dict"], "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"epoch": 3}, protocol=2))
    return paths


def test_the_index_gives_every_tensor_s_shape_from_torch_s_own_file(files: dict[str, Path]) -> None:
    assert checkpoint_index.tensor_shapes(files["unet_860m"]) == unet_860m()


def test_no_storage_is_read(files: dict[str, Path], tmp_path: Path) -> None:
    """The same file with every tensor's bytes removed from the archive reads the same."""
    bare = tmp_path / "bare.ckpt"
    with zipfile.ZipFile(files["unet_860m"]) as full, zipfile.ZipFile(bare, "w") as out:
        kept = [info for info in full.infolist() if "/data/" not in info.filename]
        assert len(kept) < len(full.infolist())
        for info in kept:
            out.writestr(info, full.read(info))
    assert checkpoint_index.tensor_shapes(bare) == unet_860m()


class _Runs:
    """A class whose unpickling would run a command, if the reader ran what a pickle names."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (subprocess.call, (["touch", str(self.marker)],))


def test_a_pickle_that_names_code_runs_none_of_it(tmp_path: Path) -> None:
    marker, path = tmp_path / "ran", tmp_path / "evil.ckpt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"state_dict": {"x": _Runs(marker)}}, protocol=2))
    assert checkpoint_index.tensor_shapes(path) == {}
    assert not marker.exists()


def _earlier_run(folder: Path, weights: Path) -> Path:
    """A run folder as NeMo leaves it: hparams.yaml (the 860M UNet) and the checkpoint under test."""
    results = folder / "training/results"
    (results / "checkpoints").mkdir(parents=True)
    (results / "hparams.yaml").write_text(yaml.safe_dump({"cfg": MODEL}))
    shutil.copyfile(weights, results / "checkpoints" / CKPT)
    return folder


@pytest.mark.parametrize("name", ["unet_860m", "compiled", "legacy"])
@pytest.mark.parametrize("given", ["file", "run folder"])
def test_a_checkpoint_of_this_unet_passes(
    make_config: Callable, tmp_path: Path, files: dict[str, Path], given: str, name: str
) -> None:
    """Compiled: the presets train with model.inductor (torch.compile), whose UNet is saved under _orig_mod."""
    run = _earlier_run(tmp_path / "earlier", files[name])
    start = run / "training/results/checkpoints" / CKPT if given == "file" else run
    check_facts(make_config(*GPU, f"training.init_from='{start}'"), FIXED_FACTS)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (
            "truncated",
            r"is not a torch checkpoint \(a zip archive, or torch's legacy pickle stream\): File is not",
        ),
        ("five_bytes", r"is not a torch checkpoint \(a zip archive, or torch's legacy pickle stream\)"),
        ("no_state_dict", r"is a torch file without a state_dict mapping"),
        ("vae_only", r"holds no model\.model\.diffusion_model\.\* tensor \(1 tensors in its state_dict\)"),
        ("wide", r"time_embed\.0\.weight \[1536, 384\], \[1280, 320\] here; input_blocks\.0\.0\.weight"),
        ("sd2_context", r"cross-attention keys \[1024\], context_dim 768 here"),
        ("fewer_blocks", r"11 input_blocks, 12 here"),
    ],
)
@pytest.mark.parametrize("given", ["file", "run folder"])
def test_anything_else_is_refused_naming_init_from(
    make_config: Callable, tmp_path: Path, files: dict[str, Path], name: str, reason: str, given: str
) -> None:
    run = _earlier_run(tmp_path / "earlier", files[name])
    start = run / "training/results/checkpoints" / CKPT if given == "file" else run
    cfg = make_config(*GPU, f"training.init_from='{start}'")
    with pytest.raises(ConfigError, match=rf"^training\.init_from: {run}/.*{CKPT}\W.*{reason}") as refused:
        check_facts(cfg, FIXED_FACTS)
    assert "\n" not in str(refused.value) and "allowed: a" in str(refused.value)


def test_a_truncated_checkpoint_stops_the_dry_run_in_one_line(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    run = _earlier_run(tmp_path / "earlier", files["truncated"])
    # The nodes' NeMo named (no container here), so that the checkpoint is what is refused.
    argv = [f"cluster.shared_dir={tmp_path}", *GPU, "dry_run=true", f"training.init_from={run}"]
    argv.append("training.run.python=python3")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: training.init_from: ") and err.count("\n") == 1
    assert not (tmp_path / "results").exists()


def test_the_860m_tensors_used_here_are_those_of_one_unet() -> None:
    """The test files' tensors agree with the preset's config: the check passes them (and so the refusals
    above come from the one change each file makes)."""
    from launcher.unet_shape import tensor_problems, unet_shape

    assert tensor_problems(UNET_860M, unet_shape(MODEL)) == []


def test_another_transformer_depth_is_refused_naming_each_block() -> None:
    """SDXL's presets set transformer_depth per level ([1, 2, 10]): a level deeper than the checkpoint's."""
    from launcher.unet_shape import tensor_problems, unet_shape

    deeper = {"unet_config": {**MODEL["unet_config"], "transformer_depth": [1, 1, 2, 1]}}
    blocks = [
        "input_blocks.7.1",
        "input_blocks.8.1",
        "output_blocks.3.1",
        "output_blocks.4.1",
        "output_blocks.5.1",
    ]
    assert tensor_problems(UNET_860M, unet_shape(deeper)) == [
        f"1 transformer blocks in {block}, 2 here" for block in blocks
    ]


def test_the_reader_needs_only_the_standard_library() -> None:
    code = (
        "import sys, launcher.checkpoint_index; heavy = {'torch', 'numpy', 'omegaconf'} "
        "& {m.split('.')[0] for m in sys.modules}; assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
