"""The smallest edits of a speculators drafter, for defects no speculators option produces.

    python edit.py SRC DST drop NAME...      # DST without the named tensors
    python edit.py SRC DST randn NAME SEED   # NAME replaced by N(0, 0.02) noise

SRC's model.safetensors is read with safetensors, changed, and written to DST with
``safetensors.torch.save_file`` (the tensors in SRC's order, SRC's metadata kept); SRC's
config.json is copied unchanged. The noise comes from ``torch.Generator().manual_seed(SEED)``,
drawn in float32 in the tensor's shape (0.02 is the target's initializer_range).
"""

import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def main(src: str, dst: str, op: str, *args: str) -> None:
    s, d = Path(src), Path(dst)
    d.mkdir(parents=True, exist_ok=True)
    with safe_open(str(s / "model.safetensors"), framework="pt") as f:
        metadata = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    if op == "drop":
        for name in args:
            del tensors[name]
    elif op == "randn":
        name, seed = args
        old = tensors[name]
        g = torch.Generator().manual_seed(int(seed))
        noise = torch.randn(old.shape, generator=g, dtype=torch.float32) * 0.02
        tensors[name] = noise.to(old.dtype)
    else:
        raise SystemExit(f"unknown operation {op}")
    save_file(tensors, str(d / "model.safetensors"), metadata=metadata)
    shutil.copy(s / "config.json", d / "config.json")


if __name__ == "__main__":
    main(*sys.argv[1:])
