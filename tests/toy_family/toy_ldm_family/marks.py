"""python -m toy_ldm_family.marks DATA_DIR OUT MARK: the toy's data step in its job (run from the run
folder's copy of this distribution): the tars under DATA_DIR counted, OUT written with them and the
family the job's own process finds for the name (launcher.families.named)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher.families import named
from toy_ldm_family.family import NAME


def main(argv: list[str]) -> int:
    data_dir, out, mark = Path(argv[0]), Path(argv[1]), argv[2]
    tars = sorted(str(path.relative_to(data_dir)) for path in data_dir.rglob("*.tar"))
    found = {"mark": mark, "family": named(NAME).title, "module": __file__, "tars": len(tars)}
    out.with_suffix(".tmp").write_text(json.dumps(found) + "\n")
    out.with_suffix(".tmp").replace(out)
    print(f"toy_marks: {len(tars)} tars, family {found['family']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
