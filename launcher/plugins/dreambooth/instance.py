"""The instance folder as NeMo's DreamBoothDataset reads it (nemo/collections/multimodal/data/dreambooth/
dreambooth_dataset.py v2.4.0): `Path(instance_data_root).iterdir()`, every entry opened with PIL, hidden files and
folders included. So the folder must exist and hold image files only; each one's first bytes are checked against
its format (read here without PIL: the launcher's venv has none)."""

from __future__ import annotations

from pathlib import Path

from launcher.errors import ConfigError

KEY = "dreambooth.instance_dir"
# Suffix -> the leading bytes of that format (PIL opens each by its content).
MAGIC = {
    ".jpg": (b"\xff\xd8\xff",),
    ".jpeg": (b"\xff\xd8\xff",),
    ".png": (b"\x89PNG\r\n\x1a\n",),
    ".webp": (b"RIFF",),
    ".bmp": (b"BM",),
}
ALLOWED = (
    "a folder holding image files only (" + ", ".join(sorted(MAGIC)) + "), no sub-folders, no other files"
)


def check_set(value: str | None, key: str = KEY) -> str:
    """The config alone: the folder is named."""
    if not value:
        raise ConfigError(key, f"is not set: DreamBooth trains on one subject's images; allowed: {ALLOWED}")
    return value


def check(value: str | None, key: str = KEY) -> int:
    """The number of instance images; refused naming `key`, the file and what is allowed."""
    folder = Path(check_set(value, key))
    if not folder.is_dir():
        raise ConfigError(key, f"{folder} is not a folder; allowed: {ALLOWED}")
    entries = sorted(folder.iterdir())
    if not entries:
        raise ConfigError(key, f"{folder} is empty; allowed: {ALLOWED}")
    for entry in entries:
        magic = MAGIC.get(entry.suffix.lower())
        if not entry.is_file() or magic is None:
            what = "a folder" if entry.is_dir() else f"a {entry.suffix or 'suffix-less'} file"
            raise ConfigError(
                key, f"{entry} is {what}, which NeMo would open as an image; allowed: {ALLOWED}"
            )
        with entry.open("rb") as stream:
            head = stream.read(8)
        if not head.startswith(magic):
            raise ConfigError(
                key,
                f"{entry} is not a {entry.suffix.lower()[1:]} image (its first bytes {head!r}); allowed: {ALLOWED}",
            )
    return len(entries)
