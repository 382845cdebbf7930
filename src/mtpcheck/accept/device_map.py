"""``accept --device-map``: the main model spread over devices by accelerate, for models that
fit one node but not one device (transformers' ``device_map``; ``disk`` offloads to a
temporary folder)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from mtpcheck.errors import InputError, MtpcheckError

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
"""accelerate's own placements, passed through by name."""


def resolve_device_map(spec: str | None) -> str | dict[str, Any] | None:
    """``spec``: one of :data:`STRATEGIES`, or a JSON file mapping module names to a device
    (``"cpu"``, ``"disk"``, ``"cuda:1"`` or a GPU index); None: no map. accelerate must be
    installed (``pip install 'mtpcheck[accelerate]'``)."""
    if spec is None:
        return None
    if importlib.util.find_spec("accelerate") is None:
        raise MtpcheckError(
            "--device-map needs accelerate, which is not installed: "
            "pip install 'mtpcheck[accelerate]'"
        )
    if spec in STRATEGIES:
        return spec
    path = Path(spec)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(path, f"invalid JSON ({e})") from e
    if not isinstance(value, dict) or not value:
        raise InputError(path, "a device map is a JSON object of module name -> device")
    for module, device in value.items():
        if not (isinstance(device, str) or (isinstance(device, int) and device >= 0)):
            raise InputError(path, f"{module!r}: device {device!r} is not a name or a GPU index")
    return value
