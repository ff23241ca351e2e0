"""Training's preflight (its StageSpec.preflight): the submitting host's files it will read, read-only.

Without a container, NeMo's sd_train.py (the benchmark sweep runs it too); then, when
this launch does not prepare the data itself, the prepared data training reads: its wdinfo, whether its
tars hold what the latents switch says, and whether there are enough of them for every rank.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from data_prep.latent_format import MEMBER_EXT
from launcher import latents, nemo_config
from launcher.config import Runtime
from launcher.families import family_of
from launcher.layout import DataLayout
from launcher.stage import Findings


def _format_mismatch(cfg: Any, first_tar: Path) -> str | None:
    """A latent config on image tars or the reverse, told by the first tar's first member."""
    import tarfile  # here and below: imported only when a data folder is checked (not in most dry runs)

    try:
        with tarfile.open(first_tar, "r:") as tar:
            member = tar.next()
    except (OSError, tarfile.TarError):
        return None  # data_check names unreadable tars
    if member is None:
        return None
    latent_tar = member.name.endswith(f".{MEMBER_EXT}")
    latent_config = latents.enabled(cfg)  # the switch sets the keys (latent keys without it are refused)
    if latent_tar == latent_config:
        return None
    what = "cached latents (.pickle)" if latent_tar else f"images ({member.name.rpartition('.')[2]})"
    return (
        f"data_preparation.precache.enable={cfg.data_preparation.precache.enable} (training.model."
        f"first_stage_key/cond_stage_key read {'latents' if latent_config else 'images'}), but {first_tar} "
        f"holds {what}: point data_dir at the data that matches, or set the switch to match the data"
    )


def _no_wdinfo(cfg: Any, wdinfo: Path) -> str:
    """Training's wdinfo is missing; with the latents switch on and only the image tars there, say so."""
    images = Path(DataLayout(PurePosixPath(cfg.data_dir)).wdinfo)
    if latents.enabled(cfg) and images.exists():
        return (
            f"{latents.SWITCH}=true (cached latents): training reads {wdinfo}, but {cfg.data_dir} holds "
            f"only image tars ({images}). Encode them first with stages=[data_preparation] (its finished "
            f"image steps return quickly), or set {latents.SWITCH}=false to train from the images"
        )
    return (
        f"data_dir: no {wdinfo}; run data preparation first (stages=[data_preparation,"
        "training]) or point data_dir at prepared data"
    )


def nemo_files(cfg: Any) -> list[str]:
    """Without a container, sd_train.py: what training and the sweep run (the image every plan with a
    container runs is checked for all of them: launcher.preflight)."""
    problems = []
    script = cfg.training.run.script
    if cfg.container.runtime is Runtime.none and not Path(script).is_file():
        # Its default is the image's copy; NeMo's wheel has none (.venv-nemo cannot stand in for it).
        problems.append(
            f"training.run.script: {script} does not exist on this host, and without a container "
            "(container.runtime none) the jobs run sd_train.py from the nodes' file system; give its path "
            "there (a NeMo checkout every node sees), or run in the image: container=pyxis container.image=<.sqsh>"
        )
    return problems


def check(cfg: Any, planned: frozenset[str]) -> Findings:
    """What training will run and, unless this launch prepares it (or it is synthetic), the data it reads."""
    found = Findings(problems=nemo_files(cfg))
    if "data_preparation" in planned or cfg.training.model.get("data", {}).get("synthetic_data"):
        return found
    if not family_of(cfg.training.model).reads_prepared_data:  # a source its plugin's stage checks
        return found
    wdinfo = Path(latents.training_wdinfo(cfg))
    if not wdinfo.exists():
        found.problems.append(_no_wdinfo(cfg, wdinfo))
        return found
    from data_prep.wdinfo import WdinfoError, read_wdinfo, shard_plan

    try:
        names = read_wdinfo(wdinfo).tar_files
    except WdinfoError as error:
        found.problems.append(f"data_dir: {error}")
        return found
    tars, world_size = len(names), nemo_config.world_size(cfg)
    mismatch = _format_mismatch(cfg, wdinfo.parent / names[0])
    if mismatch:
        found.problems.append(mismatch)
    workers = int(cfg.training.model.get("data", {}).get("num_workers", 1))
    if tars < world_size:
        found.problems.append(
            f"data_dir: {wdinfo} lists {tars} tars but training has {world_size} ranks: NeMo's "
            "sampler gives a rank no data; use fewer nodes or a smaller tar_chunk_size"
        )
    else:
        found.notes.append(shard_plan(tars, world_size, workers).describe())
    return found
