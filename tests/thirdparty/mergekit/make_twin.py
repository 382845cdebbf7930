"""Writes a perturbed twin of a safetensors checkpoint: seeded noise on every floating tensor.

    python tests/thirdparty/mergekit/make_twin.py SRC_DIR OUT_DIR {layers|all} [SEED]

The twin stands for a fine-tuned copy of the fixture. With ``layers`` every floating tensor of
the decoder layers and of the MTP layer (``model.layers.*``) gets N(0, 0.01) noise; with
``all`` the embedding, the final norm and the head get it too. The noise is float32, added in
float32 and cast back to the tensor's dtype, drawn from one torch.Generator seeded with SEED
(default 0) in sorted tensor order. The MTP layer's copies of the embedding and the head
(DeepSeek-V3's ``model.layers.N.embed_tokens.weight`` and
``model.layers.N.shared_head.head.weight``) are then set to the twin's own embedding and head,
so the twin keeps the fixture's shared-copy property (with ``layers`` they stay the source's).
The shard layout, the index and config.json are the source's; the safetensors files are
written with safetensors' ``save_file`` and metadata ``{"format": "pt"}``.
Needs torch and safetensors only.
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

NOISE_STD = 0.01
SHARED_COPIES = {
    "embed_tokens.weight": "model.embed_tokens.weight",
    "shared_head.head.weight": "lm_head.weight",
}


def main(argv: list[str]) -> int:
    src, out = Path(argv[0]), Path(argv[1])
    scope = argv[2]
    if scope not in ("layers", "all"):
        raise SystemExit(f"scope must be layers or all, not {scope!r}")
    seed = int(argv[3]) if len(argv) > 3 else 0
    config = json.loads((src / "config.json").read_text())
    first_mtp = config["num_hidden_layers"]
    mtp_prefixes = tuple(
        f"model.layers.{first_mtp + i}." for i in range(config.get("num_nextn_predict_layers", 0))
    )
    shards = {}
    for path in sorted(src.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            shards[path.name] = {name: f.get_tensor(name) for name in f.keys()}
    generator = torch.Generator().manual_seed(seed)
    perturbed = {}
    for name in sorted(n for tensors in shards.values() for n in tensors):
        tensor = next(t[name] for t in shards.values() if name in t)
        if tensor.is_floating_point() and (scope == "all" or name.startswith("model.layers.")):
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * NOISE_STD
            tensor = (tensor.float() + noise).to(tensor.dtype)
        perturbed[name] = tensor
    for name in perturbed:
        if name.startswith(mtp_prefixes):
            rest = name.split(".", 3)[3]
            if rest in SHARED_COPIES and SHARED_COPIES[rest] in perturbed:
                perturbed[name] = perturbed[SHARED_COPIES[rest]].clone()
    out.mkdir(parents=True, exist_ok=True)
    for shard, tensors in shards.items():
        save_file({n: perturbed[n] for n in tensors}, out / shard, metadata={"format": "pt"})
    for path in sorted(src.iterdir()):
        if path.is_file() and not path.name.endswith(".safetensors"):
            shutil.copyfile(path, out / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
