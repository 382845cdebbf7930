"""Prints a shipped case: its config.json keys and every tensor of model.safetensors (name,
dtype, shape, read from the safetensors header), and for d2t/t2d what the mapping is.

    python describe.py CASE_DIR
"""

import json
import os
import struct
import sys


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def main():
    case = sys.argv[1]
    with open(os.path.join(case, "config.json")) as f:
        cfg = json.load(f)
    print(f"== {os.path.basename(os.path.normpath(case))}")
    print("config.json:", json.dumps(cfg, sort_keys=True))
    path = os.path.join(case, "model.safetensors")
    hdr, base = header(path)
    print("metadata:", hdr.pop("__metadata__", None))
    for name in sorted(hdr):
        t = hdr[name]
        print(f"  {name} {t['dtype']}{t['shape']}")
    with open(path, "rb") as f:
        raw = f.read()

    def values(name, fmt, size):
        a, b = hdr[name]["data_offsets"]
        chunk = raw[base + a : base + b]
        return list(struct.unpack(f"<{len(chunk) // size}{fmt}", chunk))

    if "d2t" in hdr and "t2d" in hdr:
        d2t = values("d2t", "q", 8)
        t2d = values("t2d", "?", 1)
        ids = [i + o for i, o in enumerate(d2t)]
        kept = [i for i, v in enumerate(t2d) if v]
        increasing = all(a < b for a, b in zip(ids, ids[1:], strict=False))
        print(
            f"  d2t: {len(d2t)} offsets, {sum(1 for o in d2t if o)} non-zero, i + d2t[i] "
            f"strictly increasing: {increasing}, last target id "
            f"{ids[-1]}; t2d: {sum(t2d)} of {len(t2d)} true, t2d.nonzero() == i + d2t[i]: "
            f"{kept == ids}"
        )


if __name__ == "__main__":
    main()
