"""Overrides as typed on the command line: a value holding `=` (every NeMo checkpoint name) works
unquoted, and an override Hydra cannot read is refused naming its key."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, SD_TEXT_ENCODER
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from launcher import conf_reading
from launcher.cli import compose_overrides, hydra_quoted, main

# Printable text with at least one `=`, not starting the way a quoted, list or dict value does.
VALUES = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="\x7f")).map(
    lambda text: f"a{text}=b{text}"
)


def _checkpoint(*overrides: str) -> str:
    composed = compose_overrides(list(overrides))
    return OmegaConf.to_container(composed.samples, resolve=False)["checkpoint"]  # ${...} kept as typed


@given(VALUES)
def test_hydra_reads_a_quoted_value_back_unchanged(value: str) -> None:
    parsed = OverridesParser.create().parse_override(f"samples.checkpoint={hydra_quoted(value)}")
    assert parsed.value() == value


@pytest.mark.parametrize(
    "value",
    ["/fsx/ckpt/sd--loss=0.99-step=20000-consumed_samples=8.0.ckpt", "/x/it's=a\\b\\", "${data_dir}/a=b"],
)
def test_a_value_with_equals_signs_reaches_the_config_unchanged(value: str) -> None:
    assert _checkpoint(f"samples.checkpoint={value}") == value


def test_a_value_the_user_quoted_is_left_as_it_is() -> None:
    assert _checkpoint("samples.checkpoint='/x/a-step=1.ckpt'") == "/x/a-step=1.ckpt"
    assert _checkpoint(r"samples.checkpoint=/x/a-step\=1.ckpt") == "/x/a-step=1.ckpt"


def test_an_override_hydra_cannot_read_is_refused_naming_its_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["container.mounts=[/a=b:/c]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: container.mounts: Hydra cannot read 'container.mounts=[/a=b:/c]'"), err
    assert err.endswith("an item with special characters quoted: container.mounts=['...']\n"), err
    assert main(["container.mounts=['/a=b:/c']", "--cfg"]) == 0  # the hint, followed, reads


def _documented_samples_command() -> list[str]:
    """The docs' `stages=[samples] ... samples.checkpoint=<...>` command, continuation lines joined."""
    text = (REPO / "docs/samples-and-evaluation.md").read_text().replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if "samples.checkpoint=" in line]
    return re.sub(r"\s+", " ", line).strip().split(" ")


def test_the_documented_checkpoint_command_works_as_written(tmp_path: Path) -> None:
    """The documented line with its placeholders filled (a NeMo checkpoint name, /fsx on tmp_path):
    the samples stage's own checks pass and the exact path reaches the samples job's settings."""
    words = _documented_samples_command()
    assert words[:3] == ["python", "launcher/main.py", "stages=[samples]"], words
    [given] = [word for word in words if word.startswith("samples.checkpoint=")]
    checkpoint = (
        given.removeprefix("samples.checkpoint=")
        .replace("/fsx", str(tmp_path))
        .replace("<name>", "stable-diffusion--reduced_train_loss=0.99")
        .replace("<...>", "consumed_samples=8.0")
    )
    folder = Path(checkpoint).parent
    folder.mkdir(parents=True)
    Path(checkpoint).write_bytes(b"not read before the job")
    crop = {"augmentations": {"resize_smallest_side": 256, "center_crop_h_w": "256, 256"}}
    model = {"cond_stage_config": SD_TEXT_ENCODER, "data": {"train": crop}}
    (folder.parent / "hparams.yaml").write_text(yaml.safe_dump({"cfg": model}))
    (tmp_path / "nemo.sqsh").write_bytes(b"hsqs")
    argv = [word for word in words[2:] if word != given] + [
        f"samples.checkpoint={checkpoint}",  # as the shell passes it: one word, no Hydra quoting
        f"cluster.shared_dir={tmp_path}",
        f"container.mounts=[{tmp_path}:{tmp_path}]",
        f"container.image={tmp_path}/nemo.sqsh",
        "dry_run=true",
    ]
    assert main(argv) == 0
    settings = json.loads((tmp_path / "results/sd_860m_res_256/samples/samples.json").read_text())
    assert settings["checkpoint"] == checkpoint and "-step=20000-" in checkpoint


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML without libyaml: OmegaConf's own loader")
def test_conf_is_read_on_libyaml_while_composing_and_omegaconf_is_left_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The C parser reads conf/ (a fifth less compose time); OmegaConf.load elsewhere is OmegaConf's."""
    from omegaconf import _utils

    from launcher.cli import compose_config

    original, parsers = _utils.get_yaml_loader, []
    load = OmegaConf.load

    def spy(file: object) -> object:
        parsers.append(_utils.get_yaml_loader().__mro__[1])
        return load(file)  # type: ignore[arg-type]

    monkeypatch.setattr(OmegaConf, "load", staticmethod(spy))
    monkeypatch.setattr(conf_reading, "_READ", {})  # files this process read before are not read again
    assert compose_config(["stages=[training]"]).stages == ["training"]
    assert parsers and set(parsers) == {yaml.cyaml.CParser}
    assert _utils.get_yaml_loader is original


def test_each_config_file_is_parsed_once_per_process_and_each_composition_gets_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from launcher.cli import compose_config

    loads = []
    load = OmegaConf.load
    monkeypatch.setattr(OmegaConf, "load", staticmethod(lambda file: loads.append(file) or load(file)))
    monkeypatch.setattr(conf_reading, "_READ", {})
    first = compose_config(["cluster=aws_p5"])
    read = len(loads)
    assert read > 10  # conf/'s files and Hydra's own
    first.cluster.gpus_per_node = 1  # a caller's change stays in its own config
    again = compose_config(["cluster=aws_p5"])
    assert len(loads) == read and again.cluster.gpus_per_node == 8
    assert OmegaConf.to_yaml(again) == OmegaConf.to_yaml(compose_config(["cluster=aws_p5"]))
    # A conf/ file is known by its path, mtime and size: one that changed is read again.
    file = tmp_path / "preset.yaml"
    file.write_text("a: 1\n")
    source = SimpleNamespace(path=str(tmp_path), provider="main", _normalize_file_name=lambda name: name)
    key = conf_reading._read_key("file", source, "preset.yaml")
    file.write_text("a: 22\n")
    assert key is not None and conf_reading._read_key("file", source, "preset.yaml") != key
    assert conf_reading._read_key("file", source, "absent.yaml") is None  # left to Hydra, which names it
