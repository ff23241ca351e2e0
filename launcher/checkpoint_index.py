"""A torch checkpoint read as one on the login node: its state_dict's tensor names and shapes, no tensor loaded.

`torch.save` writes a zip archive: `<archive>/data.pkl`, the pickled object, in which each tensor is a call
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` whose storage is a persistent id
naming the archive member `<archive>/data/<key>` that holds its bytes. Here the zip's index is read, then
the pickle with an Unpickler that imports nothing: a tensor becomes its shape, every other class a stand-in
that takes whatever the pickle gives it, and no storage is ever opened. So a multi-GB NeMo checkpoint is
judged by reading its small data.pkl (hyper-parameters and optimizer states included), without torch,
which the launcher's venv does not have, and without running any code the file names.

torch's legacy format (`torch.save(..., _use_new_zipfile_serialization=False)`, which torch.load and the
init job still read) is a stream of pickles: a magic number, the protocol, the system's info, then the
same object pickle, then the storages' bytes; the object pickle is read the same way.

A truncated file (no zip index), a file that is neither a zip nor the legacy stream, a zip without data.pkl
or whose pickle does not read, and a pickle without a `state_dict` mapping raise NotACheckpoint with the reason.
"""

from __future__ import annotations

import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple


class NotACheckpoint(Exception):
    """The file is not a torch checkpoint holding a state_dict; the message says why."""


class Tensor(NamedTuple):
    """A tensor as data.pkl describes it: its shape (its storage is never read)."""

    shape: tuple[int, ...]


class _Stub:
    """Any object of a class the pickle names: built, filled and set up as the pickle asks, then ignored."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Stub:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:  # a dict subclass's items
        pass

    def append(self, value: Any) -> None:  # a list subclass's items
        pass

    def extend(self, values: Any) -> None:
        pass


def _tensor(storage: Any, offset: Any, size: Any, *rest: Any) -> Tensor:
    # _rebuild_tensor, _rebuild_tensor_v2 and _rebuild_tensor_v3 all take the size third.
    return Tensor(tuple(int(n) for n in size))


def _parameter(data: Any, *rest: Any) -> Any:
    return data


def _from_type(func: Callable[..., Any], new_type: Any, args: Any, state: Any) -> Any:
    return func(*args)  # a Tensor subclass: the tensor it wraps (func is one of the functions above)


# The only callables the pickle may reach: torch's tensor rebuilders, answered with shapes, and the
# OrderedDict a state_dict is. Everything else is a _Stub.
_KNOWN: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor"): _tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _tensor,
    ("torch._utils", "_rebuild_parameter"): _parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _parameter,
    ("torch._tensor", "_rebuild_from_type"): _from_type,
    ("torch._tensor", "_rebuild_from_type_v2"): _from_type,
    ("collections", "OrderedDict"): OrderedDict,
}


class _Index(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _KNOWN.get((module, name), _Stub)

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return None  # the storage: never read


def _data_pkl(archive: zipfile.ZipFile) -> str:
    found = [name for name in archive.namelist() if name.endswith("/data.pkl") and name.count("/") == 1]
    if len(found) != 1:
        raise NotACheckpoint("a zip archive without the one <archive>/data.pkl torch.save writes")
    return found[0]


# torch/serialization.py: the first pickle of a legacy file, and the protocol version that follows it.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


def _legacy(path: Path) -> Any:
    """The object of a file in torch's legacy format, or None when it does not start like one."""
    with path.open("rb") as stream:
        try:
            if _Index(stream).load() != LEGACY_MAGIC:
                return None
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, OverflowError):
            return None  # any other bytes: said as not a zip below
        if _Index(stream).load() != LEGACY_PROTOCOL:
            raise NotACheckpoint("torch's legacy format with an unknown protocol version")
        _Index(stream).load()  # the saving system's info (endianness, type sizes)
        return _Index(stream).load()


def read(path: Path) -> Any:
    """The object data.pkl holds (or a legacy file's object pickle), every tensor as a Tensor (its shape)."""
    try:
        if not zipfile.is_zipfile(path) and (loaded := _legacy(path)) is not None:
            return loaded
        with zipfile.ZipFile(path) as archive, archive.open(_data_pkl(archive)) as pkl:
            return _Index(pkl).load()
    except NotACheckpoint:
        raise
    except OSError as error:
        raise NotACheckpoint(f"cannot be read: {error.strerror or error}") from None
    except (zipfile.BadZipFile, NotImplementedError) as error:
        raise NotACheckpoint(
            f"not a torch checkpoint (a zip archive, or torch's legacy pickle stream): {error}"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as error:
        raise NotACheckpoint(f"its data.pkl does not read as a torch pickle: {error}") from None


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The shapes of the tensors of the checkpoint's `state_dict`, by name."""
    loaded = read(path)
    state = loaded.get("state_dict") if isinstance(loaded, dict) else None
    if not isinstance(state, dict):
        raise NotACheckpoint("a torch file without a state_dict mapping: not a training checkpoint")
    return {str(name): value.shape for name, value in state.items() if isinstance(value, Tensor)}
