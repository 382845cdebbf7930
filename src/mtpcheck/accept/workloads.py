"""Workload files: JSONL records (``text`` or chat ``messages``) or plain text, tokenised.

* ``*.jsonl`` / ``*.ndjson`` / ``*.json``: one JSON object per line, with a ``text`` string or
  a ``messages`` list (``[{"role": ..., "content": ...}]``). Messages are rendered with the
  tokenizer's chat template when it has one, else their contents are joined by blank lines.
* anything else: plain text, one sequence per block of lines separated by blank lines.

Texts are tokenised with the tokenizer's special tokens (e.g. BOS); rendered chat templates
already carry theirs. Each sequence is cut to ``max_tokens``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpcheck.errors import InputError, raised_by_us

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


@dataclass(frozen=True)
class Workload:
    """One named workload, tokenised: token ids per sequence."""

    name: str
    path: str
    sequences: tuple[tuple[int, ...], ...]


def _messages(value: Any, path: Path, line: int) -> list[dict[str, str]]:
    ok = isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in value
    )
    if not ok or not value:
        raise InputError(
            path, f"line {line}: 'messages' must be a non-empty list of {{role, content}} objects"
        )
    return [{"role": str(m.get("role", "user")), "content": m["content"]} for m in value]


def read_records(path: Path) -> list[str | list[dict[str, str]]]:
    """Texts and message lists of a workload file, in order."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise InputError(path, "no such file or directory") from e
    except IsADirectoryError as e:
        raise InputError(path, "is a directory; expected a JSONL or text file") from e
    except UnicodeDecodeError as e:
        raise InputError(path, "not UTF-8 text") from e
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    if path.suffix.lower() not in JSONL_SUFFIXES:
        blocks = re.split(r"\n[ \t]*\n", raw.replace("\r\n", "\n"))
        return [b.strip() for b in blocks if b.strip()]
    records: list[str | list[dict[str, str]]] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(path, f"line {number}: not JSON ({e.msg})") from e
        if not isinstance(obj, dict):
            raise InputError(path, f"line {number}: expected a JSON object")
        if isinstance(obj.get("text"), str):
            records.append(obj["text"])
        elif "messages" in obj:
            records.append(_messages(obj["messages"], path, number))
        else:
            raise InputError(path, f"line {number}: no 'text' string and no 'messages' list")
    return records


def tokenise(
    name: str, path: Path, tokenizer: Any, max_tokens: int, records: list[Any] | None = None
) -> Workload:
    """Tokenise a workload file with a transformers tokenizer; sequences cut to ``max_tokens``."""
    records = read_records(path) if records is None else records
    if not records:
        raise InputError(path, "workload holds no text")
    template = getattr(tokenizer, "chat_template", None)
    sequences = []
    for record in records:
        if isinstance(record, str):
            ids = tokenizer(record, add_special_tokens=True)["input_ids"]
        elif template:
            rendered = tokenizer.apply_chat_template(record, tokenize=False)
            ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        else:
            joined = "\n\n".join(m["content"] for m in record)
            ids = tokenizer(joined, add_special_tokens=True)["input_ids"]
        sequences.append(tuple(int(i) for i in ids[:max_tokens]))
    return Workload(name=name, path=str(path), sequences=tuple(sequences))


def load_tokenizer(directory: Path) -> Any:
    """``AutoTokenizer`` from a local folder, offline; an unreadable one is an InputError."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as e:  # transformers raises OSError, ValueError, KeyError, ...
        if raised_by_us(e):  # a bug of mtpcheck's own, not the library's refusal
            raise
        # transformers' messages run over several lines; keep them whole, on one line
        reason = " ".join(str(e).split()) or type(e).__name__
        if len(reason) > 300:
            reason = reason[:297] + "..."
        raise InputError(
            directory,
            f"no tokenizer that AutoTokenizer can load offline ({reason}); "
            "point --tokenizer DIR at the folder that holds the model's tokenizer files",
        ) from e
