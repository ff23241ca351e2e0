"""What img2dataset writes into each sample's .json itself, stdlib only (the planner checks
data_preparation.download_parquet.extra_columns against it without importing pyarrow)."""

# The fields img2dataset 1.47.0 writes into each sample's .json itself: its save_additional_columns refuses
# them (img2dataset/main.py, arguments_validator).
RESERVED_COLUMNS = frozenset(
    {
        "key",
        "caption",
        "url",
        "width",
        "height",
        "original_width",
        "original_height",
        "status",
        "error_message",
        "exif",
        "md5",
        "sha256",
        "sha512",
    }
)
