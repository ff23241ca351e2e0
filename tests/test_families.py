"""Model families as plug-ins (launcher/families/): every preset has exactly one family, and no code
outside the package asks which family a config is (docs/adding-a-family.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO, compose_config

from data_prep.family_settings import named
from launcher import families
from launcher.validate import to_schema

PACKAGE = REPO / "launcher" / "families"
# The in-tree plugins are families' own packages: a plugin names its family (docs/adding-a-family.md).
PLUGINS = REPO / "launcher" / "plugins"
PRESETS = sorted(
    p.relative_to(REPO / "conf/training").with_suffix("") for p in REPO.glob("conf/training/*/*.yaml")
)


def _outside_code() -> list[Path]:
    code = [*REPO.glob("launcher/**/*.py"), *REPO.glob("data_prep/**/*.py")]
    return sorted(p for p in code if PACKAGE not in p.parents and PLUGINS not in p.parents)


def _identifiers(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        found += [(getattr(node, "lineno", 0), name) for name in names if name]
    return found


def _compared_to_a_family_name(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines that compare something with a family's name (`family.name == "sdxl"`, `in ("sd1", ...)`)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                values = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                    lines.append(node.lineno)
    return lines


def family_leaks(paths: list[Path]) -> list[str]:
    names = {family.name for family in families.FAMILIES}
    leaks = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(REPO) if REPO in path.parents else path.name
        for line, name in _identifiers(tree):
            lowered = name.lower()
            if "sdxl" in lowered or any(part in names for part in lowered.replace(".", "_").split("_")):
                leaks.append(f"{where}:{line}: {name}")
        leaks += [
            f"{where}:{line}: compares with a family's name"
            for line in _compared_to_a_family_name(tree, names)
        ]
    return leaks


def test_no_code_outside_the_families_package_names_a_family() -> None:
    assert family_leaks(_outside_code()) == []


def test_the_scan_finds_a_family_named_outside_the_package(tmp_path: Path) -> None:
    """The scan above can fail: the shapes it looks for, in a file of its own."""
    leaky = tmp_path / "leaky.py"
    leaky.write_text(
        "from launcher.plugins.sdxl import family\n"
        "def is_sdxl(model):\n    return model.family.name == 'sdxl'\n"
        "def f(family):\n    return family.name in ('sd1', 'sd2')\n"
        "def g(family):\n    return family.inference.converts_checkpoints\n"
    )
    leaks = family_leaks([leaky])
    # the imported module, the function's name, its comparison, the other comparison; not g
    assert sorted(leak.split(":")[1] for leak in leaks) == ["1", "2", "3", "5"], leaks


@pytest.mark.parametrize("preset", PRESETS, ids=str)
def test_every_training_preset_has_exactly_one_family(preset: Path) -> None:
    model = to_schema(compose_config([f"training={preset}", "training.init_from=none"])).training.model
    matching = [family.name for family in families.FAMILIES if family.matches(model)]
    sd = "sd2" if "v2_0" in preset.name or "sd21" in preset.name else "sd1"
    expected = {"sdxl": "sdxl", "stable_diffusion": sd, "finetune": "sdxl" if "sdxl" in preset.name else sd}[
        preset.parts[0]
    ]
    assert matching == [expected]


def test_each_family_stages_its_vae_and_declares_its_defaults() -> None:
    for family in families.FAMILIES:
        assert family.vae_asset in family.assets, family.name
        inference = family.inference
        assert inference.samplers and set(inference.strided_samplers) <= set(inference.samplers)
        assert inference.infer_script.endswith(".py") and inference.generate_script.endswith(".py")
        assert family.published_rates or family.gflop, f"{family.name}: no way to price its training"


def test_each_familys_cache_names_an_encoder_and_check_the_data_jobs_can_load() -> None:
    """encode_latents and data_check find them by these names alone (data_prep imports no family)."""
    for family in families.FAMILIES:
        encoder = named(family.cache.encoder)
        assert all(
            callable(getattr(encoder, part, None)) for part in ("depends_on", "preprocess", "encode_members")
        )
        assert family.cache.batch_check is None or callable(named(family.cache.batch_check)), family.name
