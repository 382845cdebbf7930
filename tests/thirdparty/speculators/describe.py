"""Prints each case's tensors from the safetensors headers (name, dtype, shape) and, with
a target given, which of them are bit-identical to the target's tensor of the same or the
drafter-equivalent name (embed_tokens.weight <-> model.embed_tokens.weight, lm_head.weight).

    python describe.py CASE_DIR... [--target TARGET_DIR]
"""

import json
import struct
import sys
from pathlib import Path


def header(path: Path) -> dict:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def tensors(case: Path) -> dict:
    out = {}
    for f in sorted(case.glob("*.safetensors")):
        h = header(f)
        h.pop("__metadata__", None)
        for name, info in h.items():
            out[name] = (f, info)
    return out


def raw(f: Path, info: dict) -> bytes:
    with f.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        start, end = info["data_offsets"]
        fh.seek(8 + n + start)
        return fh.read(end - start)


def main(argv: list[str]) -> None:
    target = None
    if "--target" in argv:
        i = argv.index("--target")
        target = tensors(Path(argv[i + 1]))
        argv = argv[:i] + argv[i + 2 :]
    for case in map(Path, argv):
        ts = tensors(case)
        size = sum(p.stat().st_size for p in case.iterdir())
        print(f"== {case.name} ({len(ts)} tensors, {size} bytes in the folder)")
        for name, (f, info) in sorted(ts.items()):
            note = ""
            if target is not None:
                twin = target.get(name) or target.get(f"model.{name}")
                if twin is not None and twin[1]["shape"] == info["shape"]:
                    same = twin[1]["dtype"] == info["dtype"] and raw(*twin) == raw(f, info)
                    note = "  = target" if same else "  != target"
            shape = "[" + ", ".join(map(str, info["shape"])) + "]"
            print(f"  {name} {info['dtype']}{shape}{note}")


if __name__ == "__main__":
    main(sys.argv[1:])
