"""The user's own hint images, one URL per source row: the hints job fetches each sample's hint from the
URL its .json carries (a source column that download_parquet's extra_columns kept and img2dataset saved)
and resizes it with img2dataset's own downloader and Resizer, as download_images fetched and resized the
image, so that hint and image line up pixel for pixel (a center crop of an image and of a hint of the same
size cut the same square). The URL policy of the images applies (data_prep.url_policy)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from data_prep.img2dataset_runner import imported
from data_prep.url_policy import refusal

FETCH_FAILED = "failed to download"
RESIZE_FAILED = "failed to resize"
# img2dataset's PNG "quality" is cv2's compression level (0-9); OpenCV's own default.
PNG_COMPRESSION = 1


@dataclass(frozen=True)
class FetchedHint:
    """How one sample's hint is fetched: the .json field naming its URL and download_images' settings."""

    column: str
    image_size: int
    resize_mode: str
    timeout: int
    retries: int
    user_agent_token: str | None
    disallowed_header_directives: tuple[str, ...]

    @cached_property
    def _resizer(self) -> Any:
        # img2dataset.main.download's own Resizer defaults, the PNG encoding aside.
        return imported("img2dataset.resizer").Resizer(
            image_size=self.image_size,
            resize_mode=self.resize_mode,
            resize_only_if_bigger=False,
            encode_format="png",
            encode_quality=PNG_COMPRESSION,
        )

    def url(self, meta: bytes | None) -> tuple[str | None, str | None]:
        """The hint's URL from a sample's .json, or why there is none."""
        if meta is None:
            return None, "no .json member"
        url = json.loads(meta).get(self.column)
        if not url:
            return None, f"no {self.column} in its .json"
        reason = refusal(url)
        return (None, f"URL refused ({reason})") if reason else (url, None)

    def __call__(self, members: dict[str, bytes]) -> tuple[bytes | None, str | None]:
        """The sample's hint as a PNG of the stored image's size, or None and the reason."""
        url, reason = self.url(members.get("json"))
        if url is None:
            return None, reason
        download = imported("img2dataset.downloader").download_image_with_retry
        _, stream, _ = download(
            (0, url),
            self.timeout,
            self.retries,
            self.user_agent_token,
            list(self.disallowed_header_directives),
        )
        if stream is None:
            return None, FETCH_FAILED
        with stream:
            png, *_, error = self._resizer(stream)
        return (png, None) if png is not None and error is None else (None, RESIZE_FAILED)
