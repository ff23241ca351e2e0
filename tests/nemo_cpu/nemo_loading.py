"""Where NeMo's own loaders put each tensor of a state dict: NeMo's `_load_pretrained_model` (UNetModel's and
AutoencoderKL's, v2.0.0 / 2.4.1) run as is, its final dict caught on its way into the model.

NeMo renames keys, then copies some values to other keys (SDXL's upsampler, the GroupNorm index shift) and
leaves the source keys behind; its own missing/unexpected lists count names, not what was placed, and its
`mismatched` list stays empty (the constructor never passes ignore_mismatched_sizes). So the count here is by
tensor: each source tensor is a distinct object (meta tensors of the source's shapes, or real ones), and a
model key is filled when the object NeMo hands to the model under that key is one of them. Run in NeMo's
interpreter; torch is imported by the callers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Placement:
    """What NeMo's loader did with a state dict: `filled` {model key: source key}, and the counts."""

    filled: dict[str, str]
    missing: list[str]  # model keys that got no source tensor
    unexpected: list[str]  # source keys whose tensor went to no model key
    mismatched: list[str]  # model keys given a tensor of another shape
    duplicated: list[str]  # source keys placed at more than one model key
    # NeMo's own report: its missing and unexpected names, and error_msgs (size errors land there).
    nemo_missing: list[str] = field(default_factory=list)
    nemo_unexpected: list[str] = field(default_factory=list)
    nemo_errors: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "filled": len(self.filled),
            "missing": len(self.missing),
            "unexpected": len(self.unexpected),
            "mismatched": len(self.mismatched),
            "duplicated": len(self.duplicated),
            "nemo_missing": len(self.nemo_missing),
            "nemo_unexpected": len(self.nemo_unexpected),
            "nemo_errors": len(self.nemo_errors),
        }


def _root(tensor: Any) -> Any:
    """The tensor a view was taken of (NeMo's VAE unsqueezes attention weights): its own identity."""
    while getattr(tensor, "_base", None) is not None:
        tensor = tensor._base
    return tensor


def placed(model: Any, source: Mapping[str, Any], from_nemo: bool) -> Placement:
    """NeMo's `model._load_pretrained_model(source, from_NeMo=from_nemo)`, traced (see the module's text).
    `source` is not changed (NeMo is given a copy); the model is loaded as NeMo loads it."""
    origin = {id(_root(tensor)): key for key, tensor in source.items()}
    assert len(origin) == len(source), "each source tensor must be its own object"
    caught: dict[str, Any] = {}
    load = model._load_state_dict_into_model

    def catch(state_dict: dict[str, Any]) -> list[str]:
        caught.update(state_dict)
        return load(state_dict)

    model._load_state_dict_into_model = catch  # an instance attribute: NeMo's method still runs
    try:
        missing, unexpected, _, errors = model._load_pretrained_model(dict(source), from_NeMo=from_nemo)
    finally:
        del model._load_state_dict_into_model
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    filled: dict[str, str] = {}
    mismatched = []
    for key, shape in expected.items():
        source_key = origin.get(id(_root(caught[key]))) if key in caught else None
        if source_key is None:
            continue
        filled[key] = source_key
        if tuple(caught[key].shape) != shape:
            mismatched.append(key)
    used: dict[str, int] = {}
    for source_key in filled.values():
        used[source_key] = used.get(source_key, 0) + 1
    return Placement(
        filled=filled,
        missing=sorted(set(expected) - set(filled)),
        unexpected=sorted(set(source) - set(used)),
        mismatched=mismatched,
        duplicated=sorted(key for key, times in used.items() if times > 1),
        nemo_missing=sorted(missing),
        nemo_unexpected=sorted(unexpected),
        nemo_errors=list(errors),
    )


def parameters(state: Mapping[str, Any], keys: Any) -> int:
    """How many numbers the tensors `keys` of `state` hold."""
    return sum(state[key].numel() for key in keys)
