"""Where data preparation writes and training reads: one place, derived from `data_dir`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class DataLayout:
    data_dir: PurePosixPath

    @property
    def demo_dir(self) -> PurePosixPath:
        return self.data_dir / "demo_source"

    @property
    def parquet_dir(self) -> PurePosixPath:
        return self.data_dir / "parquet"

    @property
    def raw_tar_dir(self) -> PurePosixPath:
        return self.data_dir / "tarfiles_raw"

    @property
    def source_tar_dir(self) -> PurePosixPath:
        """Bring-your-own tars, linked or copied by fetch_tars: `tars/NNNNNN.tar` + `tars.done.json`."""
        return self.data_dir / "tarfiles_source"

    @property
    def tar_dir(self) -> PurePosixPath:
        """NeMo's `webdataset.local_root_path`: wdinfo names tars relative to it."""
        return self.data_dir / "tarfiles_reorganized"

    @property
    def wdinfo(self) -> PurePosixPath:
        return self.tar_dir / "wdinfo.pkl"

    @property
    def latent_tar_dir(self) -> PurePosixPath:
        """Cached latents (data_preparation.precache): the same tar names, `<key>.pickle` members."""
        return self.data_dir / "tarfiles_latents"

    @property
    def latent_wdinfo(self) -> PurePosixPath:
        return self.latent_tar_dir / "wdinfo.pkl"
