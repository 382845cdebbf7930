"""Read a model's config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mtpcheck.errors import ConfigError


def read_config(path: Path) -> dict[str, Any]:
    """Parse ``path`` as a JSON object; any failure is a :class:`ConfigError`."""
    if path.exists() and not path.is_file():  # a directory, or a FIFO that would block
        raise ConfigError(path, "cannot read config: not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(path, f"cannot read config: {reason}") from e
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise ConfigError(path, f"invalid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(path, f"config is JSON {type(data).__name__}, expected an object")
    return data
