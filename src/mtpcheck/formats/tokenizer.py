"""The token table of a local checkpoint's ``tokenizer.json`` (Hugging Face tokenizers): what a
drafter and its target must share, since vLLM never loads a drafter's tokenizer and a drafter
trained on another table with the same size loads silently."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mtpcheck.errors import InputError
from mtpcheck.formats.chunked_read import TEXT_FILE_BYTES, read_text_capped

FILE = "tokenizer.json"


def token_table(folder: str) -> str | None:
    """A digest of the tokenizer's model (vocabulary, merges) and added tokens; None where the
    checkpoint is no local folder or ships no ``tokenizer.json``."""
    path = Path(folder) / FILE
    if not Path(folder).is_dir() or not path.is_file():
        return None
    try:
        parsed = json.loads(read_text_capped(path, TEXT_FILE_BYTES))
    except (ValueError, RecursionError) as e:
        raise InputError(path, f"not a tokenizer: {e}") from None
    if not isinstance(parsed, dict):
        raise InputError(path, "not a tokenizer: not a JSON object")
    table = {"model": parsed.get("model"), "added_tokens": parsed.get("added_tokens")}
    canonical = json.dumps(table, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(canonical).hexdigest()
