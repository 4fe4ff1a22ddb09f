"""The backend a rank's default process group runs on, as the rank metadata records it.

Its own module because both the activation (imported in every process of the job, so kept
light) and the rank agent need it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["default_backend"]


def default_backend(dist: Any) -> str:
    """The default group's backend. `dist.get_backend()` says "undefined" when the group was
    made without naming one (`init_device_mesh`, `init_process_group()` with no backend); the
    group itself still knows what it runs on ("gloo", or "cpu:gloo,cuda:nccl")."""
    name = str(dist.get_backend())
    if name != "undefined":
        return name
    try:
        return str(dist.group.WORLD._get_backend_name())
    except Exception:  # noqa: BLE001 - a private API: older torch may lack it
        pass
    try:
        return str(dist.get_backend_config())
    except Exception:  # noqa: BLE001
        return name
