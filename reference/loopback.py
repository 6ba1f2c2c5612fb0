"""Loopback helpers for the servers the project starts on this machine: the simulator's
``ServerThread`` and ``auditor serve`` (``simulator/server.py``, ``auditor/cli/serve.py``), the demo's
``auditor serve`` subprocesses (``auditor/demo.py``) and the test servers.

Standard library only, so that every part that may import ``reference/`` (the simulator, the auditor; L1,
L2 in docs/ARCHITECTURE.md) can use it without loading torch.
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host`` (loopback by default), found by binding port 0.

    Raises:
        OSError: ``host`` cannot be bound (not an address of this machine).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
