"""Converters that damage MTP the way real ones do, for round-trip tests.

Usage: python damaging.py MODE SRC DST. Each mode converts with mtpcheck's built-in
converters (real torch_dist / real safetensors), then does one realistic thing wrong.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _to_megatron(src: Path, dst: Path, edit, mtp_off: bool = False) -> None:  # type: ignore[no-untyped-def]
    from mtpcheck.convert import megatron_config
    from mtpcheck.convert.builtin import _torch_tensor
    from mtpcheck.convert.torch_dist_writer import write_torch_dist
    from mtpcheck.formats import open_checkpoint
    from mtpcheck.mapping import as_megatron

    hf = open_checkpoint(src)
    view = as_megatron(hf)
    tensors = {n: _torch_tensor(view, n) for n in view.tensors}
    edit(tensors)
    key = view.plan.family.key
    kwargs = megatron_config.transformer_config_kwargs(hf.config, key)
    args = megatron_config.args_namespace(hf.config, key)
    if mtp_off:  # the model provider builds no MTP block: mtp_num_layers None
        kwargs["mtp_num_layers"] = None
        args = megatron_config.args_namespace(hf.config, key, mtp_num_layers=None)
    write_torch_dist(dst, tensors, kwargs, args, "release")


def _to_hf(src: Path, dst: Path, hf_config: Path, edit=None) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file, save_file

    from mtpcheck.convert.builtin import megatron_to_hf
    from mtpcheck.formats import open_checkpoint
    from mtpcheck.formats.config_json import read_config

    files = megatron_to_hf(open_checkpoint(src), dst, read_config(hf_config))
    if edit is None:
        return
    for path in files:
        tensors = load_file(str(path))
        edit(tensors)
        save_file(tensors, str(path), metadata={"format": "pt"})


def main() -> None:
    mode, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    config = Path(sys.argv[4]) if len(sys.argv) > 4 else None
    if mode == "upcast-eh-proj":

        def upcast(t: dict) -> None:
            import torch

            t["mtp.layers.0.eh_proj.weight"] = t["mtp.layers.0.eh_proj.weight"].to(torch.float32)

        _to_megatron(src, dst, upcast)
    elif mode == "swap-eh-proj-halves":  # [embedding; hidden] concatenated the wrong way

        def swap_halves(t: dict) -> None:
            import torch

            w = t["mtp.layers.0.eh_proj.weight"]
            h = w.shape[1] // 2
            t["mtp.layers.0.eh_proj.weight"] = torch.cat([w[:, h:], w[:, :h]], dim=1).contiguous()

        _to_megatron(src, dst, swap_halves)
    elif mode == "drop-mtp-weights":
        _to_megatron(src, dst, lambda t: [t.pop(n) for n in list(t) if n.startswith("mtp.")])
    elif mode == "mtp-off":  # Megatron-Bridge's GLM-5 bridge by default
        drop = lambda t: [t.pop(n) for n in list(t) if n.startswith("mtp.")]  # noqa: E731
        _to_megatron(src, dst, drop, mtp_off=True)
    elif mode == "no-swap-back":

        def swap(t: dict) -> None:
            import torch

            name = "model.mtp_layers.0.input_proj.weight"
            if name in t:
                w = t[name]
                h = w.shape[1] // 2
                t[name] = torch.cat([w[:, h:], w[:, :h]], dim=1).contiguous()

        _to_hf(src, dst, config, swap)
    elif mode == "drop-count-key":
        _to_hf(src, dst, config)
        cfg = json.loads((dst / "config.json").read_text())
        cfg.pop("num_nextn_predict_layers")
        (dst / "config.json").write_text(json.dumps(cfg))
    elif mode == "fail":
        print("loading shards...\nKeyError: 'mtp.layers.0.eh_proj.weight'", file=sys.stderr)
        sys.exit(3)
    elif mode == "hang":
        dst.mkdir(parents=True, exist_ok=True)
        (dst / "started").touch()  # tests wait for this before interrupting
        time.sleep(60)
    elif mode == "nothing":
        pass
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
