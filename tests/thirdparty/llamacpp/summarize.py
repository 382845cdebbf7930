#!/usr/bin/env python3
"""Collect every <run>/convert.json (+ dump.json) under a corpus dir into SUMMARY.json.

python3 summarize.py tests/data/llamacpp_gguf
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    root = Path(sys.argv[1])
    runs = []
    per_arch: dict[str, dict] = {}
    versions = None
    for cj in sorted(root.glob("*/convert.json")):
        c = json.loads(cj.read_text())
        versions = versions or c.get("versions")
        run = {
            "run": cj.parent.name,
            "fixture": c["fixture"],
            "outtype": c["outtype"],
            "mode": c["mode"],
            "options": c["options"],
            "exit_code": c["exit_code"],
            "ok": c["exit_code"] == 0 and bool(c["outputs"]),
            "error": c.get("error"),
            "outputs": c["outputs"],
            "tokpre_patch_fired": bool(c.get("patches") and c["patches"].get("fired")),
            "staging": [s["action"] for s in c.get("staging", [])],
        }
        dj = cj.parent / "dump.json"
        if dj.exists():
            files = []
            for f in json.loads(dj.read_text())["files"]:
                h = f["highlights"]
                files.append(
                    {
                        "file": f["file"],
                        "architecture": f["architecture"],
                        "block_count": h["block_count"],
                        "nextn_keys": h["nextn_keys"],
                        "nextn_blocks": h["nextn_blocks"],
                        "n_tensors": f["n_tensors"],
                    }
                )
                if c["mode"] == "full" and c["outtype"] == "f32":
                    a = per_arch.setdefault(f["architecture"], {"from_runs": []})
                    a["from_runs"].append(cj.parent.name)
                    a.setdefault("nextn_keys", h["nextn_keys"])
                    a.setdefault("block_count", h["block_count"])
                    a.setdefault("nextn_tensors", h["nextn_tensors"])
                    a.setdefault("nextn_block_tensors", h["nextn_block_tensors"])
                    a.setdefault("expert_tensors", h["expert_tensors"])
                    a.setdefault("non_block_tensors", h["non_block_tensors"])
            run["files"] = files
        runs.append(run)
    doc = {
        "versions": versions,
        "n_runs": len(runs),
        "n_ok": sum(r["ok"] for r in runs),
        "n_failed": sum(not r["ok"] for r in runs),
        "per_architecture_f32_full": per_arch,
        "runs": runs,
    }
    (root / "SUMMARY.json").write_text(json.dumps(doc, indent=1) + "\n")
    for r in runs:
        print(
            f"{'OK ' if r['ok'] else 'ERR'} {r['run']}: "
            f"{', '.join(o['file'] for o in r['outputs']) if r['ok'] else r['error']}"
        )
    print(f"{doc['n_ok']} ok, {doc['n_failed']} failed")


if __name__ == "__main__":
    main()
