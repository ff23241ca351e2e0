"""`python launcher/main.py <overrides>`: the launcher as its users know it (installed, also `sd-launch`).

Started as a script, the folder holding the `launcher` package must be importable; the code is
launcher/cli.py.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # started by path: the checkout replaces this file's folder on sys.path
    sys.path[0] = str(next(p for p in Path(__file__).resolve().parents if not (p / "__init__.py").exists()))

if __name__ == "__main__":
    from launcher.cli import main

    sys.exit(main(sys.argv[1:]))
