"""download_parquet's output: `part-NNNNN.parquet` files of url/caption, filled in order to balanced sizes,
each written under a temporary name and renamed when full (a partition on disk is always complete)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep.atomic import TEMP_SUFFIX, temp_path_beside
from data_prep.faults import naming
from data_prep.source import DataPrepError

OUTPUT_SCHEMA = pa.schema([("url", pa.string()), ("caption", pa.string())])


def output_schema(extra_columns: tuple[str, ...]) -> pa.Schema:
    """url and caption, then the carried source columns (--extra-columns), as strings."""
    return pa.schema([*OUTPUT_SCHEMA, *((name, pa.string()) for name in extra_columns)])


PART_NAME = re.compile(r"^part-(\d{5})\.parquet$")


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def partition_sizes(total: int, n: int) -> list[int]:
    """`n` sizes summing to `total`, the first `total % n` one larger."""
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


class PartitionWriter:
    """Fills partitions in order; each is written under a temp name and renamed when full."""

    def __init__(self, out_dir: Path, sizes: list[int], schema: pa.Schema = OUTPUT_SCHEMA) -> None:
        self.out_dir = out_dir
        self.sizes = sizes
        self.schema = schema
        self.index = 0
        self.filled = 0
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None

    @property
    def remaining(self) -> int:
        return sum(self.sizes[self.index :]) - self.filled

    def write(self, table: pa.Table) -> None:
        offset = 0
        while offset < table.num_rows:
            if self.index >= len(self.sizes):
                raise DataPrepError("--source changed while reading: more rows than counted in pass 1")
            if self._writer is None:
                self._tmp = temp_path_beside(self.out_dir / part_name(self.index))
                with naming(self._tmp):  # arrow's write errors name no file
                    # URLs and captions are nearly all distinct: dictionary encoding only costs time.
                    self._writer = pq.ParquetWriter(self._tmp, self.schema, use_dictionary=False)
            take = min(self.sizes[self.index] - self.filled, table.num_rows - offset)
            with naming(self._tmp):
                self._writer.write_table(table.slice(offset, take))
            offset += take
            self.filled += take
            if self.filled == self.sizes[self.index]:
                self._finish_current()

    def _finish_current(self) -> None:
        assert self._writer is not None and self._tmp is not None
        with naming(self._tmp):
            self._writer.close()
        os.replace(self._tmp, self.out_dir / part_name(self.index))
        self._writer, self._tmp = None, None
        self.index += 1
        self.filled = 0

    def abort(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
        except OSError:  # a full disk: the temporary file goes anyway, the first error is reported
            pass
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def clean_output_dir(out_dir: Path, keep: int) -> None:
    """Drop leftovers of interrupted runs and partitions beyond the new count."""
    for path in out_dir.iterdir():
        match = PART_NAME.match(path.name)
        stale_part = match is not None and int(match[1]) >= keep
        if stale_part or (path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX)):
            path.unlink()
