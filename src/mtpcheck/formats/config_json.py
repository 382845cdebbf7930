"""Read a model's config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mtpcheck.errors import ConfigError, InputError
from mtpcheck.formats.chunked_read import TEXT_FILE_BYTES, read_text_capped


def read_config(path: Path) -> dict[str, Any]:
    """Parse ``path`` as a JSON object; any failure is a :class:`ConfigError`."""
    try:  # a directory, a FIFO that would block, or gigabytes: refused before a byte is read
        text = read_text_capped(path, TEXT_FILE_BYTES)
    except InputError as e:
        raise ConfigError(path, f"cannot read config: {e.reason}") from e
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise ConfigError(path, f"invalid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(path, f"config is JSON {type(data).__name__}, expected an object")
    return data
