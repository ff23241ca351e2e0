"""Which columns of a source parquet file download_parquet reads, and which rows it keeps (--min-width ...)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from data_prep.source import DataPrepError

Filters = dict[str, float]  # filter option name (a FILTERS key) -> threshold

# option name -> (for each compared column, the column names tried in order; comparison keeping a row):
# LAION's names, then COYO-700M's (nsfw_score_opennsfw2 and watermark_score are probabilities like
# punsafe/pwatermark). Two columns compare their larger value: NVIDIA's resolution filter (`method: larger`)
# on the source's width/height, applied before download instead of on every sample at training time.
FILTERS: dict[str, tuple[tuple[tuple[str, ...], ...], str]] = {
    "min_width": ((("WIDTH",),), ">="),
    "min_height": ((("HEIGHT",),), ">="),
    "min_larger_side": ((("WIDTH",), ("HEIGHT",)), ">="),
    "max_punsafe": ((("punsafe", "nsfw_score_opennsfw2"),), "<="),
    "max_pwatermark": ((("pwatermark", "watermark_score"),), "<="),
    "min_aesthetic": ((("aesthetic", "AESTHETIC_SCORE", "aesthetic_score_laion_v2"),), ">="),
}
INT_FILTERS = ("min_width", "min_height", "min_larger_side")


@dataclass(frozen=True)
class FilePlan:
    """One source file with its resolved column names."""

    path: str
    size: int
    url: str = ""
    caption: str = ""
    filter_cols: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (filter name, its columns)
    extra: tuple[str, ...] = ()  # the file's names of the carried columns (--extra-columns), in their order

    @property
    def filter_columns(self) -> list[str]:
        return [column for _, columns in self.filter_cols for column in columns]


def match_column(names: list[str], wanted: tuple[str, ...], option: str, path: str) -> str:
    by_lower = {name.lower(): name for name in names}
    for name in wanted:
        if name.lower() in by_lower:
            return by_lower[name.lower()]
    raise DataPrepError(
        f"{option}: no column {' or '.join(wanted)} in {path}; available columns: {', '.join(names)}"
    )


def resolve_columns(
    plan: FilePlan,
    names: list[str],
    url_col: str,
    caption_col: str,
    filters: Filters,
    extra_columns: tuple[str, ...] = (),
) -> FilePlan:
    """`plan` with its url, caption, filter and carried columns found among `names` (case-insensitively)."""
    filter_cols = tuple(
        (
            name,
            tuple(
                match_column(names, wanted, "--" + name.replace("_", "-"), plan.path)
                for wanted in FILTERS[name][0]
            ),
        )
        for name in filters
    )
    return FilePlan(
        path=plan.path,
        size=plan.size,
        url=match_column(names, (url_col,), "--url-col", plan.path),
        caption=match_column(names, (caption_col,), "--caption-col", plan.path),
        filter_cols=filter_cols,
        extra=tuple(match_column(names, (name,), "--extra-columns", plan.path) for name in extra_columns),
    )


def keep_mask(
    batch: pa.RecordBatch, plan: FilePlan, filters: Filters, dropped: Counter[str] | None
) -> pa.BooleanArray:
    """Rows passing every filter; `dropped` credits each removed row to the first filter failing it."""
    alive = pa.array([True] * batch.num_rows)
    for name, columns in plan.filter_cols:
        value = filters[name]
        values = batch.column(columns[0])
        for column in columns[1:]:  # the larger of the two sides; a null side drops the row
            values = pc.max_element_wise(values, batch.column(column), skip_nulls=False)
        passed = pc.greater_equal(values, value) if FILTERS[name][1] == ">=" else pc.less_equal(values, value)
        passed = pc.fill_null(passed, False)
        if dropped is not None:
            dropped[name] += pc.sum(pc.and_(alive, pc.invert(passed))).as_py() or 0
        alive = pc.and_(alive, passed)
    return alive
