#!/usr/bin/env python3
"""Byte-for-byte comparison of one mcore-bridge round trip written by convert.py
(independent of mtpcheck).

Copied from tests/thirdparty/megatron_bridge_062/compare.py; only change: the MTP fields of
OUT_DIR/megatron/args.json (what convert.py saves, as ms-swift's args.json) are reported next to
run_config.yaml's (which mcore-bridge checkpoints do not have).

    python compare.py FIXTURE_DIR OUT_DIR [--json OUT_DIR/report.json]

Reads
  FIXTURE_DIR/*.safetensors     the HF source                      (safetensors.safe_open)
  OUT_DIR/megatron/iter_*/      the torch_dist checkpoint          (torch.distributed.checkpoint)
  OUT_DIR/hf/*.safetensors      the HF export                      (safetensors.safe_open)

and reports
  * every HF source tensor of the MTP part (name contains an ``mtp``/``nextn`` component, or
    sits under ``layers.{i}`` with i >= num_hidden_layers);
  * the Megatron checkpoint: every key with shape/dtype, the MTP keys (``mtp.*``), the
    ``common_state`` entries and ``run_config.yaml`` fields that mention MTP;
  * which source MTP tensors reached the Megatron checkpoint: a source tensor "reached" a
    Megatron tensor when its bytes occur there (see ``contained``: equal, every row among the
    Megatron tensor's rows, or 1-D pieces among its pieces), so fused tensors (QKV, gate/up,
    stacked experts) are found without knowing the bridge's mapping.  Values the bridge
    transforms (e.g. a norm re-centred) do not match and are listed as not found;
  * the HF export against the source, tensor by tensor: identical bytes / changed / lost /
    extra (name absent from the source).

Needs torch and safetensors (the mcb venv has both).  Nothing here imports Megatron.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import re
import sys

import torch
from safetensors import safe_open

MTP_TOKEN = re.compile(r"(^|\.)(mtp|mtp_layers|nextn|nextn_layers)(\.|$)")
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def load_safetensors(d: str) -> dict[str, torch.Tensor]:
    out = {}
    for p in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(p, framework="pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    return out


def num_hidden_layers(fixture: str) -> int | None:
    with open(os.path.join(fixture, "config.json")) as f:
        cfg = json.load(f)
    for c in (cfg.get("text_config") or {}, cfg):
        if isinstance(c, dict) and c.get("num_hidden_layers") is not None:
            return int(c["num_hidden_layers"])
        if isinstance(c, dict) and isinstance(c.get("layers_block_type"), list):
            return len(c["layers_block_type"])  # Nemotron-H
    return None


def is_mtp_hf(name: str, n_layers: int | None) -> bool:
    if MTP_TOKEN.search(name):
        return True
    m = LAYER.search(name)
    return bool(
        m and n_layers is not None and int(m.group(1)) >= n_layers and "backbone." not in name
    )


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(raw(t)).hexdigest()[:16]


def row_hashes(t: torch.Tensor) -> list[str]:
    t = t.detach().contiguous().cpu()
    if t.ndim < 2:
        return [hashlib.sha1(raw(t)).hexdigest()]
    r = t.reshape(-1, t.shape[-1])
    return [hashlib.sha1(raw(r[i])).hexdigest() for i in range(r.shape[0])]


def _chunks(t: torch.Tensor, c: int) -> list[str]:
    r = t.detach().contiguous().reshape(-1, c)
    return [hashlib.sha1(raw(r[i])).hexdigest() for i in range(r.shape[0])]


def contained(s: torch.Tensor, m: torch.Tensor) -> str | None:
    """How the bytes of source tensor ``s`` occur in Megatron tensor ``m`` (None: they don't).

    "equal": same shape and bytes; "rows": every row (last dim) of ``s`` is a row of ``m``;
    "rows, transposed": the same for ``s.T``; "chunks of N": 1-D ``s`` cut into pieces of N
    elements (N >= 4, largest that works) all occur among ``m``'s N-element pieces (e.g. q/k/v
    biases inside a fused, head-interleaved qkv bias).  When the dtypes differ, ``s`` is first
    cast to ``m``'s dtype (exact for bf16 -> fp32) and " as <dtype>" is appended.
    """
    note = ""
    if s.dtype != m.dtype:
        if not (s.is_floating_point() and m.is_floating_point()):
            return None
        s = s.to(m.dtype)
        note = f" as {dt(m)}"
    if s.shape == m.shape and raw(s) == raw(m):
        return "equal" + note
    if s.ndim >= 2 and m.ndim >= 2 and s.shape[-1] == m.shape[-1]:
        if set(row_hashes(s)) <= set(row_hashes(m)):
            return "rows" + note if note else "rows"
    if s.ndim == 2 and m.ndim >= 2 and s.shape[0] == m.shape[-1]:
        if set(row_hashes(s.t())) <= set(row_hashes(m)):
            return "rows, transposed" + note
    if s.ndim == 1 and m.ndim == 1 and m.numel() > s.numel():
        n = s.numel()
        for c in range(n, 3, -1):
            if n % c == 0 and m.numel() % c == 0 and set(_chunks(s, c)) <= set(_chunks(m, c)):
                return f"chunks of {c}" + note
    return None


def dt(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


# ------------------------------------------------------------------------------------------
def read_megatron(meg_root: str) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    iters = sorted(glob.glob(os.path.join(meg_root, "iter_*")))
    if not iters:
        raise FileNotFoundError(f"no iter_* under {meg_root}")
    ckpt = iters[-1]
    reader = FileSystemReader(ckpt)
    md = reader.read_metadata()
    tensors, objects = {}, {}
    for k, v in md.state_dict_metadata.items():
        if isinstance(v, TensorStorageMetadata):
            tensors[k] = torch.empty(v.size, dtype=v.properties.dtype)
        elif isinstance(v, BytesStorageMetadata):
            objects[k] = io.BytesIO()
    sd = {**tensors, **objects}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(sd, storage_reader=FileSystemReader(ckpt), no_dist=True)
    common = None
    for k in objects:
        val = sd[k]  # the loader replaces the BytesIO by the unpickled object (mcore: a list)
        if isinstance(val, io.BytesIO):
            val.seek(0)
            val = torch.load(val, map_location="cpu", weights_only=False)
        if isinstance(val, list) and len(val) == 1:
            val = val[0]
        if k.startswith("common_state"):
            common = val
    run_cfg = {}
    rc = os.path.join(ckpt, "run_config.yaml")
    if os.path.exists(rc):
        with open(rc) as f:
            for line in f:
                m = re.match(r"\s*([A-Za-z0-9_]*(?:mtp|nextn)[A-Za-z0-9_]*):\s*(.*)$", line)
                if m:
                    run_cfg[m.group(1)] = m.group(2).strip()
    args_json = os.path.join(meg_root, "args.json")
    if os.path.exists(args_json):
        with open(args_json) as f:
            for k, v in json.load(f).items():
                if re.search(r"mtp|nextn", k):
                    run_cfg[f"args.json:{k}"] = v
    meta = {}
    for name in ("metadata.json",):
        p = os.path.join(ckpt, name)
        if os.path.exists(p):
            with open(p) as f:
                meta[name] = json.load(f)
    return {
        "dir": os.path.relpath(ckpt, meg_root),
        "files": sorted(os.listdir(ckpt)),
        "tensors": {k: sd[k] for k in tensors},
        "object_keys": sorted(objects),
        "common_state": common,
        "run_config_mtp": run_cfg,
        "metadata": meta,
    }


def mtp_mentions(obj, path=""):
    """(path, value) pairs of a nested common_state whose key path mentions mtp/nextn."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += mtp_mentions(v, f"{path}.{k}" if path else str(k))
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.Tensor, type)):
        out += mtp_mentions(vars(obj), path)
    elif re.search(r"mtp|nextn", path, re.I):
        out.append((path, repr(obj)[:200]))
    return out


def _jsonable(obj):
    """common_state as JSON: an argparse.Namespace (ms-swift's saved ``args``) becomes a dict."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "__dict__") and not isinstance(obj, (torch.Tensor, type)):
        return _jsonable(vars(obj))
    if isinstance(obj, (str, int, float, bool, type(None))):
        return obj
    return repr(obj)[:200]


def common_summary(common) -> dict:
    if common is None:
        return {}
    summ = {"content": _jsonable(common) if isinstance(common, dict) else repr(common)[:500]}
    summ["mtp_fields"] = dict(mtp_mentions(common))
    return summ


# ------------------------------------------------------------------------------------------
def compare(fixture: str, out: str) -> dict:
    n = num_hidden_layers(fixture)
    src = load_safetensors(fixture)
    src_mtp = [k for k in src if is_mtp_hf(k, n)]
    rep: dict = {
        "fixture": os.path.basename(os.path.normpath(fixture)),
        "num_hidden_layers": n,
        "source": {
            "tensors": len(src),
            "mtp": {k: [list(src[k].shape), dt(src[k])] for k in src_mtp},
        },
    }

    meg_root = os.path.join(out, "megatron")
    meg = None
    if os.path.isdir(meg_root) and glob.glob(os.path.join(meg_root, "iter_*")):
        meg = read_megatron(meg_root)
        mt = meg["tensors"]
        mtp_keys = [k for k in mt if k.startswith("mtp.") or ".mtp." in k]
        reached, not_found = {}, []
        for k in src_mtp:
            hits = []
            for mk in mtp_keys:
                how = contained(src[k], mt[mk])
                if how:
                    hits.append(mk + (f" ({how})" if how != "rows" else ""))
            if hits:
                reached[k] = hits
            else:
                not_found.append(k)
        rep["megatron"] = {
            "dir": meg["dir"],
            "files": meg["files"],
            "num_tensor_keys": len(mt),
            "num_object_keys": len(meg["object_keys"]),
            "mtp_keys": {k: [list(mt[k].shape), dt(mt[k])] for k in mtp_keys},
            "mtp_object_keys": [k for k in meg["object_keys"] if k.startswith("mtp.")],
            "all_tensor_keys": {k: [list(v.shape), dt(v)] for k, v in mt.items()},
            "common_state": common_summary(meg["common_state"]),
            "run_config_mtp": meg["run_config_mtp"],
            "metadata": meg["metadata"],
            "source_mtp_reached": reached,
            "source_mtp_not_found": not_found,
        }
    else:
        rep["megatron"] = None

    hf_dir = os.path.join(out, "hf")
    if os.path.isdir(hf_dir) and glob.glob(os.path.join(hf_dir, "*.safetensors")):
        exp = load_safetensors(hf_dir)
        identical, changed, lost = [], {}, []
        for k, t in src.items():
            if k not in exp:
                lost.append(k)
                continue
            e = exp[k]
            if e.dtype == t.dtype and e.shape == t.shape and raw(e) == raw(t):
                identical.append(k)
            else:
                info = {"src": [list(t.shape), dt(t)], "exported": [list(e.shape), dt(e)]}
                if e.shape == t.shape:
                    d = (e.float() - t.float()).abs()
                    info["max_abs_diff"] = float(d.max()) if d.numel() else 0.0
                    info["n_diff_elements"] = int((d > 0).sum())
                    # only the dtype differs: the export cast back to the source dtype gives the
                    # source bytes, and the source cast to the export dtype gives the export bytes
                    info["dtype_only"] = bool(
                        e.dtype != t.dtype
                        and e.is_floating_point()
                        and t.is_floating_point()
                        and raw(t.to(e.dtype)) == raw(e)
                        and raw(e.to(t.dtype)) == raw(t)
                    )
                changed[k] = info
        extra = {k: [list(v.shape), dt(v)] for k, v in exp.items() if k not in src}
        mtp = set(src_mtp)
        rep["hf_export"] = {
            "tensors": len(exp),
            "identical": len(identical),
            "changed": changed,
            "lost": lost,
            "extra": extra,
            "mtp_identical": sorted(k for k in identical if k in mtp),
            "mtp_changed": sorted(k for k in changed if k in mtp),
            "mtp_lost": sorted(k for k in lost if k in mtp),
            "non_mtp_changed": sorted(k for k in changed if k not in mtp),
            "non_mtp_lost": sorted(k for k in lost if k not in mtp),
        }
        cfg_src = json.load(open(os.path.join(fixture, "config.json")))
        cfg_exp_p = os.path.join(hf_dir, "config.json")
        if os.path.exists(cfg_exp_p):
            cfg_exp = json.load(open(cfg_exp_p))

            def mtp_cfg(c, pre=""):
                o = {}
                for kk, vv in c.items():
                    if isinstance(vv, dict) and kk.endswith("config"):
                        o.update(mtp_cfg(vv, f"{pre}{kk}."))
                    elif re.search(r"mtp|nextn", kk, re.I):
                        o[pre + kk] = vv
                return o

            rep["hf_export"]["config_mtp_source"] = mtp_cfg(cfg_src)
            rep["hf_export"]["config_mtp_exported"] = mtp_cfg(cfg_exp)
    else:
        rep["hf_export"] = None

    s = {"source_mtp": len(src_mtp)}
    if rep["megatron"] is not None:
        s["megatron_mtp_keys"] = len(rep["megatron"]["mtp_keys"])
        s["source_mtp_in_megatron"] = len(rep["megatron"]["source_mtp_reached"])
    if rep["hf_export"] is not None:
        h = rep["hf_export"]
        s["mtp_back_identical"] = len(h["mtp_identical"])
        s["mtp_back_changed"] = len(h["mtp_changed"])
        s["mtp_back_changed_dtype_only"] = sum(
            1 for k in h["mtp_changed"] if h["changed"][k].get("dtype_only")
        )
        s["mtp_lost"] = len(h["mtp_lost"])
        s["all_identical"] = f"{h['identical']}/{len(src)}"
        s["non_mtp_lost_or_changed"] = len(h["non_mtp_lost"]) + len(h["non_mtp_changed"])
        s["non_mtp_changed_dtype_only"] = sum(
            1 for k in h["non_mtp_changed"] if h["changed"][k].get("dtype_only")
        )
    rep["summary"] = s
    return rep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("fixture")
    ap.add_argument("out")
    ap.add_argument(
        "--json", default=None, help="where to write the report (default OUT/report.json)"
    )
    args = ap.parse_args(argv)
    rep = compare(args.fixture, args.out)
    path = args.json or os.path.join(args.out, "report.json")
    with open(path, "w") as f:
        json.dump(rep, f, indent=1, sort_keys=False)
        f.write("\n")
    print(json.dumps({rep["fixture"]: rep["summary"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
