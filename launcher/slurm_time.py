"""Slurm's time values (sbatch --time): parsed to seconds, and NeMo's DD:HH:MM:SS duration.

Slurm accepts "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
"days-hours:minutes" and "days-hours:minutes:seconds"; "UNLIMITED"/"INFINITE" mean no limit.
"""

from __future__ import annotations

import re

UNLIMITED = ("UNLIMITED", "INFINITE")
FORMATS = ('"MM"', '"MM:SS"', '"HH:MM:SS"', '"D-HH"', '"D-HH:MM"', '"D-HH:MM:SS"', "UNLIMITED")
_DAYS = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$")
_CLOCK = re.compile(r"^(\d+)(?::(\d+))?(?::(\d+))?$")


def seconds(value: str) -> int | None:
    """Seconds in a Slurm time value; None for no limit. ValueError names the accepted formats.

    >>> seconds("48:00:00"), seconds("2-00:30"), seconds("90"), seconds("UNLIMITED")
    (172800, 174600, 5400, None)
    """
    text = str(value).strip()
    if text.upper() in UNLIMITED:
        return None
    if match := _DAYS.match(text):
        days, hours, minutes, secs = (int(g or 0) for g in match.groups())
        return ((days * 24 + hours) * 60 + minutes) * 60 + secs
    if match := _CLOCK.match(text):
        parts = [int(g) for g in match.groups() if g is not None]
        if len(parts) == 1:
            return parts[0] * 60
        if len(parts) == 2:
            return parts[0] * 60 + parts[1]
        return (parts[0] * 60 + parts[1]) * 60 + parts[2]
    raise ValueError(f"{value!r} is not a Slurm time; use one of {', '.join(FORMATS)}")


def nemo_duration(total_seconds: int) -> str:
    """NeMo's exp_manager.max_time_per_run format, DD:HH:MM:SS.

    >>> nemo_duration(171000)
    '01:23:30:00'
    """
    minutes, secs = divmod(total_seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{secs:02d}"
