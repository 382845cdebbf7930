"""Writes the peft cases of tests/data/peft from a shipped fixture with the real peft.

    python tests/thirdparty/peft/make.py FIXTURE_DIR OUT_ROOT

For the fixture's family F it writes two case folders under OUT_ROOT:

- ``F-lora-merged-lost``: transformers loads the fixture (its MTP layer is not part of the
  model transformers builds), peft wraps it with a LoRA of rank 2 on the attention and MLP
  projections, the LoRA B matrices get seeded non-zero values (a fresh LoRA has B = 0 and
  its merge would change nothing), ``merge_and_unload()`` folds them in and
  ``save_pretrained`` writes the result: main weights changed by the merge, the MTP layer
  gone, config.json still declaring it.
- ``F-lora-merged-mtp-copied-back``: the same output, then the fixture's MTP tensors copied
  back unchanged into a shard of their own (``model_mtp.safetensors``), the index written to
  name it: what a careful user does after such a merge.

Only config.json, the safetensors files and the index are kept. Run it with the venv that
regenerate.sh builds (torch, transformers, peft, safetensors).
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

SEED = 0
RANK = 2
ALPHA = 4
B_STD = 0.1

# the projections of attention and of the dense and shared-expert MLPs (routed experts are
# fused 3-D parameters in transformers 5, not Linear modules a LoRA can wrap by name)
TARGETS = {
    "deepseek_v3": [
        "q_a_proj",
        "q_b_proj",
        "kv_a_proj_with_mqa",
        "kv_b_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ],
    "glm4_moe": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}

MTP_SHARD = "model_mtp.safetensors"


def checkpoint_tensors(directory: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / shard for name, shard in weight_map.items()}
    found = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            found.update(dict.fromkeys(f.keys(), path))
    return found


def read(tensors: dict[str, Path], name: str) -> torch.Tensor:
    with safe_open(tensors[name], "pt") as f:
        return f.get_tensor(name)


def mtp_names(config: dict, names) -> list[str]:
    first = config["num_hidden_layers"]
    prefixes = tuple(
        f"model.layers.{first + i}." for i in range(config.get("num_nextn_predict_layers", 0))
    )
    return sorted(n for n in names if n.startswith(prefixes))


def lora_merge(src: Path, family: str, out: Path) -> list[str]:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS[family])
    model = get_peft_model(model, config)
    resolved = model.peft_config["default"]
    print(
        f"peft resolved target_modules={sorted(resolved.target_modules or [])} "
        f"target_parameters={sorted(resolved.target_parameters or [])}"
    )
    generator = torch.Generator().manual_seed(SEED)
    wrapped = []
    for name, param in sorted(model.named_parameters()):
        if ".lora_B." in name:
            with torch.no_grad():
                noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.copy_((noise * B_STD).to(param.dtype))
            module = name.split(".lora_B.")[0].removeprefix("base_model.model.")
            # a wrapped parameter of the fused experts nests one wrapper in another
            module = module.replace(".base_layer", "")
            if module not in wrapped:
                wrapped.append(module)
    merged = model.merge_and_unload()
    merged.save_pretrained(out)
    return wrapped


def keep(written: Path, dest: Path) -> None:
    dest.mkdir(parents=True)
    for path in sorted(written.iterdir()):
        if path.name == "config.json" or path.name.endswith(
            (".safetensors", ".safetensors.index.json")
        ):
            shutil.copyfile(path, dest / path.name)


def copy_mtp_back(src: Path, dest: Path) -> list[str]:
    config = json.loads((src / "config.json").read_text())
    source = checkpoint_tensors(src)
    names = mtp_names(config, source)
    save_file({n: read(source, n) for n in names}, dest / MTP_SHARD, metadata={"format": "pt"})
    index = dest / "model.safetensors.index.json"
    if index.exists():
        content = json.loads(index.read_text())
    else:
        content = {
            "metadata": {},
            "weight_map": {
                n: "model.safetensors" for n in checkpoint_tensors(dest) if n not in names
            },
        }
    content["weight_map"].update(dict.fromkeys(names, MTP_SHARD))
    content["weight_map"] = dict(sorted(content["weight_map"].items()))
    total = 0
    for shard in sorted(set(content["weight_map"].values())):
        with safe_open(dest / shard, "pt") as f:
            for name in f.keys():
                t = f.get_slice(name)
                total += _numel(t.get_shape()) * _size(t.get_dtype())
    content["metadata"]["total_size"] = total
    index.write_text(json.dumps(content, indent=2) + "\n")
    return names


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _size(dtype: str) -> int:
    return {
        "BF16": 2,
        "F16": 2,
        "F32": 4,
        "F64": 8,
        "I64": 8,
        "I32": 4,
        "U8": 1,
        "I8": 1,
        "BOOL": 1,
    }[dtype]


def describe(src: Path, case: Path) -> str:
    config = json.loads((src / "config.json").read_text())
    a, b = checkpoint_tensors(src), checkpoint_tensors(case)
    mtp = set(mtp_names(config, a))
    lines = []
    for group, names in (("main", sorted(set(a) - mtp)), ("mtp", sorted(mtp))):
        missing = [n for n in names if n not in b]
        same, changed, recast = [], [], []
        for n in names:
            if n in b:
                x, y = read(a, n), read(b, n)
                if x.dtype != y.dtype:
                    recast.append(f"{n} {x.dtype}->{y.dtype}")
                elif torch.equal(x, y):
                    same.append(n)
                else:
                    changed.append(n)
        lines.append(
            f"  {group}: {len(names)} in source, {len(missing)} missing, {len(same)} identical, "
            f"{len(changed)} changed, {len(recast)} with another dtype"
        )
        lines += [f"    changed {n}" for n in changed]
        lines += [f"    dtype {n}" for n in recast]
        if missing and group == "main":
            lines += [f"    missing {n}" for n in missing]
    extra = sorted(set(b) - set(a))
    lines.append(f"  names not in source: {len(extra)}")
    lines += [f"    {n}" for n in extra]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    src, root = Path(argv[0]), Path(argv[1])
    family = json.loads((src / "config.json").read_text())["model_type"]
    lost = root / f"{family}-lora-merged-lost"
    back = root / f"{family}-lora-merged-mtp-copied-back"
    for d in (lost, back):
        if d.exists():
            shutil.rmtree(d)
    with tempfile.TemporaryDirectory() as tmp:
        wrapped = lora_merge(src, family, Path(tmp) / "out")
        keep(Path(tmp) / "out", lost)
    shutil.copytree(lost, back)
    copied = copy_mtp_back(src, back)
    print(f"{family}: LoRA on {len(wrapped)} modules: {', '.join(sorted(wrapped))}")
    for case in (lost, back):
        print(f"{case.name}: {', '.join(sorted(p.name for p in case.iterdir()))}")
        print(describe(src, case))
    print(f"{back.name}: copied back {len(copied)} MTP tensors into {MTP_SHARD}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
