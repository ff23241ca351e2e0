"""download_parquet on real parquet files: a local folder and hf:// through a fake Hub on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from coyo_standin import COYO_REPO, coyo_revision
from coyo_standin import write_repo as write_coyo_repo
from hf_fake_hub import FakeHub
from pd12m_standin import PD12M_REPO, pd12m_revision, write_repo

from data_prep import demo
from data_prep import download_parquet as dp
from launcher.cli import compose_config

REPO_ROOT = Path(__file__).resolve().parents[1]
FILE_ROWS = (500, 333, 71)  # uneven on purpose


def laion_like(rows: int, offset: int) -> pa.Table:
    """Columns named as in laion/laion-art; some null values in filter columns."""
    idx = range(offset, offset + rows)
    return pa.table(
        {
            "URL": [f"http://example.invalid/{i}.jpg" for i in idx],
            "TEXT": [None if i % 17 == 0 else f"caption {i}" for i in idx],
            "WIDTH": [None if i % 23 == 0 else (i * 37) % 800 for i in idx],
            "HEIGHT": [(i * 11) % 700 for i in idx],
            "punsafe": [((i * 7) % 100) / 100 for i in idx],
            "aesthetic": [4 + (i % 40) / 10 for i in idx],
        }
    )


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    folder = tmp_path / "source"
    (folder / "data").mkdir(parents=True)
    offset = 0
    for n, rows in enumerate(FILE_ROWS):
        pq.write_table(
            laion_like(rows, offset), folder / "data" / f"train-{n:05d}.parquet", row_group_size=100
        )
        offset += rows
    (folder / "README.md").write_text("not parquet\n")
    return folder


def all_rows(folder: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted(folder.rglob("*.parquet")))


def read_parts(out: Path) -> list[pa.Table]:
    return [pq.read_table(p) for p in sorted(out.glob("part-*.parquet"))]


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO_ROOT
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "data_prep.download_parquet", *args],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_local_folder_balanced_partitions_keep_every_row_in_order(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "parquet"
    manifest = dp.run(dp.Options(source=str(source), output_dir=out, num_partitions=7))
    parts = read_parts(out)
    sizes = [t.num_rows for t in parts]
    assert len(parts) == 7 and max(sizes) - min(sizes) <= 1
    assert [p["rows"] for p in manifest["partitions"]] == sizes
    merged = pa.concat_tables(parts)
    src = all_rows(source)
    assert merged.column_names == ["url", "caption"]
    assert merged.column("url").to_pylist() == src.column("URL").to_pylist()
    expected_captions = [c if c is not None else "" for c in src.column("TEXT").to_pylist()]
    assert merged.column("caption").to_pylist() == expected_captions
    assert manifest["rows_read"] == manifest["rows_kept"] == sum(FILE_ROWS)
    assert len(manifest["inputs"]["files"]) == len(FILE_ROWS)  # README.md not matched by *.parquet


def test_filters_drop_rows_and_count_them_per_filter(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "parquet"
    manifest = dp.run(
        dp.Options(
            source=str(source),
            output_dir=out,
            num_partitions=3,
            filters={"min_width": 200, "max_punsafe": 0.5},
        )
    )
    src = all_rows(source).to_pylist()
    wide = [r for r in src if r["WIDTH"] is not None and r["WIDTH"] >= 200]
    kept = [r for r in wide if r["punsafe"] <= 0.5]
    merged = pa.concat_tables(read_parts(out))
    assert merged.column("url").to_pylist() == [r["URL"] for r in kept]
    assert manifest["rows_dropped"] == {
        "min_width": len(src) - len(wide),
        "max_punsafe": len(wide) - len(kept),
    }
    assert manifest["rows_kept"] == len(kept)
    assert (
        max(manifest["partitions"], key=lambda p: p["rows"])["rows"]
        - min(p["rows"] for p in manifest["partitions"])
        <= 1
    )


def test_min_larger_side_keeps_rows_whose_width_or_height_reaches_it(source: Path, tmp_path: Path) -> None:
    """NVIDIA's resolution filter (method larger) on the source's columns, through the CLI as jobs run it."""
    out = tmp_path / "parquet"
    args = ["--source", str(source), "--output-dir", str(out), "--num-partitions", "2"]
    result = run_cli(*args, "--min-larger-side", "300")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    src = all_rows(source).to_pylist()
    kept = [
        r
        for r in src
        if r["WIDTH"] is not None and r["HEIGHT"] is not None and max(r["WIDTH"], r["HEIGHT"]) >= 300
    ]
    assert 0 < len(kept) < len(src)
    assert any(r["WIDTH"] < 300 for r in kept) and any(
        r["HEIGHT"] < 300 for r in kept
    )  # either side may be it
    assert pa.concat_tables(read_parts(out)).column("url").to_pylist() == [r["URL"] for r in kept]
    assert manifest["rows_dropped"] == {"min_larger_side": len(src) - len(kept)}
    assert manifest["columns"]["filters"] == {"min_larger_side": "WIDTH,HEIGHT"}


def test_column_names_match_case_insensitively(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"url": ["http://a/1", "http://a/2"], "text": ["one", "two"]}), src / "x.parquet")
    dp.run(dp.Options(source=str(src), output_dir=tmp_path / "out", num_partitions=2))
    assert [t.column("caption").to_pylist() for t in read_parts(tmp_path / "out")] == [["one"], ["two"]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--min-aesthetic", "5", "--max-pwatermark", "0.5"],
            "data_preparation.download_parquet.max_pwatermark (--max-pwatermark): no column pwatermark",
        ),
        (
            ["--caption-col", "caption_text"],
            "data_preparation.download_parquet.caption_col (--caption-col): no column caption_text",
        ),
    ],
)
def test_missing_column_is_a_clear_error(source: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = run_cli(
        "--source", str(source), "--output-dir", str(tmp_path / "o"), "--num-partitions", "2", *args
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert "available columns: URL, TEXT, WIDTH, HEIGHT, punsafe, aesthetic" in result.stderr


def test_bad_inputs_name_the_option(source: Path, tmp_path: Path) -> None:
    few = run_cli(
        "--source",
        str(source),
        "--output-dir",
        str(tmp_path / "o"),
        "--num-partitions",
        "5000",
        "--min-width",
        "790",
    )
    assert (
        few.returncode == 2 and "data_preparation.num_partitions (--num-partitions) 5000: only" in few.stderr
    )
    bad_source = run_cli(
        "--source", "not a repo", "--output-dir", str(tmp_path / "o"), "--num-partitions", "1"
    )
    assert (
        bad_source.returncode == 2
        and "data_preparation.download_parquet.source (--source) 'not a repo'" in bad_source.stderr
    )
    nothing = run_cli(
        "--source",
        str(source),
        "--output-dir",
        str(tmp_path / "o"),
        "--num-partitions",
        "1",
        "--pattern",
        "*.csv",
    )
    assert (
        nothing.returncode == 2
        and "no file matches data_preparation.download_parquet.pattern (--pattern) '*.csv'" in nothing.stderr
    )


def test_rerun_skips_and_changed_args_rewrite(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "parquet"
    args = ["--source", str(source), "--output-dir", str(out)]
    assert run_cli(*args, "--num-partitions", "5").returncode == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = run_cli(*args, "--num-partitions", "5")
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    fewer = run_cli(*args, "--num-partitions", "3")
    assert fewer.returncode == 0 and "nothing to do" not in fewer.stdout
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"] + [dp.part_name(i) for i in range(3)]
    assert sum(t.num_rows for t in read_parts(out)) == sum(FILE_ROWS)


def test_hf_repo_id_through_fake_hub_with_token_file(source: Path, tmp_path: Path) -> None:
    token = "hf_test_secret_value_123"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    out = tmp_path / "parquet"
    with FakeHub({"laion/laion-art": source}) as hub:
        result = run_cli(
            "--source",
            "laion/laion-art",
            "--output-dir",
            str(out),
            "--num-partitions",
            "4",
            "--pattern",
            "data/*.parquet",
            "--hf-token-file",
            str(token_file),
            "--min-aesthetic",
            "6",
            env={"HF_ENDPOINT": hub.url, "HF_TOKEN": ""},
            cwd=tmp_path,
        )
        requests = list(hub.requests)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["source"] == "hf://datasets/laion/laion-art"
    assert [Path(f["path"]).name for f in manifest["inputs"]["files"]] == [
        f"train-{n:05d}.parquet" for n in range(3)
    ]
    expected = [r["URL"] for r in all_rows(source).to_pylist() if r["aesthetic"] >= 6]
    assert pa.concat_tables(read_parts(out)).column("url").to_pylist() == expected
    assert any(path.startswith("/datasets/laion/laion-art/resolve/") for _, path, _ in requests)
    # Every dataset route carries the token (huggingface_hub may also ask for unrelated public routes).
    assert {auth for _, path, auth in requests if "/laion/" in path} == {f"Bearer {token}"}
    assert token not in result.stdout + result.stderr + (out / "manifest.json").read_text()


def test_hf_url_with_env_token_and_unknown_repo(source: Path, tmp_path: Path) -> None:
    with FakeHub({"laion/laion-art": source}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_env_token"}
        ok = run_cli(
            "--source",
            "hf://datasets/laion/laion-art/data",
            "--output-dir",
            str(tmp_path / "a"),
            "--num-partitions",
            "2",
            env=env,
        )
        missing = run_cli(
            "--source",
            "hf://datasets/laion/nope",
            "--output-dir",
            str(tmp_path / "b"),
            "--num-partitions",
            "2",
            env=env,
        )
        auths = {auth for _, path, auth in hub.requests if "/laion/laion-art" in path}
    assert ok.returncode == 0, ok.stderr
    assert sum(t.num_rows for t in read_parts(tmp_path / "a")) == sum(FILE_ROWS)
    assert auths == {"Bearer hf_env_token"}
    assert missing.returncode == 2 and "cannot list datasets/laion/nope" in missing.stderr


def test_max_rows_keeps_the_first_rows_after_filters_and_stops_reading(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "parquet"
    args = ["--source", str(source), "--output-dir", str(out), "--num-partitions", "4", "--min-width", "200"]
    result = run_cli(*args, "--max-rows", "290")
    assert result.returncode == 0, result.stderr
    wide = [r["URL"] for r in all_rows(source).to_pylist() if r["WIDTH"] is not None and r["WIDTH"] >= 200]
    parts = read_parts(out)
    assert pa.concat_tables(parts).column("url").to_pylist() == wide[:290]
    assert [t.num_rows for t in parts] == [73, 73, 72, 72]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rows_kept"] == 290 and manifest["inputs"]["max_rows"] == 290
    assert manifest["rows_read"] == FILE_ROWS[0]  # 290 wide rows are in the first file: the others unread
    assert "keeping the first 290 rows that pass the filters (read 1 of 3 file(s))" in result.stdout
    more = run_cli(*args, "--max-rows", "600")  # across a file boundary, and a changed limit rewrites
    assert more.returncode == 0 and "nothing to do" not in more.stdout
    assert pa.concat_tables(read_parts(out)).column("url").to_pylist() == wide[:600]
    bad = run_cli(*args, "--max-rows", "0")
    assert bad.returncode == 2 and "--max-rows must be >= 1, got 0" in bad.stderr


@pytest.fixture()
def pd12m_repo(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    demo.generate(tmp_path / "demo", num_images=90, seed=5)
    rows = write_repo(tmp_path / "pd12m", tmp_path / "demo", "http://127.0.0.1:9", files=3)
    return tmp_path / "pd12m", rows


def test_pd12m_at_its_pinned_revision_with_the_presets_options(
    pd12m_repo: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The preset's source, revision, pattern, columns and size filter, through a PD12M-shaped fake Hub."""
    # Composed as a launch composes it: the size filters follow the training preset's resolution.
    preset = compose_config(["cluster=aws_p5", "cluster.shared_dir=/fsx"]).data_preparation.download_parquet
    folder, rows = pd12m_repo
    revision = pd12m_revision()
    out = tmp_path / "parquet"
    with FakeHub({PD12M_REPO: folder}, revisions={PD12M_REPO: revision}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": ""}
        result = run_cli(
            "--source",
            preset.source,
            "--revision",
            preset.revision,
            "--pattern",
            preset.pattern,
            "--url-col",
            preset.url_col,
            "--caption-col",
            preset.caption_col,
            "--min-width",
            str(preset.min_width),
            "--min-height",
            str(preset.min_height),
            "--output-dir",
            str(out),
            "--num-partitions",
            "3",
            env=env,
        )
        paths = [path for _, path, _ in hub.requests]
        wrong = run_cli(
            "--source",
            PD12M_REPO,
            "--revision",
            "1" * 40,
            "--output-dir",
            str(tmp_path / "w"),
            "--num-partitions",
            "1",
            env=env,
        )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["source"] == f"hf://datasets/{PD12M_REPO}@{revision}"
    assert [f["path"].split("/", 3)[-1] for f in manifest["inputs"]["files"]] == [
        f"metadata/pd12m.{n:03d}.parquet" for n in range(3)
    ]  # embeddings/*.parquet left out
    narrow = [r for r in rows if r["width"] < 256]
    big = [r for r in rows if r["width"] >= 256 and r["height"] >= 256]
    assert 0 < len(big) < len(rows)
    merged = pa.concat_tables(read_parts(out))
    assert merged.column("url").to_pylist() == [r["url"] for r in big]
    assert merged.column("caption").to_pylist() == [r["caption"] for r in big]
    assert manifest["rows_dropped"] == {
        "min_width": len(narrow),
        "min_height": len(rows) - len(big) - len(narrow),
    }
    revisions_read = {m[1] for p in paths if (m := re.search(r"/(?:tree|resolve)/([^/?]+)", p))}
    assert revisions_read == {revision}  # never main
    assert wrong.returncode == 2 and "cannot list" in wrong.stderr and "1" * 40 in wrong.stderr


def _preset_args(name: str) -> list[str]:
    """download_parquet's options as a launch composes the preset (filters that are null left out)."""
    overrides = ["cluster=aws_p5", "cluster.shared_dir=/fsx", f"data_preparation={name}"]
    preset = compose_config(overrides).data_preparation.download_parquet
    args = ["--source", preset.source, "--revision", preset.revision, "--pattern", preset.pattern]
    args += ["--url-col", preset.url_col, "--caption-col", preset.caption_col]
    for key in (
        "min_width",
        "min_height",
        "min_larger_side",
        "max_punsafe",
        "max_pwatermark",
        "min_aesthetic",
    ):
        if preset.get(key) is not None:
            args += ["--" + key.replace("_", "-"), str(preset[key])]
    return args


def test_coyo700m_at_its_pinned_revision_with_the_presets_filters(tmp_path: Path) -> None:
    """The preset's source, commit, pattern, columns and its size, NSFW and watermark filters on
    COYO's own column names, through a COYO-shaped fake Hub (the real huggingface_hub client)."""
    demo.generate(tmp_path / "demo", num_images=120, seed=11)
    rows = write_coyo_repo(tmp_path / "coyo", tmp_path / "demo", "http://127.0.0.1:9", files=3)
    revision, out = coyo_revision(), tmp_path / "parquet"
    with FakeHub({COYO_REPO: tmp_path / "coyo"}, revisions={COYO_REPO: revision}) as hub:
        result = run_cli(
            *_preset_args("coyo700m"),
            "--output-dir",
            str(out),
            "--num-partitions",
            "4",
            env={"HF_ENDPOINT": hub.url, "HF_TOKEN": ""},
        )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["source"] == f"hf://datasets/{COYO_REPO}@{revision}"
    assert [f["path"].rsplit("/", 1)[-1] for f in manifest["inputs"]["files"]] == [
        f"part-{n:05d}-17da4908-939c-46e5-91d0-15f256041956-c000.snappy.parquet" for n in range(3)
    ]  # data/_SUCCESS left out

    def passes(r: dict[str, Any]) -> bool:
        nsfw = r["nsfw_score_opennsfw2"]
        return (
            r["width"] >= 256
            and r["height"] >= 256
            and nsfw is not None
            and nsfw <= 0.1
            and r["watermark_score"] <= 0.5
        )

    kept = [r for r in rows if passes(r)]
    assert 0 < len(kept) < len(rows) / 2
    merged = pa.concat_tables(read_parts(out))
    assert merged.column("url").to_pylist() == [r["url"] for r in kept]
    assert merged.column("caption").to_pylist() == [r["text"] for r in kept]
    dropped = manifest["rows_dropped"]
    assert set(dropped) == {"min_width", "min_height", "max_punsafe", "max_pwatermark"}
    assert sum(dropped.values()) == len(rows) - len(kept) and dropped["max_punsafe"] > 0


def test_revision_is_refused_for_a_source_without_revisions(source: Path, tmp_path: Path) -> None:
    result = run_cli(
        "--source",
        str(source),
        "--revision",
        "abc",
        "--output-dir",
        str(tmp_path / "o"),
        "--num-partitions",
        "1",
    )
    assert result.returncode == 2
    assert (
        "data_preparation.download_parquet.revision (--revision) abc: only a Hugging Face dataset"
        in result.stderr
    )
