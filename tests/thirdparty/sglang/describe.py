"""Says what an exported NextN folder holds next to the checkpoint it was exported from:

    python tests/thirdparty/sglang/describe.py CASE_DIR SOURCE_DIR

Prints the files of CASE_DIR, the architectures / num_hidden_layers / num_nextn_predict_layers
of its config.json, the size of its index's weight_map, and, for every tensor of
nextn_layer_parameters.safetensors (read from the file's own header), its dtype and shape and
whether it is bit-identical to the source's MTP tensor of the same name (model.layers.0.* in
the export is model.layers.{num_hidden_layers}.* in the source). Ends with the source's MTP
tensors that the export lacks. Needs torch and safetensors only.
"""

import json
import struct
import sys
from pathlib import Path

import torch
from safetensors import safe_open


def header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))
    meta.pop("__metadata__", None)
    return meta


def source_tensors(source: Path, prefix: str) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(source.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix + ".")})
    return out


def main() -> None:
    case, source = Path(sys.argv[1]), Path(sys.argv[2])
    src_cfg = json.loads((source / "config.json").read_text())
    prefix = f"model.layers.{src_cfg['num_hidden_layers']}"
    print(f"== {case.name}")
    print("files:", " ".join(sorted(p.name for p in case.iterdir())))
    cfg = json.loads((case / "config.json").read_text())
    print(
        "config: architectures={} num_hidden_layers={} num_nextn_predict_layers={}".format(
            cfg.get("architectures"),
            cfg.get("num_hidden_layers"),
            cfg.get("num_nextn_predict_layers"),
        )
    )
    index = case / "model.safetensors.index.json"
    if index.exists():
        print("index weight_map entries:", len(json.loads(index.read_text()).get("weight_map", {})))
    src = source_tensors(source, prefix)
    written = case / "nextn_layer_parameters.safetensors"
    have = set()
    if written.exists():
        meta = header(written)
        with safe_open(written, "pt") as f:
            for name in sorted(meta):
                have.add(name)
                twin = src.get(name.replace("model.layers.0.", prefix + ".", 1))
                t = f.get_tensor(name)
                same = (
                    twin is not None
                    and twin.dtype == t.dtype
                    and twin.shape == t.shape
                    and torch.equal(
                        twin.view(torch.uint8) if t.dtype.is_floating_point else twin,
                        t.view(torch.uint8) if t.dtype.is_floating_point else t,
                    )
                )
                print(
                    f"  {name} {meta[name]['dtype']} {meta[name]['shape']}"
                    f" {'identical to source' if same else 'DIFFERS from source'}"
                )
        print(f"tensors written: {len(meta)}")
    else:
        print("nextn_layer_parameters.safetensors: not written")
    missing = [k for k in sorted(src) if k.replace(prefix + ".", "model.layers.0.", 1) not in have]
    print(f"source {prefix}.* tensors not in the export ({len(missing)}):")
    for k in missing:
        print("  " + k)


if __name__ == "__main__":
    main()
