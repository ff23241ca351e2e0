"""Every leaf of the config schema has a rule, and every rule refuses bad values before anything is
written or submitted (the property the issue asks for), plus the rules themselves against their
sources: Slurm's own time parser (libslurm), and generated values (hypothesis).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import os
import sys
import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, compose_config
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, OmegaConf, open_dict

from launcher.cli import launch
from launcher.config_doc import optional_inner as _optional_inner
from launcher.config_doc import schema_leaves
from launcher.context import Facts
from launcher.errors import ConfigError
from launcher.registry import RootConfig
from launcher.rules import (
    MAX_SLURM_TIME_S,
    PATH_COMPONENT,
    Choice,
    Each,
    Keys,
    Nested,
    Pattern,
    Range,
    Rule,
    SlurmTime,
    Text,
    slurm_time_seconds,
)


def _type_is_the_rule(tp: Any) -> bool:
    """Booleans and enums: OmegaConf refuses every other value, so no rule is needed."""
    inner = _optional_inner(tp)
    return inner is bool or (isinstance(inner, type) and issubclass(inner, Enum))


# What a field of each type would most often declare: the start of the hint in the failure message.
RULE_HINTS = {
    int: "ruled(Range(1), <default>, help=...)",
    float: "ruled(Range(0, integer=False), <default>, help=...)",
    str: "ruled(Text(), <default>, help=...)",
    list: "ruled(Each(<item rule>), factory=list, help=...)",
    dict: "ruled(Keys(ENV_NAME), factory=dict, help=...)",
}


def unruled(cls: type) -> list[str]:
    out = []
    for leaf in schema_leaves(cls):
        if leaf.rule is None and not _type_is_the_rule(leaf.type):
            inner = _optional_inner(leaf.type)
            hint = RULE_HINTS.get(typing.get_origin(inner) or inner, "ruled(<rule>, <default>, help=...)")
            name = leaf.where.split(".")[1]
            out.append(
                f"{leaf.key} ({leaf.where}) declares no rule: next to the field in launcher/config.py write "
                f"`{name}: {leaf.annotation} = {hint}`"
                " with the rule that fits: Range, Text, Choice, SlurmTime, Each, Keys, Nested, or PATH_COMPONENT, "
                "ABS_PATH, SLURM_MEM, ENV_NAME, MOUNT, SBATCH_FLAG (launcher/rules.py)"
            )
    return out


def test_every_leaf_of_the_schema_declares_a_rule() -> None:
    problems = unruled(RootConfig)
    assert problems == [], "\n".join(problems)


def test_a_field_without_a_rule_is_reported_with_what_to_declare() -> None:
    @dataclasses.dataclass
    class Toy:
        workers: int = 4
        ok: bool = True

    [problem] = unruled(Toy)
    assert problem.startswith("workers (Toy.workers) declares no rule")
    assert "`workers: int = ruled(Range(1), <default>, help=...)`" in problem


# Strings that break some rule; each leaf gets the ones its own rule refuses.
BAD_STRINGS = ("a/b", "relative/path", "x,y", "-x", "50%", "..", "a b", "lots", "not-a-choice")


def _breaking(rule: Rule) -> list[Any]:
    """Values that `rule` must refuse, chosen from its data (not by asking the rule)."""
    if isinstance(rule, Range):
        step = 1 if rule.integer else 0.5
        low = [] if rule.lo is None else [rule.lo if rule.above_lo else rule.lo - step]
        return [*low, *([] if rule.hi is None else [rule.hi + step]), "abc"]
    if isinstance(rule, SlurmTime):
        return ["forever", "0", "1:2:3:4", "UNLIMITED", "00:75:00", ""]
    if isinstance(rule, Text):
        return ["", "  ", ["x"]]
    if isinstance(rule, Choice):
        return ["not-a-choice", 3.5]
    if isinstance(rule, Pattern):
        return ["", *[s for s in BAD_STRINGS if rule.problem(s)][:2]]
    if isinstance(rule, Each):
        items = [[bad] for bad in _breaking(rule.item)[:2]] if rule.item else []
        return [*items, *([[]] if rule.min_items else []), "x"]
    if isinstance(rule, Keys):
        return [*[{bad: "x"} for bad in _breaking(rule.key_rule) if bad and isinstance(bad, str)][:1], "x"]
    if isinstance(rule, Nested):
        return ["x"]  # its keys are leaves of their own
    raise AssertionError(f"teach tests/test_config_rules.py::_breaking bad values for {type(rule).__name__}")


def _wrong_type(tp: Any) -> list[Any]:
    inner = _optional_inner(tp)
    if inner is bool:
        return ["maybe"]
    if isinstance(inner, type) and issubclass(inner, Enum):
        return ["nope"]
    return {int: ["abc", 1.5], float: ["abc"], str: [["x"]]}.get(inner, [])


def bad_cases() -> list[tuple[str, Any]]:
    """Every leaf with one value its rule refuses and one of a wrong type; all of a rule's bad values (and all
    of a type's) on the first leaf that has that rule (type). Leaves share rules (Range(1) on dozens of
    them): a rule refuses a value alike wherever it is declared, what each leaf shows is that its own rule
    and type are applied. A launch costs 80 ms of CPU (the schema merge): 527 cases where all on all were 941."""
    cases: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for leaf in schema_leaves(RootConfig):
        groups = [(repr(leaf.rule), _breaking(leaf.rule))] if leaf.rule else []
        if leaf.type:
            groups.append((repr(_optional_inner(leaf.type)), _wrong_type(leaf.type)))
        values: list[Any] = []
        for kind, bad in groups:
            values += bad[:1] if kind in seen else bad
            seen.add(kind)
        unique = {repr(value): value for value in values}  # Range's "abc" is also an int's wrong type
        cases += [(leaf.key, value) for value in unique.values()]
    return cases


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared")


def valid_config(shared: Path) -> DictConfig:
    """A valid config that submits to Slurm (so a missed error would call sbatch). Results and data
    are set apart from shared_dir so that every leaf can be broken alone."""
    return compose_config(
        [
            "cluster=slurm",
            f"cluster.shared_dir={shared}",
            f"base_results_dir={shared}/results",
            f"data_dir={shared}/data",
            "dry_run=false",
            "data_preparation=demo",
            # The nodes' NeMo interpreter (no container here; without it the launch is refused).
            "training.run.python=python3",
        ]
    )


@pytest.fixture(scope="module")
def composed(shared: Path) -> DictConfig:
    return valid_config(shared)


@contextlib.contextmanager
def broken(composed: DictConfig, key: str, value: Any) -> Iterator[DictConfig]:
    """`composed` with `key` set to `value`, then as it was (a launch only reads its config): setting one
    key back costs far less than a deep copy of the whole, a thousand times over."""
    parts = key.split(".")
    # The deepest section the key already has, and the key's next part in it (absent: added, then removed).
    depth = 1
    while depth < len(parts) and isinstance(OmegaConf.select(composed, ".".join(parts[:depth])), DictConfig):
        depth += 1
    holder = OmegaConf.select(composed, ".".join(parts[: depth - 1])) if depth > 1 else composed
    name = parts[depth - 1]
    found = name in holder
    raw = OmegaConf.to_container(holder, resolve=False)[name] if found else None
    OmegaConf.update(composed, key, value, merge=False, force_add=True)
    try:
        yield composed
    finally:
        with open_dict(composed):
            if found:
                holder[name] = raw
            else:
                del holder[name]


FACTS = Facts(python=sys.executable, code_dir=str(REPO), nemo_python=None)


def test_the_valid_config_is_submitted(tmp_path: Path, recording_sbatch: Path) -> None:
    """The control for the test below: without a bad value, the same config reaches sbatch."""
    launch(valid_config(tmp_path), FACTS)
    # assets, the five demo steps, and the slurm preset's encode_latents and latents_wdinfo
    assert len(recording_sbatch.read_text().splitlines()) == 8
    assert (tmp_path / "results/sd_860m_res_256/manifest.json").exists()


@pytest.mark.parametrize(("key", "value"), bad_cases(), ids=str)
def test_every_leaf_refuses_its_bad_values(
    key: str, value: Any, composed: DictConfig, shared: Path, recording_sbatch: Path
) -> None:
    with broken(composed, key, value) as cfg, pytest.raises(ConfigError) as error:
        launch(cfg, FACTS)
    assert error.value.key == key or error.value.key.startswith((f"{key}.", f"{key}[")), str(error.value)
    assert "allowed" in str(error.value)
    assert list(shared.iterdir()) == [], "something was written before the error"
    assert not recording_sbatch.exists(), "sbatch was called"


def test_a_bad_value_from_a_preset_is_refused_like_one_from_the_command_line(tmp_path: Path) -> None:
    presets = tmp_path / "conf"
    (presets / "data_check").mkdir(parents=True)
    (presets / "data_check" / "broken.yaml").write_text(
        "defaults:\n  - default\n  - _self_\nnum_workers: -2\n"
    )
    with pytest.raises(
        ConfigError, match=r"^data_check.num_workers: -2 is too small; allowed: an integer, at least 1"
    ):
        launch(
            compose_config(
                [
                    f"hydra.searchpath=[file://{presets}]",
                    "data_check=broken",
                    f"cluster.shared_dir={tmp_path}/shared",
                ]
            ),
            FACTS,
        )
    assert not (tmp_path / "shared").exists()


# --- the rules themselves ---------------------------------------------------------------------

LIBSLURM = ctypes.util.find_library("slurm")


@pytest.fixture(scope="module")
def slurm_time_str2mins() -> Any:
    """Slurm's own parser of --time (src/common/parse_time.c), from the installed libslurm."""
    if LIBSLURM is None:
        if os.environ.get("REQUIRE_SLURM", "") not in ("", "0"):
            pytest.fail("REQUIRE_SLURM is set but libslurm is not installed (tests/slurm/install.sh)")
        pytest.skip("libslurm is not installed")
    parse = ctypes.CDLL(LIBSLURM).slurm_time_str2mins
    parse.argtypes, parse.restype = [ctypes.c_char_p], ctypes.c_int
    return parse


SLURM_NO_VAL, SLURM_INFINITE = -2, -1  # 0xfffffffe and 0xffffffff read as int


@settings(max_examples=400, deadline=None)
@given(
    text=st.one_of(
        st.text(alphabet="0123456789-: ", max_size=14),
        st.from_regex(r"\A[0-9]{1,4}(-[0-9]{1,2})?(:[0-9]{1,2}){0,2}\Z"),
        st.sampled_from(["UNLIMITED", "infinite", "-1", "0", "forever", "1-", "1:99:00", "٣:00"]),
    )
)
def test_every_time_we_accept_slurm_accepts_with_the_same_length(text: str, slurm_time_str2mins: Any) -> None:
    ours = SlurmTime().problem(text) is None
    minutes = slurm_time_str2mins(text.encode())
    if ours:
        seconds = slurm_time_seconds(text)
        assert seconds is not None and minutes == -(-seconds // 60), (text, minutes, seconds)
    if minutes == SLURM_NO_VAL:
        assert not ours, text


@pytest.mark.parametrize(
    "text", ["30", "30:15", "04:00:00", "48:00:00", "2-0", "2-12", "2-12:30", "2-12:30:15"]
)
def test_every_documented_slurm_form_is_accepted(text: str, slurm_time_str2mins: Any) -> None:
    assert SlurmTime().problem(text) is None
    assert slurm_time_str2mins(text.encode()) > 0


@pytest.mark.parametrize("text", ["UNLIMITED", "INFINITE", "0", "00:00:00", f"{MAX_SLURM_TIME_S // 60 + 1}"])
def test_no_limit_and_too_long_are_refused_though_slurm_parses_them(
    text: str, slurm_time_str2mins: Any
) -> None:
    assert SlurmTime().problem(text) is not None
    assert slurm_time_str2mins(text.encode()) != SLURM_NO_VAL


@given(lo=st.integers(-5, 5), span=st.integers(0, 10), value=st.integers(-50, 50))
def test_an_integer_range_accepts_exactly_its_interval(lo: int, span: int, value: int) -> None:
    rule = Range(lo, lo + span)
    assert (rule.problem(value) is None) == (lo <= value <= lo + span)
    assert rule.problem(True) is not None and rule.problem(float(value)) is not None


@given(name=st.text(max_size=40))
def test_a_path_component_never_leaves_its_folder(name: str) -> None:
    if PATH_COMPONENT.problem(name) is None:
        assert (
            "/" not in name
            and "%" not in name
            and name not in (".", "..")
            and not name.startswith((".", "-"))
        )
        assert (Path("/runs") / name).parent == Path("/runs")


@given(name=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,40}\Z"))
def test_ordinary_run_names_are_accepted(name: str) -> None:
    assert PATH_COMPONENT.problem(name) is None


def test_choice_tells_16_from_16_0_and_true_from_1() -> None:
    assert Choice((16, "bf16")).problem(16.0) is not None
    assert Choice((1,)).problem(True) is not None
    assert (
        Choice(("no", "border")).problem("False")
        == 'is not a choice (YAML reads a bare no as false: write "no")'
    )
