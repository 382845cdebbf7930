"""Convert the tiny fixtures with the real mlx-lm and build the MLX corpus tests/data/mlx/.

Run through ``regenerate.sh`` (it owns the venv and the temp dirs)::

    python tests/thirdparty/mlx/make.py --out OUT --work WORKDIR

What it writes under OUT (see NOTES.md beside this file):

* ``refusals/*.txt``: the last exception mlx-lm's ``convert`` raises on the unmodified fixtures
  (and on the half-fixed copy that still lacks a tokenizer).
* ``source-<fixture>/``: the copy mlx-lm accepted (config.json + safetensors, no tokenizer).
* ``<fixture>-<mode>-lost/``: what ``python -m mlx_lm convert`` wrote (config.json, safetensors,
  index), tokenizer files dropped. mlx-lm drops the MTP layer, config.json keeps
  ``num_nextn_predict_layers: 1``.
* ``<fixture>-<mode>-intact/``: the same output plus the source's MTP layer, laid out and
  quantized the way mlx-lm lays out and quantizes the main layers (this script's own code,
  checked byte-for-byte against every main-model tensor mlx-lm wrote).
* ``MANIFEST.json``: per case the command, the mlx-lm log lines, the MTP state, the tensors
  quantized or left alone, the byte-for-byte proof and the dequantization checks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

WIDE = 64  # smallest width at which mlx-lm's default ``-q`` (affine, group 64) quantizes all
VOCAB = 64
# What transformers assumes for GLM-4.5 (Glm4MoeConfig() gives rope_parameters
# {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"}; "default"
# means no scaling, i.e. the legacy rope_scaling=None). The fixture's rope_parameters hold the same.
GLM_TOP_LEVEL_ROPE = {"rope_theta": 10000.0, "rope_scaling": None, "partial_rotary_factor": 0.5}

# mode name -> extra convert flags, and (group_size, bits, mode) they resolve to
MODES: dict[str, tuple[list[str], tuple[int, int, str] | None]] = {
    "bf16": ([], None),
    "affine4": (["-q"], (64, 4, "affine")),
    "affine8": (["-q", "--q-bits", "8"], (64, 8, "affine")),
    "mxfp4": (["-q", "--q-mode", "mxfp4"], (32, 4, "mxfp4")),
    "nvfp4": (["-q", "--q-mode", "nvfp4"], (16, 4, "nvfp4")),
    "mxfp8": (["-q", "--q-mode", "mxfp8"], (32, 8, "mxfp8")),
}

# (fixture key, modes) converted
PLAN: list[tuple[str, list[str]]] = [
    ("glm4_moe_wide", ["bf16", "affine4", "affine8", "mxfp4", "nvfp4", "mxfp8"]),
    ("glm4_moe", ["bf16", "affine4", "nvfp4"]),
    ("deepseek_v3_mtp61", ["bf16"]),
]
KEEP = ("config.json", "model.safetensors.index.json")
# unquantized intact copy shipped for the 16-wide fixture only (the wide one would add ~300 KB
# and shows nothing more); the layout proof still runs on every glm4_moe output
NO_INTACT = {"glm4_moe_wide-bf16"}
DECODE_MODULE = "model.layers.1.self_attn.q_proj"


# ----------------------------------------------------------------------------- helpers


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, raw bytes), straight from the file."""
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], blob[base + a : base + b])
    return out


def read_dir_tensors(d: Path) -> dict[str, tuple[str, list[int], bytes]]:
    out: dict[str, tuple[str, list[int], bytes]] = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(read_safetensors(f))
    return out


def load_mx(d: Path) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for f in sorted(d.glob("model*.safetensors")):
        out.update(mx.load(str(f)))
    return out


def mx_bytes(a: mx.array) -> bytes:
    return np.array(mx.contiguous(a).view(mx.uint8)).tobytes()


MX_TO_ST = {
    mx.bfloat16: "BF16",
    mx.float16: "F16",
    mx.float32: "F32",
    mx.uint32: "U32",
    mx.uint8: "U8",
}


# ----------------------------------------------------------------------------- sources


def write_tokenizer(out_dir: Path) -> None:
    """A word-level tokenizer with exactly VOCAB entries (mlx-lm needs one to save)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    words = [f"w{i}" for i in range(VOCAB - len(specials))]
    vocab = {tok: i for i, tok in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=64,
    )
    fast.save_pretrained(out_dir)


def add_glm_rope_keys(d: Path) -> None:
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    assert cfg["rope_parameters"]["rope_theta"] == GLM_TOP_LEVEL_ROPE["rope_theta"]
    assert cfg["rope_parameters"]["partial_rotary_factor"] == 0.5
    assert cfg["rope_parameters"]["rope_type"] == "default"
    cfg.update(GLM_TOP_LEVEL_ROPE)
    write_json(d / "config.json", cfg)


def build_wide_raw(raw_root: Path) -> Path:
    """fixtures/make_fixtures.py's glm4_moe at width WIDE, two routed experts (one per token)."""
    from fixtures import make_fixtures as mf

    mf.HIDDEN = WIDE  # the nextn projection is [HIDDEN, 2 * HIDDEN]
    (glm,) = [f for f in mf.families() if f.name == "glm4_moe"]
    kwargs = {
        **glm.config_kwargs,
        "hidden_size": WIDE,
        "intermediate_size": WIDE,
        "moe_intermediate_size": WIDE,
        "head_dim": WIDE // 2,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
    }
    mf.transformers.utils.logging.set_verbosity_error()
    return mf.build_family(replace(glm, name="glm4_moe_wide", config_kwargs=kwargs), raw_root)


def rename_deepseek_mtp(src: Path, dst: Path) -> None:
    """Copy fixtures/deepseek_v3 with the MTP layer renamed model.layers.2 -> model.layers.61."""
    import torch  # noqa: F401  (safetensors.torch needs it)
    from safetensors.torch import load_file, save_file

    def rn(name: str) -> str:
        return re.sub(r"^model\.layers\.2\.", "model.layers.61.", name)

    dst.mkdir(parents=True)
    shutil.copy(src / "config.json", dst / "config.json")
    index = json.loads((src / "model.safetensors.index.json").read_text(encoding="utf-8"))
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(str(src / shard))
        renamed = {rn(k): v for k, v in tensors.items()}
        save_file(
            {k: renamed[k] for k in sorted(renamed)}, str(dst / shard), metadata={"format": "pt"}
        )
    index["weight_map"] = {rn(k): v for k, v in sorted(index["weight_map"].items())}
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    write_json(dst / "model.safetensors.index.json", index)


def make_sources(work: Path) -> dict[str, Path]:
    """Copies mlx-lm accepts (with tokenizer) under work/src/<fixture>."""
    src_root = work / "src"
    src_root.mkdir()
    raw = build_wide_raw(work / "raw")
    out = {}
    for key, origin in (("glm4_moe_wide", raw), ("glm4_moe", REPO / "fixtures" / "glm4_moe")):
        d = src_root / key
        shutil.copytree(origin, d)
        add_glm_rope_keys(d)
        write_tokenizer(d)
        out[key] = d
    d = src_root / "deepseek_v3_mtp61"
    rename_deepseek_mtp(REPO / "fixtures" / "deepseek_v3", d)
    write_tokenizer(d)
    out["deepseek_v3_mtp61"] = d
    return out


# ----------------------------------------------------------------------------- mlx-lm runs


def run_convert(src: Path, dst: Path, flags: list[str]) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "mlx_lm", "convert",
        "--hf-path", str(src), "--mlx-path", str(dst), "--dtype", "bfloat16", *flags,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def last_exception(stderr: str) -> str:
    lines = stderr.rstrip("\n").splitlines()
    start = max(
        i for i, line in enumerate(lines) if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)
    )
    return "\n".join(lines[start:]) + "\n"


def refusals(work: Path, out: Path) -> dict[str, Any]:
    """Unmodified fixtures, then the glm copy with the config fixed but no tokenizer."""
    (out / "refusals").mkdir()
    half = work / "half" / "glm4_moe"
    shutil.copytree(REPO / "fixtures" / "glm4_moe", half)
    add_glm_rope_keys(half)
    runs = {
        "deepseek_v3": (REPO / "fixtures" / "deepseek_v3", "fixtures/deepseek_v3 (unmodified)"),
        "glm4_moe": (REPO / "fixtures" / "glm4_moe", "fixtures/glm4_moe (unmodified)"),
        "glm4_moe-rope-keys-no-tokenizer": (
            half,
            "fixtures/glm4_moe + top-level rope_theta/rope_scaling/partial_rotary_factor,"
            " no tokenizer",
        ),
    }
    result = {}
    for name, (src, what) in runs.items():
        proc = run_convert(src, work / "refused" / name, [])
        if proc.returncode == 0:
            raise SystemExit(f"mlx-lm unexpectedly accepted {what}")
        msg = last_exception(proc.stderr)
        (out / "refusals" / f"{name}.txt").write_text(msg, encoding="utf-8")
        result[name] = {
            "input": what,
            "returncode": proc.returncode,
            "error_first_line": msg.splitlines()[0],
            "file": f"refusals/{name}.txt",
        }
    return result


# ----------------------------------------------------------------------------- mlx layout


def module_classes(model_type_cfg: dict) -> tuple[dict[str, type], Any]:
    """Module path -> class, from the real mlx-lm model built from the config."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config=model_type_cfg)
    model = model_class(args_class.from_dict(model_type_cfg))
    assert getattr(model, "quant_predicate", None) is None, "model has its own quant predicate"
    return {path: type(m) for path, m in model.named_modules()}, model


# the nextn-only modules (no mlx-lm model has them): what they are in every MTP implementation
NEXTN_EXTRA = {
    "eh_proj": nn.Linear,
    "embed_tokens": nn.Embedding,
    "shared_head.head": nn.Linear,
    "enorm": nn.RMSNorm,
    "hnorm": nn.RMSNorm,
    "shared_head.norm": nn.RMSNorm,
}


def mlx_layout(
    tensors: dict[str, mx.array], cfg: dict, quant: tuple[int, int, str] | None
) -> tuple[dict[str, mx.array], dict[str, list[str]], dict[str, int]]:
    """Lay out and quantize HF tensors the way mlx-lm's convert does for glm4_moe, MTP included.

    1. sanitize: routed experts ``mlp.experts.{e}.{gate,up,down}_proj.weight`` stacked with
       ``mx.stack`` into ``mlp.switch_mlp.{...}.weight`` [E, out, in] -- for every layer,
       the MTP layer (index num_hidden_layers) too, which mlx-lm's sanitize drops instead;
    2. cast: every floating tensor to bfloat16 except ``e_score_correction_bias`` (the model's
       cast_predicate);
    3. quantize: a module is quantized when its class has ``to_quantized`` (nn.Linear,
       nn.Embedding, SwitchLinear) and its weight's last dim divides by the group size
       (mlx-lm's predicate); ``mx.quantize(weight, group_size, bits, mode=mode)`` gives
       ``weight`` (+``scales``, +``biases`` for affine); the module's ``bias`` is kept as is.

    Returns the tensors, {"quantized": [...module paths], "skipped": [...]}, and per module the
    parameter count as mlx-lm's get_total_parameters counts it (index.json's total_parameters).
    """
    n_layers = cfg["num_hidden_layers"]
    n_experts = cfg["n_routed_experts"]
    classes, _ = module_classes(cfg)
    t = dict(tensors)
    for layer in range(n_layers + cfg.get("num_nextn_predict_layers", 0)):
        prefix = f"model.layers.{layer}.mlp"
        for m in ("gate_proj", "down_proj", "up_proj"):
            if f"{prefix}.experts.0.{m}.weight" in t:
                stack = [t.pop(f"{prefix}.experts.{e}.{m}.weight") for e in range(n_experts)]
                t[f"{prefix}.switch_mlp.{m}.weight"] = mx.stack(stack)
    t = {
        k: (
            v.astype(mx.bfloat16)
            if "e_score_correction_bias" not in k and mx.issubdtype(v.dtype, mx.floating)
            else v
        )
        for k, v in t.items()
    }

    def cls_of(module: str) -> type:
        if module in classes:
            return classes[module]
        m = re.match(rf"^model\.layers\.{n_layers}\.(.+)$", module)
        if m is None:
            raise KeyError(module)
        inner = m.group(1)
        if inner in NEXTN_EXTRA:
            return NEXTN_EXTRA[inner]
        return classes[f"model.layers.{n_layers - 1}.{inner}"]  # decoder part: like the last layer

    out: dict[str, mx.array] = {}
    report: dict[str, list[str]] = {"quantized": [], "skipped": []}
    counts: dict[str, int] = {}
    modules = sorted({k.rsplit(".", 1)[0] for k in t})
    for module in modules:
        params = {k.rsplit(".", 1)[1]: v for k, v in t.items() if k.rsplit(".", 1)[0] == module}
        cls = cls_of(module)
        w = params.get("weight")
        if quant is not None and hasattr(cls, "to_quantized") and w is not None:
            gs, bits, mode = quant
            if w.shape[-1] % gs == 0:
                q = mx.quantize(w, gs, bits, mode=mode)
                out[f"{module}.weight"], out[f"{module}.scales"] = q[0], q[1]
                if len(q) > 2 and q[2] is not None:
                    out[f"{module}.biases"] = q[2]
                for name, v in params.items():
                    if name != "weight":
                        out[f"{module}.{name}"] = v
                report["quantized"].append(module)
                counts[module] = q[0].size * 32 // bits + (
                    params["bias"].size if "bias" in params else 0
                )
                continue
            report["skipped"].append(module)
        for name, v in params.items():
            out[f"{module}.{name}"] = v
        counts[module] = sum(v.size for v in params.values())
    return out, report, counts


def save_like_mlx_lm(d: Path, tensors: dict[str, mx.array], total_params: int) -> None:
    """mlx-lm's save_model for one shard: model.safetensors + index (weight_map sorted)."""
    mx.save_safetensors(str(d / "model.safetensors"), tensors, metadata={"format": "mlx"})
    index = {
        "metadata": {
            "total_size": sum(v.nbytes for v in tensors.values()),
            "total_parameters": total_params,
        },
        "weight_map": dict.fromkeys(sorted(tensors), "model.safetensors"),
    }
    with open(d / "model.safetensors.index.json", "w") as f:
        json.dump(index, f, indent=4)


# ----------------------------------------------------------------------------- decoding

FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


def unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """uint32 words -> codes, element j of a word in bits [j*bits, (j+1)*bits) (LSB first)."""
    assert words.dtype == np.uint32 and 32 % bits == 0
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits).astype(np.uint32)
    codes = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return codes.reshape(*words.shape[:-1], words.shape[-1] * per)


def e2m1(codes: np.ndarray) -> np.ndarray:
    mag = FP4_E2M1[codes & 7]
    return np.where(codes & 8, -mag, mag).astype(np.float32)


def e4m3(codes: np.ndarray) -> np.ndarray:
    """OCP FP8 E4M3 (fn): bias 7, no inf, 0x7f/0xff NaN."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = c & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7))
    val = np.where((c & 0x7F) == 0x7F, np.nan, val)
    return (sign * val).astype(np.float32)


def e8m0(codes: np.ndarray) -> np.ndarray:
    c = codes.astype(np.int64)
    return np.where(c == 255, np.nan, np.ldexp(1.0, c - 127)).astype(np.float32)


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (finite inputs)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def round_bf16(x: np.ndarray) -> np.ndarray:
    return bf16_to_f32(f32_to_bf16(x))


def np_dequantize(
    w: np.ndarray,
    scales: np.ndarray,
    biases: np.ndarray | None,
    gs: int,
    bits: int,
    mode: str,
    bf16_steps: bool = True,
) -> np.ndarray:
    """float32 result. Affine scales/biases are given as float32 (decoded from bfloat16).

    affine: w = scale * q + bias. With ``bf16_steps`` each operation is rounded to bfloat16
    (the scales' dtype) as mlx's CPU kernel does: bf16(bf16(scale * q) + bias); without it the
    arithmetic is float32 (differs from mlx in the last bf16 bit for some elements).
    fp modes: w = code_value * scale_value, exact in float32.
    """
    codes = unpack(w, bits)
    if mode == "affine":
        s = np.repeat(scales, gs, axis=-1)
        b = np.repeat(biases, gs, axis=-1)
        if bf16_steps:
            return round_bf16(round_bf16(s * codes.astype(np.float32)) + b)
        return (s * codes.astype(np.float32) + b).astype(np.float32)
    if mode in ("mxfp4", "nvfp4"):
        vals = e2m1(codes)
    elif mode == "mxfp8":
        vals = e4m3(codes)
    else:
        raise ValueError(mode)
    sc = e8m0(scales) if mode.startswith("mx") else e4m3(scales)
    return (vals * np.repeat(sc, gs, axis=-1)).astype(np.float32)


def decode_check(
    case_dir: Path, src_tensors: dict[str, mx.array], quant: tuple[int, int, str]
) -> dict[str, Any]:
    gs, bits, mode = quant
    t = load_mx(case_dir)
    m = DECODE_MODULE
    names = sorted(k for k in t if k.startswith(m + "."))
    stored = {
        k: {"dtype": str(t[k].dtype).removeprefix("mlx.core."), "shape": list(t[k].shape)}
        for k in names
    }
    w, s = t[f"{m}.weight"], t[f"{m}.scales"]
    b = t.get(f"{m}.biases")
    ref32 = mx.dequantize(w, s, b, group_size=gs, bits=bits, mode=mode, dtype=mx.float32)
    ref_default = mx.dequantize(w, s, b, group_size=gs, bits=bits, mode=mode)
    wn = np.array(w)
    if mode == "affine":
        sn = bf16_to_f32(np.array(s.view(mx.uint16)))
        bn = bf16_to_f32(np.array(b.view(mx.uint16)))
    else:
        sn, bn = np.array(s), None
    mine = np_dequantize(wn, sn, bn, gs, bits, mode)
    plain = np_dequantize(wn, sn, bn, gs, bits, mode, bf16_steps=False)
    ref32n = np.array(ref32)
    mine_bf16 = f32_to_bf16(mine)  # the default output dtype is bfloat16
    ref_def_raw = (
        np.array(ref_default.view(mx.uint16)) if ref_default.dtype == mx.bfloat16 else None
    )
    source = np.array(src_tensors[f"{m}.weight"].astype(mx.float32))
    return {
        "module": m,
        "group_size": gs,
        "bits": bits,
        "mode": mode,
        "stored": stored,
        "mx_dequantize_float32_equals_numpy_bitwise": bool(
            np.array_equal(ref32n.view(np.uint32), mine.view(np.uint32))
        ),
        "mx_dequantize_default_dtype": str(ref_default.dtype).removeprefix("mlx.core."),
        "mx_dequantize_default_equals_numpy_rounded_to_bf16": (
            bool(np.array_equal(ref_def_raw, mine_bf16)) if ref_def_raw is not None else None
        ),
        "affine_plain_float32_arithmetic_max_abs_diff_vs_mx": (
            float(np.max(np.abs(plain - ref32n))) if mode == "affine" else None
        ),
        "affine_plain_float32_arithmetic_elements_differing": (
            int(np.sum(plain != ref32n)) if mode == "affine" else None
        ),
        "elements": int(mine.size),
        "affine_negative_scales_in_case": (
            [
                int(
                    sum(
                        int((np.array(v.astype(mx.float32)) < 0).sum())
                        for k, v in t.items()
                        if k.endswith(".scales")
                    )
                ),
                int(sum(v.size for k, v in t.items() if k.endswith(".scales"))),
            ]
            if mode == "affine"
            else None
        ),
        "max_abs_error_vs_source_weight": float(np.max(np.abs(mine - source))),
        "source_weight_max_abs": float(np.max(np.abs(source))),
    }


# ----------------------------------------------------------------------------- cases


def copy_output(produced: Path, case_dir: Path) -> list[str]:
    case_dir.mkdir()
    kept = []
    for f in sorted(produced.iterdir()):
        if f.name in KEEP or f.suffix == ".safetensors":
            shutil.copy(f, case_dir / f.name)
            kept.append(f.name)
    return kept


def tensor_summary(d: Path) -> dict[str, Any]:
    t = read_dir_tensors(d)
    return {
        "tensors": len(t),
        "mtp_tensors": sorted(
            k for k in t if k.startswith("model.layers.2.") or k.startswith("model.layers.61.")
        ),
        "dtypes": dict(
            sorted(
                {
                    dt: sum(1 for v in t.values() if v[0] == dt)
                    for dt in {v[0] for v in t.values()}
                }.items()
            )
        ),
    }


def prove_and_build_intact(
    fixture: str, src: Path, lost: Path, intact: Path, quant: tuple[int, int, str] | None
) -> dict[str, Any]:
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    src_t = load_mx(src)
    mine, report, counts = mlx_layout(src_t, cfg, quant)
    written = read_dir_tensors(lost)
    n_layers = cfg["num_hidden_layers"]
    mtp_prefix = f"model.layers.{n_layers}."
    mismatches = []
    for name, (dtype, shape, raw) in sorted(written.items()):
        if name not in mine:
            mismatches.append(f"{name}: not produced")
            continue
        a = mine[name]
        if (MX_TO_ST[a.dtype], list(a.shape), mx_bytes(a)) != (dtype, shape, raw):
            mismatches.append(f"{name}: differs")
    extra = sorted(set(mine) - set(written))
    not_mtp = [k for k in extra if not k.startswith(mtp_prefix)]
    main_params = sum(n for m, n in counts.items() if not m.startswith(mtp_prefix))
    mtp_params = sum(n for m, n in counts.items() if m.startswith(mtp_prefix))
    lost_index = json.loads((lost / "model.safetensors.index.json").read_text(encoding="utf-8"))
    proof = {
        "main_tensors_written_by_mlx_lm": len(written),
        "main_tensors_reproduced_byte_for_byte": len(written) - len(mismatches),
        "mismatches": mismatches,
        "extra_tensors_not_mtp": not_mtp,
        "total_parameters_reproduced": main_params == lost_index["metadata"]["total_parameters"],
        "example": None,
    }
    example = "model.layers.1.mlp.switch_mlp.gate_proj.weight"
    if example in written:
        proof["example"] = {
            "tensor": example,
            "mlx_lm": {
                "dtype": written[example][0],
                "shape": written[example][1],
                "sha256": hashlib.sha256(written[example][2]).hexdigest(),
            },
            "this_script": {
                "dtype": MX_TO_ST[mine[example].dtype],
                "shape": list(mine[example].shape),
                "sha256": hashlib.sha256(mx_bytes(mine[example])).hexdigest(),
            },
        }
    if mismatches or not_mtp or not proof["total_parameters_reproduced"]:
        raise SystemExit(f"{fixture}: layout not reproduced: {json.dumps(proof, indent=1)[:2000]}")

    # intact = what mlx-lm wrote (its own tensors, untouched) + this script's MTP tensors
    lost_t = load_mx(lost)
    mtp_t = {k: v for k, v in mine.items() if k.startswith(mtp_prefix)}
    combined = {**lost_t, **mtp_t}
    intact.mkdir()
    shutil.copy(lost / "config.json", intact / "config.json")
    save_like_mlx_lm(intact, combined, lost_index["metadata"]["total_parameters"] + mtp_params)
    return {
        "proof": proof,
        "main_modules_quantized": sum(
            1 for m in report["quantized"] if not m.startswith(mtp_prefix)
        ),
        "main_modules_left_unquantized_by_group_size": sorted(
            m for m in report["skipped"] if not m.startswith(mtp_prefix)
        ),
        "mtp_modules_quantized": sorted(m for m in report["quantized"] if m.startswith(mtp_prefix)),
        "mtp_modules_left_unquantized_by_group_size": sorted(
            m for m in report["skipped"] if m.startswith(mtp_prefix)
        ),
        "mtp_tensors_added": {
            k: {"dtype": str(v.dtype).removeprefix("mlx.core."), "shape": list(v.shape)}
            for k, v in sorted(mtp_t.items())
        },
    }


def mlx_lm_loads(d: Path) -> dict[str, Any]:
    """Does mlx-lm's own loader (strict) take the directory back? (It needs no tokenizer.)"""
    from mlx_lm.utils import load_model

    try:
        model, _ = load_model(d)
    except Exception as exc:  # recorded, not raised: a refusal is a result too
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    from mlx.utils import tree_flatten

    names = [k for k, _ in tree_flatten(model.parameters())]
    return {
        "ok": True,
        "parameters_in_model": len(names),
        "mtp_in_model": any(k.startswith("model.layers.2.") for k in names),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    out, work = args.out, args.work
    out.mkdir(parents=True)
    import mlx_lm
    import tokenizers
    import transformers

    manifest: dict[str, Any] = {
        "versions": {
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
            "device": str(mx.default_device()),
        },
        "refusals": refusals(work, out),
        "cases": {},
    }
    sources = make_sources(work)
    for fixture, src in sources.items():
        d = out / f"source-{fixture}"
        d.mkdir()
        for f in sorted(src.iterdir()):
            if f.name in KEEP or f.suffix == ".safetensors":
                shutil.copy(f, d / f.name)

    for fixture, modes in PLAN:
        src = sources[fixture]
        for mode in modes:
            flags, quant = MODES[mode]
            name = f"{fixture}-{mode}-lost"
            produced = work / "mlx" / name
            proc = run_convert(src, produced, flags)
            if proc.returncode != 0:
                raise SystemExit(f"{name}: mlx-lm failed:\n{proc.stderr[-3000:]}")
            kept = copy_output(produced, out / name)
            cfg = json.loads((out / name / "config.json").read_text(encoding="utf-8"))
            entry = {
                "source": f"source-{fixture}",
                "command": " ".join(
                    [
                        "python -m mlx_lm convert",
                        "--hf-path",
                        f"source-{fixture}",
                        "--mlx-path",
                        name,
                        "--dtype",
                        "bfloat16",
                        *flags,
                    ]
                ),
                "mlx_lm_log": [
                    line for line in proc.stdout.splitlines() if line.startswith("[INFO]")
                ],
                "mtp": "lost",
                "config_num_nextn_predict_layers": cfg.get("num_nextn_predict_layers"),
                "config_quantization": cfg.get("quantization"),
                "files": kept,
                "mlx_lm_load_model": mlx_lm_loads(out / name),
                **tensor_summary(out / name),
            }
            manifest["cases"][name] = entry
            if fixture.startswith("glm4_moe"):
                iname = f"{fixture}-{mode}-intact"
                skip = f"{fixture}-{mode}" in NO_INTACT
                target = work / "not-shipped" / iname if skip else out / iname
                target.parent.mkdir(exist_ok=True)
                info = prove_and_build_intact(fixture, src, out / name, target, quant)
                entry["layout_proof"] = info.pop("proof")
                entry["modules_quantized"] = info.pop("main_modules_quantized")
                entry["modules_left_unquantized_by_group_size"] = info.pop(
                    "main_modules_left_unquantized_by_group_size"
                )
                if not skip:
                    manifest["cases"][iname] = {
                        "source": f"source-{fixture}",
                        "derived_from": name,
                        "mtp": "intact",
                        "how": "mlx-lm's output plus the source MTP layer model.layers.2.*,"
                        " laid out and quantized by make.py's mlx_layout()",
                        "config_num_nextn_predict_layers": cfg.get("num_nextn_predict_layers"),
                        "config_quantization": cfg.get("quantization"),
                        **info,
                        "mlx_lm_load_model": mlx_lm_loads(out / iname),
                        **{
                            k: v
                            for k, v in tensor_summary(out / iname).items()
                            if k != "mtp_tensors"
                        },
                    }
            if quant is not None and fixture == "glm4_moe_wide":
                entry["decode_check"] = decode_check(out / name, load_mx(src), quant)
    write_json(out / "MANIFEST.json", manifest)
    for p in sorted(out.rglob("*")):
        if p.is_file():
            os.chmod(p, 0o644)


if __name__ == "__main__":
    main()
