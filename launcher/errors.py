"""Errors a user sees before anything is written or submitted."""

from __future__ import annotations


class LauncherError(Exception):
    """An error reported to the user as one clear message (no traceback)."""


class ConfigError(LauncherError):
    """A config value is wrong: names the key and what is allowed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class SubmitError(LauncherError):
    """The scheduler refused a job; carries its own message."""
