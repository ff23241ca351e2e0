"""A world of one process on this node, as torchrun would describe it, for NeMo's inference in a job of one
process: its setup forces Lightning's TorchElasticEnvironment (parts/utils.py), which reads these, and
conversion's initialize_distributed reads RANK, WORLD_SIZE and MASTER_* (the samples job, DreamBooth's
regularization job). Stdlib only."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_process_world() -> dict[str, str]:
    return {
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }


def nemo_env() -> dict[str, str]:
    """This job's environment, a world of one process."""
    return {**os.environ, **one_process_world()}
