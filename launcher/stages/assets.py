"""assets: one CPU job stages the pretrained CLIP text encoder and VAE that training loads.

It is planned whenever a planned stage reads them (data_check's model check, the benchmark sweep,
training), and only those wait for it: a wrong repo id, revision or token never holds up data preparation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any

from omegaconf import MISSING

from launcher import families, weights
from launcher.config import JobResources, Runtime
from launcher.context import Context, Facts
from launcher.errors import ConfigError
from launcher.rules import ABS_PATH, FOLDER, Each, Pattern, described, ruled
from launcher.spec import JobSpec
from launcher.stage import AssetNeeds, StageSpec
from launcher.stages.common import cpu_resources, make_job, require_mounted

NAME = "assets"
JOB_NAME = "pretrained_assets"
WEIGHTS = "weights"  # training.weights' name in the job's arguments and log

HUB_REPO_ID = Pattern(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", "a Hub repo id: owner/name")
COMMIT_SHA = Pattern(r"[0-9a-f]{40}", "a 40-hex commit sha (the repo's History on the Hub): pin one")
URL = Pattern(r"https?://[^\s]+", "an http(s) URL without spaces")
SHA256 = Pattern(r"[0-9a-f]{64}", "a 64-hex sha256")
REPO_FILE = Pattern(
    r"(?!-)(?!.*(?:^|/)\.\.(?:/|$))[^/\x00-\x1f][^\x00-\x1f]*",
    "a file name in the repo (a relative path, no '..', not starting with '-' or '/')",
)


@dataclass
class NemoVaeConfig:
    """A VAE file of the asset rewritten once, after its download, under the key names NeMo 2.4's
    AutoencoderKL reads (data_prep/vae_names.py: current diffusers' attention names are not mapped)."""

    source: str | None = ruled(
        REPO_FILE, None, help="The downloaded VAE file to convert (one of the asset's files); null: none."
    )
    file: str | None = ruled(
        REPO_FILE,
        None,
        help="Where the converted copy is written, relative to local_dir (none of the asset's files): "
        "training's first_stage_config.from_pretrained names it.",
    )


@dataclass
class AssetConfig:
    """One Hub model repo pinned to a commit; only `files` are fetched, into `local_dir`."""

    repo_id: str = ruled(HUB_REPO_ID, MISSING, help="The Hub model repo.")
    revision: str = ruled(
        COMMIT_SHA,
        MISSING,
        help="A 40-hex commit sha: a branch name would let the files change under a running project.",
    )
    files: list[str] = ruled(
        Each(REPO_FILE, min_items=1),
        factory=list,
        help="The repo files fetched (each checked against the Hub's size and sha256).",
    )
    local_dir: str = ruled(
        FOLDER, MISSING, help="Where the files are staged; training and the checks read them there."
    )
    nemo_vae: NemoVaeConfig = field(default_factory=NemoVaeConfig)


@dataclass
class FileAssetConfig:
    """One file from a URL, pinned by its sha256 (data_prep/download_file.py)."""

    url: str = ruled(URL, MISSING, help="Where the file is downloaded from.")
    sha256: str = ruled(SHA256, MISSING, help="The file's sha256: other bytes are refused.")
    path: str = ruled(ABS_PATH, MISSING, help="Where the file is staged.")


@dataclass
class AssetsCore:
    """Pretrained parts of the model that training loads but never trains (CLIP text encoder, VAE)."""

    enable: bool = described(
        True, help="Stage the pretrained CLIP and VAE in one CPU job before the jobs that read them."
    )
    dir: str = ruled(FOLDER, MISSING, help="The folder under which each asset's local_dir lies.")
    hf_token_file: str | None = ruled(
        ABS_PATH,
        None,
        help="A file holding the HF token, read at run time (HF_TOKEN in the job's environment also works).",
    )


def _asset_field(name: str) -> Any:
    """An asset's section: the defaults its family brings (Family.asset_defaults), else conf/assets/'s."""
    defaults = families.asset_defaults().get(name, {})
    return field(default_factory=lambda: AssetConfig(**defaults))


# One pinned Hub repo per asset that some model family stages (Family.assets: the trained family's are
# staged), then the single-file assets a planned stage may need (StageSpec.assets: evaluation's FID
# network) and the job's resources.
AssetsConfig = make_dataclass(
    "AssetsConfig",
    [
        *((name, AssetConfig, _asset_field(name)) for name in families.asset_names()),
        ("inception", FileAssetConfig, field(default_factory=FileAssetConfig)),
        ("resources", JobResources, field(default_factory=JobResources)),
    ],
    bases=(AssetsCore,),
)
AssetsConfig.__doc__ = AssetsCore.__doc__


def by_name(cfg: Any) -> dict[str, AssetConfig]:
    """Every asset the trained family stages, under the name its config key has (and the job's log uses);
    training.weights brings its own VAE, so the family's is not staged then."""
    family = families.family_of(cfg.training.model)
    skipped = {family.vae_asset} if weights.given(cfg) else set()
    return {name: getattr(cfg.assets, name) for name in family.assets if name not in skipped}


def _weights_args(cfg: Any) -> tuple[str, ...]:
    """training.weights: the repo's files downloaded (a Hub repo) or found (a folder), then what NeMo reads
    of them written beside them (launcher/weights.py)."""
    found = weights.of(cfg)
    if found is None:
        return ()
    staged = str(weights.staged_dir(cfg, found))
    if found.folder is None:
        args: tuple[str, ...] = ("--asset", WEIGHTS, str(found.repo_id), str(found.revision), staged)
    else:
        args = ("--local", WEIGHTS, str(found.folder), staged)
    pinned = found.released.sha256 if found.released else {}
    args += (
        *found.files(),
        *(word for file, sha in pinned.items() for word in ("--expect", WEIGHTS, file, sha)),
    )
    args += ("--nemo-vae", WEIGHTS, weights.VAE_FILE, weights.NEMO_VAE)
    if found.diffusers.stages_unet:
        args += ("--nemo-unet", WEIGHTS, weights.UNET_FILE, weights.UNET_CONFIG, weights.NEMO_UNET)
    for _, text, tokenizer in found.diffusers.text_encoders:
        args += ("--text-folder", WEIGHTS, text, tokenizer, f"{weights.NEMO}/{text}")
    return args


def _asset_args(name: str, asset: AssetConfig, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    files = [*asset.files, *(f for f in extra if f not in asset.files)]
    args = ("--asset", name, asset.repo_id, asset.revision, asset.local_dir, *files)
    if asset.nemo_vae.source:
        args += ("--nemo-vae", name, asset.nemo_vae.source, str(asset.nemo_vae.file))
    return args


def needs(ctx: Context) -> AssetNeeds:
    """What the planned stages declare they need staged (StageSpec.assets), merged."""
    repo_files: dict[str, list[str]] = {}
    files: list[str] = []
    for stage in ctx.stages:
        found = stage.assets(ctx.cfg)
        for name, extra in found.repo_files:
            repo_files.setdefault(name, []).extend(f for f in extra if f not in repo_files.get(name, []))
        files += [name for name in found.files if name not in files]
    return AssetNeeds(tuple((name, tuple(extra)) for name, extra in repo_files.items()), tuple(files))


def plan(ctx: Context) -> tuple[JobSpec, ...]:
    assets, wanted = ctx.cfg.assets, needs(ctx)
    extra = dict(wanted.repo_files)
    args: list[str] = []
    for name, asset in by_name(ctx.cfg).items():
        args += _asset_args(name, asset, extra.get(name, ()))
    args += _weights_args(ctx.cfg)
    for name in wanted.files:
        f = getattr(assets, name)
        args += ["--file", name, f.url, f.sha256, f.path]
    # The token reaches the job as HF_TOKEN, read from the file at run time (never written here).
    secrets = (("HF_TOKEN", assets.hf_token_file),) if assets.hf_token_file else ()
    job = make_job(
        ctx,
        stage=NAME,
        name=JOB_NAME,
        argv=ctx.module("data_prep.download_assets", *args),
        resources=cpu_resources(ctx, assets.resources),
        secret_files=secrets,
    )
    return (job,)


def _check(cfg: Any, planned: frozenset[str]) -> None:
    """A converted VAE names a downloaded file and replaces none; the container must see the folders where
    training reads the staged models (a stage that declares a single-file asset checks its own mount)."""
    for name, asset in by_name(cfg).items():
        _check_nemo_vae(name, asset)
        if cfg.container.runtime is Runtime.pyxis:
            require_mounted(f"assets.{name}.local_dir", asset.local_dir, cfg.container.mounts)
    found = weights.of(cfg)
    if found is not None and cfg.container.runtime is Runtime.pyxis:
        require_mounted(weights.KEY, str(weights.origin_dir(cfg, found)), cfg.container.mounts)


def _host_check(cfg: Any, planned: frozenset[str], facts: Facts) -> None:
    weights.host_check(cfg)


def _check_nemo_vae(name: str, asset: AssetConfig) -> None:
    vae, key = asset.nemo_vae, f"assets.{name}.nemo_vae"
    if (vae.source is None) != (vae.file is None):
        missing = "file" if vae.file is None else "source"
        raise ConfigError(f"{key}.{missing}", "is null but the other is set: give both (or neither)")
    if vae.source is not None and vae.source not in asset.files:
        raise ConfigError(
            f"{key}.source",
            f"{vae.source!r} is not one of assets.{name}.files {list(asset.files)}",
        )
    if vae.file is not None and vae.file in asset.files:
        raise ConfigError(
            f"{key}.file",
            f"{vae.file!r} is one of assets.{name}.files: the converted copy must not replace the downloaded "
            "file (allowed: another path under local_dir)",
        )


STAGE = StageSpec(
    name=NAME,
    config=AssetsConfig,
    plan=plan,
    auto=lambda cfg: cfg.assets.enable,
    check=_check,
    host_check=_host_check,
)
