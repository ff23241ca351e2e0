"""`python launcher/main.py <overrides>`: the launcher as its users know it (installed, also `sd-launch`).

Started as a script, the folder holding the `launcher` package must be importable; the code is
launcher/cli.py.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from launcher.cli import main

    sys.exit(main(sys.argv[1:]))
