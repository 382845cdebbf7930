"""Says, tensor group by tensor group, what a case holds next to reference checkpoints:

    python tests/thirdparty/mergekit/describe.py CASE_DIR LABEL=DIR [LABEL=DIR ...]

The first reference is the source fixture: its config.json gives the MTP layer's prefix, and
its tensors are grouped as main (routed experts apart) and MTP. For every source tensor it
prints, per group, how many the case lacks and, of those it holds, which references each is
bit-identical to (dtype, shape and bytes), or "none", and names the tensors whose dtype is
not the source's. Every ``*.safetensors`` file in a folder is read, whatever an index says
(fill_missing_params leaves a stale one). Needs torch and safetensors only.
"""

import json
import re
import sys
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def main(argv: list[str]) -> int:
    case = Path(argv[0])
    refs = [(label, Path(path)) for label, path in (a.split("=", 1) for a in argv[1:])]
    config = json.loads((refs[0][1] / "config.json").read_text())
    first = config["num_hidden_layers"]
    mtp = tuple(
        f"model.layers.{first + i}." for i in range(config.get("num_nextn_predict_layers", 0))
    )
    held = tensors(case)
    loaded = [(label, tensors(path)) for label, path in refs]
    source = loaded[0][1]

    def group(name: str) -> str:
        if name.startswith(mtp):
            return "mtp layer"
        if re.search(r"\.mlp\.experts\.\d+\.", name):
            return "main routed experts"
        return "main other"

    print(f"{case.name}: {len(held)} tensors")
    for g in ("main other", "main routed experts", "mtp layer"):
        names = sorted(n for n in source if group(n) == g)
        missing = [n for n in names if n not in held]
        kinds = Counter()
        recast = []
        for n in names:
            if n in held:
                match = [label for label, t in loaded if n in t and same(held[n], t[n])]
                kinds[" and ".join(match) if match else "none"] += 1
                if held[n].dtype != source[n].dtype:
                    recast.append(f"{n} {source[n].dtype} -> {held[n].dtype}")
        parts = [f"{count} identical to {kind}" for kind, count in sorted(kinds.items())]
        print(f"  {g}: {len(names)} in source, {len(missing)} missing; " + "; ".join(parts))
        for r in recast:
            print(f"    dtype changed: {r}")
    extra = sorted(set(held) - set(source))
    if extra:
        print(f"  not in source: {', '.join(extra)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
