"""What a config value may be, declared next to its field in launcher/config.py.

A field joins validation by declaration: `time_limit: str = ruled(SlurmTime(), "04:00:00")` puts
the rule into the dataclass field's metadata, and `launcher.validate` walks every field of the
schema and checks each value against its rule. Rules are data plus one check; they say in words
what is allowed, so every error can name the key, the value and the allowed values.

    >>> Range(1).problem(0), Range(1).allowed
    ('is too small', 'an integer, at least 1')
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

# The keys of a dataclass field's metadata that hold its Rule and its help text.
RULE = "rule"
HELP = "help"


class Problem(NamedTuple):
    key: str
    value: Any
    reason: str
    allowed: str


class Rule:
    """One kind of constraint. Subclasses set `allowed` and implement `problem`."""

    allowed: str = ""

    def problem(self, value: Any) -> str | None:
        """Why `value` is refused (e.g. "is too small"), or None when it is allowed."""
        raise NotImplementedError

    def first_problem(self, key: str, value: Any) -> Problem | None:
        reason = self.problem(value)
        return Problem(key, value, reason, self.allowed) if reason else None


def ruled(
    rule: Rule, default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None, help: str
) -> Any:
    """A dataclass field with its rule and help: `ruled(Range(1), 64, help="Tars per task.")`."""
    metadata = {RULE: rule, HELP: help}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def described(default: Any, *, help: str) -> Any:
    """A boolean or enum field: its type is its whole rule (OmegaConf refuses anything else)."""
    return field(default=default, metadata={HELP: help})


@dataclass(frozen=True)
class Range(Rule):
    """A number from `lo` to `hi` (either may be open-ended); booleans are not numbers."""

    lo: float | None = None
    hi: float | None = None
    integer: bool = True
    # lo itself refused (a learning rate of 0 trains nothing).
    above_lo: bool = False

    @property
    def allowed(self) -> str:  # type: ignore[override]
        kind = "an integer" if self.integer else "a number"
        low = f"above {self.lo}" if self.above_lo else f"at least {self.lo}"
        if self.lo is not None and self.hi is not None and not self.above_lo:
            return f"{kind} from {self.lo} to {self.hi}"
        bounds = [low] if self.lo is not None else []
        bounds += [f"at most {self.hi}"] if self.hi is not None else []
        return ", ".join([kind, *bounds])

    def problem(self, value: Any) -> str | None:
        number = (int,) if self.integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, number) or not math.isfinite(value):
            return "is not an integer" if self.integer else "is not a finite number"
        if self.lo is not None and (value < self.lo or (self.above_lo and value == self.lo)):
            return "is too small"
        if self.hi is not None and value > self.hi:
            return "is too large"
        return None


def _text_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return "is not a string"
    if not value.strip():
        return "is empty"
    return None


@dataclass(frozen=True)
class Text(Rule):
    """A required string: empty or blank is refused."""

    allowed: str = "a non-empty string"

    def problem(self, value: Any) -> str | None:
        return _text_problem(value)


@dataclass(frozen=True)
class Pattern(Rule):
    """A non-empty string matching `regex` in full (ASCII classes only)."""

    regex: str
    allowed: str

    def problem(self, value: Any) -> str | None:
        empty = _text_problem(value)
        if empty:
            return empty
        return None if re.fullmatch(self.regex, value, re.ASCII) else "has the wrong form"


# One folder or file name that is also a safe Slurm job name: no '/', no '%' (Slurm's --output
# pattern character), no leading '.' or '-'.
PATH_COMPONENT = Pattern(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}",
    "a single path component of letters, digits, '.', '_' and '-' that starts with a letter or digit, "
    "at most 128 characters (it becomes a folder and a Slurm job name)",
)
# Jobs run in other folders (and on other nodes): a relative path would point elsewhere there.
# '%' is Slurm's filename-pattern character in log paths.
ABS_PATH = Pattern(r"/[^\x00-\x1f%]*", "an absolute path (starting with /) without '%' or control characters")


class FolderPath(Pattern):
    """ABS_PATH for a folder: launcher.validate.check_facts also refuses one the submitting host has as a
    file (a dry run would render it, and a real launch fail deep inside, naming no key)."""


FOLDER = FolderPath(ABS_PATH.regex, ABS_PATH.allowed)
ENV_NAME = Pattern(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name: letters, digits and '_'")
# sbatch --mem: a size with an optional unit; "0" asks for all of the node's memory.
SLURM_MEM = Pattern(
    r"[0-9]{1,9}[KMGT]?",
    "a Slurm memory size: a number with an optional K, M, G or T unit (e.g. 64G; 0 = all of the node's memory)",
)
# One `--name[=value]` word: launcher.stages.common.option() splits exactly this form.
SBATCH_FLAG = Pattern(r"--[A-Za-z][A-Za-z0-9-]*(=.*)?", "one long option per word: --name or --name=value")
# pyxis --container-mounts entry SRC[:DST[:FLAGS]]; entries are joined with ',' so none may hold one.
MOUNT = Pattern(
    r"/[^,:\x00-\x1f]*(:/[^,:\x00-\x1f]*(:[a-z+]+)?)?",
    "SRC[:DST[:FLAGS]] with absolute SRC and DST and no ',' (e.g. /fsx:/fsx)",
)


# sbatch --time formats (sbatch(1) and time_str2secs in Slurm's src/common/parse_time.c).
_SLURM_TIME_FORMS = (
    ("m", r"([0-9]+)"),
    ("m:s", r"([0-9]+):([0-5]?[0-9])"),
    ("h:m:s", r"([0-9]+):([0-5]?[0-9]):([0-5]?[0-9])"),
    ("d-h", r"([0-9]+)-([01]?[0-9]|2[0-3])"),
    ("d-h:m", r"([0-9]+)-([01]?[0-9]|2[0-3]):([0-5]?[0-9])"),
    ("d-h:m:s", r"([0-9]+)-([01]?[0-9]|2[0-3]):([0-5]?[0-9]):([0-5]?[0-9])"),
)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
MAX_SLURM_TIME_S = 365 * 86400


def slurm_time_seconds(text: str) -> int | None:
    """Seconds of an sbatch --time value in one of its six numeric forms, else None.

    >>> slurm_time_seconds("2-12:30"), slurm_time_seconds("90"), slurm_time_seconds("forever")
    (217800, 5400, None)
    """
    for form, regex in _SLURM_TIME_FORMS:
        match = re.fullmatch(regex, text, re.ASCII)
        if match:
            units = re.split(r"[-:]", form)
            return sum(
                int(part) * _UNIT_SECONDS[unit] for unit, part in zip(units, match.groups(), strict=True)
            )
    return None


@dataclass(frozen=True)
class SlurmTime(Rule):
    """A finite job time limit. Slurm also takes UNLIMITED/INFINITE/-1 and 0 (= no limit); they are
    refused here: a job asking for more than the partition's MaxTime pends forever (or is rejected),
    and training's clean stop (exp_manager.max_time_per_run, training.run.stop_before_limit_s) needs a
    limit to count back from. Fields after the first stay in their clock range (minutes < 60, hours < 24 after
    days), which Slurm itself does not check, so that a typo such as 00:75:00 is caught."""

    allowed: str = (
        "a Slurm time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes or "
        "days-hours:minutes:seconds (e.g. 30, 04:00:00, 2-00:00:00), above 0 and at most 365 days"
    )

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, str):
            return "is not a string"
        seconds = slurm_time_seconds(value)
        if seconds is None:
            return "is not a Slurm time"
        if seconds == 0 or seconds > MAX_SLURM_TIME_S:
            return "is out of range"
        return None


@dataclass(frozen=True)
class Choice(Rule):
    """One of a fixed set of values (compared with ==, so 16 and "16" are different choices)."""

    values: tuple[Any, ...]

    @property
    def allowed(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(repr(v.value if isinstance(v, Enum) else v) for v in self.values)

    def problem(self, value: Any) -> str | None:
        if any(value == v and type(value) is type(v) for v in self.values):
            return None
        if "no" in self.values and value in (False, "False", "false"):
            return 'is not a choice (YAML reads a bare no as false: write "no")'
        return "is not a choice"


@dataclass(frozen=True)
class Each(Rule):
    """A list with at least `min_items` items, each meeting `item` (None: the type says it all)."""

    item: Rule | None = None
    min_items: int = 0

    @property
    def allowed(self) -> str:  # type: ignore[override]
        each = f", each {self.item.allowed}" if self.item else ""
        return f"a list of at least {self.min_items} item(s){each}" if self.min_items else f"a list{each}"

    def problem(self, value: Any) -> str | None:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            return "is not a list"
        return "has too few items" if len(value) < self.min_items else None

    def first_problem(self, key: str, value: Any) -> Problem | None:
        found = super().first_problem(key, value)
        if found or self.item is None:
            return found
        return next(
            (p for i, v in enumerate(value) if (p := self.item.first_problem(f"{key}[{i}]", v))), None
        )


@dataclass(frozen=True)
class Keys(Rule):
    """A mapping of strings whose keys each meet `key_rule` (values may be any string, "" too:
    environment variables)."""

    key_rule: Rule

    @property
    def allowed(self) -> str:  # type: ignore[override]
        return f"a mapping of strings whose keys are each {self.key_rule.allowed}"

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, Mapping):
            return "is not a mapping"
        return None if all(isinstance(v, str) for v in value.values()) else "has a value that is not a string"

    def first_problem(self, key: str, value: Any) -> Problem | None:
        found = super().first_problem(key, value)
        if found:
            return found
        return next(
            (
                Problem(f"{key}.{k}", k, p.reason, p.allowed)
                for k in value
                if (p := self.key_rule.first_problem(key, k))
            ),
            None,
        )


@dataclass(frozen=True)
class Nested(Rule):
    """Rules for dotted keys inside a free-form section (NeMo's trainer/model/exp_manager). A key
    that is absent is not checked: NeMo applies its own default."""

    rules: Mapping[str, Rule]
    allowed: str = "a mapping"

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, Mapping) else "is not a mapping"

    def first_problem(self, key: str, value: Any) -> Problem | None:
        found = super().first_problem(key, value)
        if found:
            return found
        for path, rule in self.rules.items():
            node: Any = value
            for part in path.split("."):
                node = node.get(part, _ABSENT) if isinstance(node, Mapping) else _ABSENT
            if node is not _ABSENT and (p := rule.first_problem(f"{key}.{path}", node)):
                return p
        return None


_ABSENT = object()
