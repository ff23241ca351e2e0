"""One cached-latent sample exactly as NeMo v2.0.0's precached Stable Diffusion dataset reads it.

NeMo (`build_train_valid_precached_datasets`, nemo/collections/multimodal/data/stable_diffusion/
stable_diffusion_dataset.py) reads each sample's `<key>.pickle` member, which webdataset unpickles, and
maps two fixed keys to tensors with `torch.tensor(...)`:
- `autoencoderkl_image`: the VAE's moments (mean and log-variance), [2 x embed_dim, H/8, W/8]; training
  wraps them in DiagonalGaussianDistribution and draws a fresh sample every step (ldm/ddpm.py get_input).
- `clip-vit-large-patch14_text`: the text encoder's output, passed as is: FrozenCLIPEmbedder's (SD 1.x)
  [77 padded to 80, 768], or FrozenOpenCLIPEmbedder's (SD 2.0) [77, 1024] under the same hard-coded name.
The training keys must then end in `encoded` (not `clip_encoded`, another builder): NeMo's docs
(docs/source/multimodal/text2img/sd.rst) use image_encoded / captions_encoded.

Stored dtype: float16, the smallest float numpy has (torch.tensor needs a numpy dtype, so no bfloat16 or
float8). Training itself runs the VAE and CLIP under bf16 autocast (8 mantissa bits); float16 keeps 11,
so storing it rounds less than training's own pass does, and the range (|x| < 65504) holds every moment
(NeMo clamps log-variance to [-30, 20]) and CLIP hidden state. Anything smaller would change training.

Arrays are pickled as `numpy.ndarray(shape, dtype, buffer)`, not numpy's own reduction: numpy 2 writes
`numpy._core...` there, which the container's numpy 1.x cannot import. This form loads under both and
its bytes depend only on the values (deterministic output). Needs numpy only (no torch).
"""

from __future__ import annotations

import io
import math
import pickle
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where arrays are made: planning (sample_bytes) never loads it
    import numpy as np

IMAGE_KEY = "autoencoderkl_image"
TEXT_KEY = "clip-vit-large-patch14_text"
MEMBER_EXT = "pickle"
STORED_DTYPE = "<f2"
# What the encode switch sets in the training config (NeMo's docs' names).
FIRST_STAGE_KEY = "image_encoded"
COND_STAGE_KEY = "captions_encoded"
LATENT_KEY_SUFFIXES = ("encoded", "moments")
PICKLE_PROTOCOL = 4
# FrozenCLIPEmbedder pads max_length tokens up to a multiple of 8; FrozenOpenCLIPEmbedder tokenizes with
# open_clip.tokenize, whose context length is 77 whatever max_length says (NeMo v2.0.0 encoders/modules.py).
TEXT_PAD = 8
OPEN_CLIP_CLASS = "FrozenOpenCLIPEmbedder"
OPEN_CLIP_TOKENS = 77
_TAR_BLOCK = 512
# What a sample's pickle holds besides the arrays' bytes (keys, global, shapes, dtype, frame headers):
# 130-155 bytes for the shapes training uses; tests/test_precache_config.py checks the bound.
PICKLE_OVERHEAD_MAX = 256


class EncodeError(Exception):
    """The inputs cannot be encoded as asked; the message names the file or option."""


def _reduce_array(array: np.ndarray) -> tuple[Any, tuple[Any, ...]]:
    import numpy as np

    contiguous = np.ascontiguousarray(array)
    return np.ndarray, (contiguous.shape, contiguous.dtype.str, contiguous.tobytes())


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        import numpy as np

        return _reduce_array(obj) if type(obj) is np.ndarray else NotImplemented


def dumps_arrays(arrays: dict[str, np.ndarray], dtype: str) -> bytes:
    """A `.pickle` member: the dict of arrays, each stored as `dtype` (a numpy dtype string)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=PICKLE_PROTOCOL).dump({key: a.astype(dtype) for key, a in arrays.items()})
    return buffer.getvalue()


def dumps_sample(moments: np.ndarray, text: np.ndarray) -> bytes:
    """The `.pickle` member of one SD sample; arrays stored as float16."""
    return dumps_arrays({IMAGE_KEY: moments, TEXT_KEY: text}, STORED_DTYPE)


def is_latent_key(key: str) -> bool:
    """NeMo's own test (ddpm.py build_train_valid_test_datasets): such a key reads `.pickle` members."""
    return str(key).endswith(LATENT_KEY_SUFFIXES)


def uses_open_clip(model: Any) -> bool:
    """The config's text encoder is NeMo's OpenCLIP one (SD 2.0; its weights are the open_clip asset)."""
    target = str((model.get("cond_stage_config") or {}).get("_target_", ""))
    return target.rsplit(".", 1)[-1] == OPEN_CLIP_CLASS


def text_tokens(model: Any) -> int:
    """Tokens per caption in the text embedding the config's encoder returns."""
    if uses_open_clip(model):
        return OPEN_CLIP_TOKENS
    max_length = int((model.get("cond_stage_config") or {}).get("max_length", 77))
    return (max_length + TEXT_PAD - 1) // TEXT_PAD * TEXT_PAD


def moments_shape(embed_dim: int, height: int, width: int, downsampling: int) -> tuple[int, int, int]:
    return (2 * embed_dim, height // downsampling, width // downsampling)


def pickle_member_bytes(values: int, itemsize: int) -> int:
    """At most the bytes a `.pickle` member of `values` numbers takes in a tar: its 512-byte header plus
    the pickle (the arrays and PICKLE_OVERHEAD_MAX), padded to the tar block. Arithmetic, no numpy."""
    size = itemsize * values + PICKLE_OVERHEAD_MAX
    return _TAR_BLOCK + (size + _TAR_BLOCK - 1) // _TAR_BLOCK * _TAR_BLOCK


def sample_bytes(moments: tuple[int, ...], text: tuple[int, ...]) -> int:
    """At most the bytes one SD sample takes in a latent tar (float16 moments and text)."""
    return pickle_member_bytes(math.prod(moments) + math.prod(text), 2)


# -- shapes a training config implies (a DictConfig or a dict: both have .get) ----------------------


def crop_size(model: Any) -> tuple[int, int] | None:
    """(H, W) of training's center crop (NeMo splits "H, W"), None when absent or unreadable."""
    raw = (model.get("data", {}).get("train", {}).get("augmentations") or {}).get("center_crop_h_w")
    try:
        height, width = (int(part) for part in str(raw).split(","))
    except ValueError:
        return None
    return height, width


def downsampling(model: Any) -> int:
    """The VAE's spatial factor: 2 per level after the first (AutoencoderKL Encoder)."""
    levels = len(model.get("first_stage_config", {}).get("ddconfig", {}).get("ch_mult", [1, 2, 4, 4]))
    return 2 ** (levels - 1)


def sample_shapes(model: Any) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """(moments, text) shapes of one stored sample for this training config (checked valid)."""
    height, width = crop_size(model) or (0, 0)
    embed_dim = int(model.get("first_stage_config", {}).get("embed_dim", 4))
    moments = moments_shape(embed_dim, height, width, downsampling(model))
    text = (text_tokens(model), int(model.get("unet_config", {}).get("context_dim", 768)))
    return moments, text
