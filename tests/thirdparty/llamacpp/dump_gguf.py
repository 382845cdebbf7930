"""Dump GGUF files with llama.cpp's gguf-py (``gguf.GGUFReader``) into one JSON document.

    python dump_gguf.py OUT.json FILE.gguf [FILE.gguf ...]

Per file: every metadata key with its GGUF value type and value (arrays whose key starts with
``tokenizer.`` are given as their length and first items only), every tensor (name, type name,
shape in GGUF/ggml order ``ne[0..]``, element count, byte count, data offset relative to the
data section and absolute), and a ``highlights`` section: the ``*.nextn_predict_layers`` key(s),
the ``blk.N.nextn.*`` tensors, every tensor of those nextn blocks, and the expert tensors
(``*_exps`` / ``*_shexp``).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

ARRAY_PREVIEW = 8


def field_value(field):  # type: ignore[no-untyped-def]
    if not field.types:
        return None
    if field.types[0] == GGUFValueType.ARRAY:
        vals = field.contents()
        return [v.item() if isinstance(v, np.generic) else v for v in vals]
    v = field.contents()
    return v.item() if isinstance(v, np.generic) else v


def dump_file(path: Path) -> dict:
    reader = GGUFReader(str(path), "r")
    meta = []
    for name, field in reader.fields.items():
        types = [t.name for t in field.types]
        entry: dict = {"key": name, "type": types[0] if types else None}
        if len(types) > 1:
            entry["elem_type"] = types[1]
        try:
            value = field_value(field)
        except Exception as exc:  # noqa: BLE001 - keep dumping the rest
            entry["error"] = repr(exc)
            meta.append(entry)
            continue
        if isinstance(value, list):
            entry["len"] = len(value)
            if name.startswith("tokenizer.") and len(value) > ARRAY_PREVIEW:
                entry["first"] = value[:ARRAY_PREVIEW]
                entry["truncated"] = True
            else:
                entry["value"] = value
        else:
            entry["value"] = value
        meta.append(entry)

    tensors = [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "shape": [int(x) for x in t.shape],
            "n_elements": int(t.n_elements),
            "n_bytes": int(t.n_bytes),
            "offset": int(t.data_offset) - int(reader.data_offset),
            "abs_offset": int(t.data_offset),
        }
        for t in reader.tensors
    ]

    nextn_keys = {m["key"]: m.get("value") for m in meta if "nextn" in m["key"]}
    nextn_tensors = [
        t["name"] for t in tensors if ".nextn." in t["name"] or t["name"].startswith("nextn.")
    ]
    nextn_blocks = sorted(
        {int(m.group(1)) for n in nextn_tensors if (m := re.match(r"blk\.(\d+)\.", n))}
    )
    arch = next((m["value"] for m in meta if m["key"] == "general.architecture"), None)
    block_count = next((m["value"] for m in meta if m["key"] == f"{arch}.block_count"), None)
    blocks = sorted(
        {int(m.group(1)) for t in tensors if (m := re.match(r"blk\.(\d+)\.", t["name"]))}
    )
    return {
        "file": path.name,
        "size": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "gguf_version": next((m["value"] for m in meta if m["key"] == "GGUF.version"), None),
        "architecture": arch,
        "n_metadata": len(meta),
        "n_tensors": len(tensors),
        "highlights": {
            "block_count": block_count,
            "blocks_with_tensors": blocks,
            "nextn_keys": nextn_keys,
            "nextn_tensors": nextn_tensors,
            "nextn_blocks": nextn_blocks,
            "nextn_block_tensors": [
                t["name"]
                for t in tensors
                if any(t["name"].startswith(f"blk.{b}.") for b in nextn_blocks)
            ],
            "expert_tensors": [
                f"{t['name']} {t['type']} {t['shape']}"
                for t in tensors
                if re.search(r"_(exps|shexp|chexps)\b|exp_probs", t["name"])
            ],
            "non_block_tensors": [t["name"] for t in tensors if not t["name"].startswith("blk.")],
        },
        "metadata": meta,
        "tensors": tensors,
    }


def main() -> None:
    out = Path(sys.argv[1])
    files = [Path(p) for p in sys.argv[2:]]
    doc = {"reader": "gguf.GGUFReader", "files": [dump_file(p) for p in files]}
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
