"""Errors a user sees, each as one clear message (no traceback), and the exit status each means.

The launcher's exit statuses mean one thing each (README, "Exit statuses"):
  2   refused before anything ran: a bad value, preset or key, or a host check (nothing submitted or run);
  1   it ran and failed: sbatch refused a job after the launch wrote its files, a local job failed;
  130 stopped by Ctrl-C (SIGINT), 143 by SIGTERM or `cancel` (128 + the signal's number, as a shell says).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

REFUSED = 2
FAILED = 1


def stopped_by(signum: int) -> int:
    """The exit status of a run stopped by that signal: 128 + its number, as a shell reports it."""
    return 128 + signum


INTERRUPTED = stopped_by(signal.SIGINT)  # 130
TERMINATED = stopped_by(signal.SIGTERM)  # 143


def override_key(word: str) -> str:
    """The key of a command-line override (`+x.y=1`, `~x.y`, `x.y=1` -> `x.y`).

    >>> override_key("++training.trainer.max_steps=5"), override_key("~env.X"), override_key("-m")
    ('training.trainer.max_steps', 'env.X', '-m')
    """
    return word.lstrip("+~").partition("=")[0]


@dataclass(frozen=True)
class Fix:
    """The command line that answers a refusal: overrides to set (each in place of the user's own for its
    key, or added) and words to drop. The launcher prints the whole command with it, to type as printed.

    >>> Fix(set=("stages=[training]",), drop=("-m",)).apply(["-m", "stages=training", "dry_run=true"])
    ['stages=[training]', 'dry_run=true']
    >>> Fix(set=("container=pyxis", "container.image=x")).apply(["container=x"])
    ['container=pyxis', 'container.image=x']
    """

    set: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()

    def apply(self, argv: Sequence[str]) -> list[str]:
        words = [word for word in argv if word not in self.drop]
        for override in self.set:
            key = override_key(override)
            at = [i for i, word in enumerate(words) if override_key(word) == key]
            if at:
                words[at[0]] = override
                words = [word for i, word in enumerate(words) if i not in at[1:]]
            else:
                words.append(override)
        return words


class LauncherError(Exception):
    """An error reported to the user as one clear message (no traceback): refused before anything ran,
    unless a subclass says otherwise. `fix`: the command line that answers it, when there is one."""

    exit_status = REFUSED

    def __init__(self, message: str, fix: Fix | None = None) -> None:
        super().__init__(message)
        self.fix = fix


class ConfigError(LauncherError):
    """A config value is wrong: names the key and what is allowed."""

    def __init__(self, key: str, message: str, fix: Fix | None = None) -> None:
        super().__init__(f"{key}: {message}", fix)
        self.key = key


class RunFailed(LauncherError):
    """The launch wrote its files and submitted or ran jobs, and that failed (a local job, sbatch)."""

    exit_status = FAILED


class SubmitError(RunFailed):
    """The scheduler refused a job; carries its own message."""


class RunStopped(LauncherError):
    """A local run stopped by a signal or by `cancel`: its exit status is the signal's (130, 143)."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status
