"""Write ``tests/data/bitsandbytes/``: bitsandbytes checkpoints of the tiny MTP fixtures.

Run by ``regenerate.sh`` (which builds the pinned venv) from the repository root::

    .venv-bitsandbytes/bin/python tests/thirdparty/bitsandbytes/make.py --out OUT

(``regenerate.sh`` writes into a temp dir, adds ``versions.txt`` and only then
replaces ``tests/data/bitsandbytes``.)

For each source fixture (``deepseek_v3``, ``glm4_moe``) and each scheme
(``nf4``, ``nf4_dq``, ``fp4``, ``int8``) two cases are written:

``<fixture>-<scheme>-lost``
    transformers' own route: ``AutoModelForCausalLM.from_pretrained(src,
    quantization_config=BitsAndBytesConfig(...), device_map="cpu")`` then
    ``save_pretrained``.  transformers builds no MTP module, so the MTP layer
    (``model.layers.2.*``) is dropped while ``config.json`` still declares
    ``num_nextn_predict_layers: 1``.  Kept: ``config.json`` and the safetensors
    files (``generation_config.json`` is dropped).

``<fixture>-<scheme>-intact``
    the ``-lost`` output plus the source MTP layer, every MTP tensor stored the
    way transformers + bitsandbytes stored its main-layer twin (see
    ``mtp_twin``): Linear weights whose twin transformers quantized (and
    ``eh_proj``, which has no twin) are quantized with bitsandbytes' own
    modules, built with the arguments transformers' ``replace_with_bnb_linear``
    passes and quantized the way its ``Bnb4bitQuantize`` / ``Bnb8bitQuantize``
    do; the state-dict entries come from bitsandbytes'
    ``Linear4bit._save_to_state_dict`` / ``Linear8bitLt._save_to_state_dict``.
    Every other MTP tensor is cast to the dtype transformers wrote its twin
    in.  Written as one ``model.safetensors`` like the ``-lost`` case.

Checks run on every regeneration (the run fails if one does not hold):

* the MTP quantizer reproduces, byte for byte (names, dtypes, shapes, data),
  every quantized main-layer Linear transformers wrote, when fed the same
  source weight; every unquantized main tensor equals the source cast to
  the dtype transformers wrote;
* the ``-intact`` file holds every ``-lost`` tensor with identical bytes;
* each quantized MTP Linear, dequantized by bitsandbytes, is close to its
  source weight (max error recorded in MANIFEST.json);
* transformers loads each ``-intact`` copy back (no missing keys; the MTP
  keys reported unexpected) into a model whose state_dict equals, byte for
  byte, that of the ``-lost`` copy loaded back; a forward pass on a fixed
  input gives equal logits, or fails with the same error for both copies
  (bitsandbytes 0.50.2's ``MatMul8bitLt`` mis-shapes the 4-D input
  DeepSeek-V3's ``kv_b_proj`` gets; recorded in MANIFEST.json).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
FIXTURES = ("deepseek_v3", "glm4_moe")
SCHEMES: dict[str, dict] = {
    "nf4": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": False},
    "nf4_dq": {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
    },
    "fp4": {"load_in_4bit": True, "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False},
    "int8": {"load_in_8bit": True},
}
PACKAGES = ("torch", "bitsandbytes", "transformers", "accelerate", "safetensors", "numpy")
# MTP modules whose twin is a top-level module (everything else: same name in the last main layer)
TOP_LEVEL_TWIN = {
    "embed_tokens": "model.embed_tokens",
    "shared_head.head": "lm_head",
    "shared_head.norm": "model.norm",
    "enorm": "model.norm",
    "hnorm": "model.norm",
}
# MTP Linears with no main-layer twin: quantized like the other Linears
NO_TWIN_LINEAR = ("eh_proj",)
SEED = 0
# every state_dict entry bitsandbytes' Linear4bit / Linear8bitLt write for a weight
QUANT_PARTS = (
    "weight",
    "weight.absmax",
    "weight.quant_map",
    "weight.nested_absmax",
    "weight.nested_quant_map",
    "weight.quant_state.bitsandbytes__nf4",
    "weight.quant_state.bitsandbytes__fp4",
    "SCB",
    "weight_format",
)


# --------------------------------------------------------------------------- #
# safetensors helpers
# --------------------------------------------------------------------------- #


def read_header(path: Path) -> dict:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return json.loads(fh.read(n))


def load_dir(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """All tensors of a checkpoint directory and their header entries."""
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    header: dict[str, dict] = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
        for name, info in read_header(path).items():
            if name != "__metadata__":
                header[name] = {"dtype": info["dtype"], "shape": info["shape"], "file": path.name}
    return tensors, header


def raw(t: torch.Tensor) -> bytes:
    """The bytes safetensors stores for a tensor."""
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and raw(a) == raw(b)


# --------------------------------------------------------------------------- #
# bitsandbytes, called the way transformers 5 calls it
# --------------------------------------------------------------------------- #


class BnbLinearQuantizer:
    """Quantize one Linear weight as transformers + bitsandbytes do.

    Module construction copies ``transformers.integrations.bitsandbytes.
    replace_with_bnb_linear``; the quantization copies ``Bnb4bitQuantize`` /
    ``Bnb8bitQuantize`` (``Params4bit(value, requires_grad=False,
    **old.__dict__).to(device)`` / ``Int8Params(value.to("cpu"),
    requires_grad=False, **kwargs).to(device)``); the serialized entries are
    bitsandbytes' own ``_save_to_state_dict`` output (``module.state_dict()``).
    The bias, if any, is not part of this (it is stored unquantized).
    """

    def __init__(self, config):
        self.config = config  # transformers BitsAndBytesConfig

    def __call__(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        import bitsandbytes as bnb

        cfg = self.config
        out_features, in_features = weight.shape
        with torch.device("meta"):
            if cfg.quantization_method() == "llm_int8":
                module = bnb.nn.Linear8bitLt(
                    in_features,
                    out_features,
                    False,
                    has_fp16_weights=cfg.llm_int8_has_fp16_weight,
                    threshold=cfg.llm_int8_threshold,
                )
            else:
                module = bnb.nn.Linear4bit(
                    in_features,
                    out_features,
                    False,
                    cfg.bnb_4bit_compute_dtype,
                    compress_statistics=cfg.bnb_4bit_use_double_quant,
                    quant_type=cfg.bnb_4bit_quant_type,
                    quant_storage=cfg.bnb_4bit_quant_storage,
                )
        module.requires_grad_(False)
        old = module.weight
        if cfg.quantization_method() == "llm_int8":
            kwargs = dict(old.__dict__)
            kwargs.pop("SCB", None)
            module.weight = bnb.nn.Int8Params(weight.to("cpu"), requires_grad=False, **kwargs).to(
                weight.device
            )
        else:
            module.weight = bnb.nn.Params4bit(weight, requires_grad=False, **old.__dict__).to(
                weight.device
            )
        return {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}

    def functional(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """The same through bitsandbytes.functional directly (a second check of the module)."""
        import bitsandbytes.functional as F

        cfg = self.config
        if cfg.quantization_method() == "llm_int8":
            cb, scb, _ = F.int8_vectorwise_quant(weight.to(torch.float16))
            return {"weight": cb, "SCB": scb, "weight_format": torch.tensor(0, dtype=torch.uint8)}
        q, state = F.quantize_4bit(
            weight,
            blocksize=64,  # Params4bit's default when transformers passes none
            compress_statistics=cfg.bnb_4bit_use_double_quant,
            quant_type=cfg.bnb_4bit_quant_type,
            quant_storage=cfg.bnb_4bit_quant_storage,
        )
        return {"weight": q, **{f"weight.{k}": v for k, v in state.as_dict(packed=True).items()}}

    def dequantize(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """Decode stored entries with bitsandbytes (for the closeness check)."""
        import bitsandbytes as bnb

        if self.config.quantization_method() == "llm_int8":
            return bnb.functional.int8_vectorwise_dequant(parts["weight"], parts["SCB"]).float()
        stats = {k: v for k, v in parts.items() if k != "weight"}
        p = bnb.nn.Params4bit.from_prequantized(
            data=parts["weight"], quantized_stats=stats, device="cpu"
        )
        return bnb.functional.dequantize_4bit(p.data, p.quant_state).float()


def quantized_modules(header: dict[str, dict]) -> set[str]:
    """Modules whose weight bitsandbytes quantized, from a checkpoint's tensor names."""
    mods = set()
    for name in header:
        if ".weight.quant_state.bitsandbytes__" in name:
            mods.add(name.split(".weight.quant_state.")[0])
        elif name.endswith(".SCB"):
            mods.add(name[: -len(".SCB")])
    return mods


def module_parts(tensors: dict[str, torch.Tensor], module: str) -> dict[str, torch.Tensor]:
    """Stored entries of one quantized module (bias excluded), keyed as in its state_dict."""
    return {k: tensors[f"{module}.{k}"] for k in QUANT_PARTS if f"{module}.{k}" in tensors}


# --------------------------------------------------------------------------- #
# one case
# --------------------------------------------------------------------------- #


def source_config(fixture: str) -> dict:
    return json.loads((REPO / "fixtures" / fixture / "config.json").read_text())


def mtp_layer_index(cfg: dict) -> int:
    assert int(cfg["num_nextn_predict_layers"]) == 1
    return int(cfg["num_hidden_layers"])


def mtp_twin(mtp_module: str, last_main: int) -> str | None:
    """Main-model module whose stored form an MTP module copies (None: a Linear with no twin)."""
    if mtp_module in NO_TWIN_LINEAR:
        return None
    if mtp_module in TOP_LEVEL_TWIN:
        return TOP_LEVEL_TWIN[mtp_module]
    return f"model.layers.{last_main}.{mtp_module}"


def run_transformers(fixture: str, scheme: str, work: Path):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    torch.manual_seed(SEED)
    qconfig = BitsAndBytesConfig(**SCHEMES[scheme])
    model, info = AutoModelForCausalLM.from_pretrained(
        f"fixtures/{fixture}",
        quantization_config=qconfig,
        device_map="cpu",
        output_loading_info=True,
    )
    model.save_pretrained(work)
    return model.config.quantization_config, info


def keep_files(src: Path, dst: Path) -> list[str]:
    dst.mkdir(parents=True)
    kept = []
    for path in sorted(src.iterdir()):
        if (
            path.name in ("config.json", "model.safetensors.index.json")
            or path.suffix == ".safetensors"
        ):
            shutil.copyfile(path, dst / path.name)
            kept.append(path.name)
    return kept


def proof(src_t, lost_t, quantizer, qmods) -> dict:
    """Quantize each source weight transformers quantized; compare with what it wrote."""
    checked, tensors = 0, 0
    for mod in sorted(qmods):
        theirs = module_parts(lost_t, mod)
        for route in (quantizer, quantizer.functional):
            mine = route(src_t[mod + ".weight"])
            if set(mine) != set(theirs):
                raise SystemExit(
                    f"proof: {mod}: entries differ: {sorted(mine)} vs {sorted(theirs)}"
                )
            for k in mine:
                if not same(mine[k], theirs[k]):
                    raise SystemExit(
                        f"proof: {mod}.{k}: bytes differ ({getattr(route, '__name__', 'module')})"
                    )
        tensors += len(theirs)
        checked += 1
    # unquantized tensors: transformers' output == source cast to the dtype it wrote
    quant_names = {f"{m}.{k}" for m in qmods for k in module_parts(lost_t, m)}
    plain = 0
    for name, t in lost_t.items():
        if name in quant_names:
            continue
        if not same(src_t[name].to(t.dtype), t):
            raise SystemExit(f"proof: {name}: not the source cast to {t.dtype}")
        plain += 1
    return {
        "quantized_linears": checked,
        "quantized_entries": tensors,
        "routes": ["bnb.nn.Linear4bit|Linear8bitLt state_dict", "bitsandbytes.functional"],
        "plain_tensors": plain,
        "identical": True,
    }


def build_mtp(src_t, lost_t, lost_h, quantizer, qmods, mtp: int) -> tuple[dict, dict, dict]:
    """MTP tensors in transformers' stored form; also {mtp module: how} and dequant errors."""
    prefix = f"model.layers.{mtp}."
    last_main = mtp - 1
    modules: dict[str, list[str]] = {}
    for name in sorted(src_t):
        if name.startswith(prefix):
            mod, leaf = name[len(prefix) :].rsplit(".", 1)
            modules.setdefault(mod, []).append(leaf)
    out: dict[str, torch.Tensor] = {}
    how: dict[str, str] = {}
    errors: dict[str, float] = {}
    for mod, leaves in modules.items():
        twin = mtp_twin(mod, last_main)
        full = prefix + mod
        if twin is None or twin in qmods:
            w = src_t[full + ".weight"]
            parts = quantizer(w)
            for k, v in parts.items():
                out[f"{full}.{k}"] = v
            err = (quantizer.dequantize(parts) - w.float()).abs().max().item()
            errors[full] = round(err, 6)
            how[full] = "quantized (no twin)" if twin is None else f"quantized like {twin}"
            rest = [leaf for leaf in leaves if leaf != "weight"]
        else:
            how[full] = f"dtype of {twin}"
            rest = leaves
        for leaf in rest:
            twin_name = f"{twin}.{leaf}"
            if twin_name not in lost_h:
                raise SystemExit(f"{full}.{leaf}: no twin {twin_name} in transformers' output")
            out[f"{full}.{leaf}"] = src_t[f"{full}.{leaf}"].to(lost_t[twin_name].dtype).contiguous()
    return out, how, errors


def use_the_generic_cpu_kernel() -> None:
    """Run 4-bit forwards on bitsandbytes' generic CPU kernel on every host.

    On a CPU with AVX512-BF16, bitsandbytes 0.50.2's ``Linear4bit`` repacks its weight on the
    first forward and asserts that ``out_features`` is a multiple of 32; the fixtures' 16-wide
    layers fail it ("N must be divisible by block_n"). The kernel is chosen when the module is
    built (``Linear4bit.support_avx512bf16_for_cpu``); the stored bytes do not depend on it.
    Pinning the generic kernel keeps the recorded forward outcome the same on every machine.
    """
    import bitsandbytes.nn.modules as modules

    modules.has_avx512bf16 = lambda: False


def load_back(directory: Path) -> tuple[dict, torch.Tensor | None, str | None, dict]:
    """Load a case with transformers: state_dict, logits on a fixed input (or the error), info."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    model, info = AutoModelForCausalLM.from_pretrained(
        str(directory), device_map="cpu", output_loading_info=True
    )
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ids = torch.arange(8).reshape(1, 8) % model.config.vocab_size
    try:
        with torch.no_grad():
            return state, model(ids).logits.float(), None, info
    except Exception as exc:  # noqa: BLE001 - recorded, and must match between -lost and -intact
        return state, None, f"{type(exc).__name__}: {exc}", info


def dtype_counts(header: dict[str, dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for info in header.values():
        counts[info["dtype"]] = counts.get(info["dtype"], 0) + 1
    return dict(sorted(counts.items()))


def run_case(fixture: str, scheme: str, out: Path) -> list[dict]:
    from safetensors.torch import save_file

    cfg = source_config(fixture)
    mtp = mtp_layer_index(cfg)
    src_t, _ = load_dir(REPO / "fixtures" / fixture)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "out"
        qconfig, info = run_transformers(fixture, scheme, work)
        lost = out / f"{fixture}-{scheme}-lost"
        kept = keep_files(work, lost)
    lost_t, lost_h = load_dir(lost)
    if any(k.startswith(f"model.layers.{mtp}.") for k in lost_h):
        raise SystemExit(f"{lost.name}: transformers kept MTP tensors; the case name is wrong")
    quantizer = BnbLinearQuantizer(qconfig)
    qmods = quantized_modules(lost_h)
    check = proof(src_t, lost_t, quantizer, qmods)

    mtp_t, how, errors = build_mtp(src_t, lost_t, lost_h, quantizer, qmods, mtp)
    intact = out / f"{fixture}-{scheme}-intact"
    intact.mkdir(parents=True)
    shutil.copyfile(lost / "config.json", intact / "config.json")
    if kept != ["config.json", "model.safetensors"]:
        raise SystemExit(f"{lost.name}: expected one model.safetensors, got {kept}")
    meta = read_header(lost / "model.safetensors").get("__metadata__")
    save_file({**lost_t, **mtp_t}, str(intact / "model.safetensors"), metadata=meta)
    for path in (*lost.iterdir(), *intact.iterdir()):
        path.chmod(0o644)  # save_file creates 0600

    intact_t, intact_h = load_dir(intact)
    for name, t in lost_t.items():
        if not same(intact_t[name], t):
            raise SystemExit(f"{intact.name}: {name} differs from the -lost copy")
    for name, t in mtp_t.items():
        if not same(intact_t[name], t):
            raise SystemExit(f"{intact.name}: {name} not written as built")

    lost_state, lost_logits, lost_err, _ = load_back(lost)
    intact_state, intact_logits, intact_err, intact_info = load_back(intact)
    if intact_info["missing_keys"]:
        raise SystemExit(
            f"{intact.name}: transformers reports missing keys {intact_info['missing_keys']}"
        )
    if set(lost_state) != set(intact_state) or not all(
        same(lost_state[k], intact_state[k]) for k in lost_state
    ):
        raise SystemExit(f"{intact.name}: loaded model differs from the loaded -lost copy")
    if lost_err is None and intact_err is None and torch.equal(lost_logits, intact_logits):
        forward = "logits on a fixed input equal to the -lost copy's"
    elif lost_err is not None and lost_err == intact_err:
        forward = (
            f"forward fails alike for -lost and -intact (bitsandbytes, not the files): {lost_err}"
        )
    else:
        raise SystemExit(
            f"{intact.name}: forward differs from the -lost copy: {lost_err} / {intact_err}"
        )
    mtp_prefix = f"model.layers.{mtp}."
    unexpected = sorted(info["unexpected_keys"])
    base = {
        "source": f"fixtures/{fixture}",
        "scheme": scheme,
        "bitsandbytes_config": SCHEMES[scheme],
    }
    lost_entry = {
        **base,
        "case": lost.name,
        "mtp": "lost",
        "files": sorted(p.name for p in lost.iterdir()),
        "transformers_load": {
            "missing_keys": sorted(info["missing_keys"]),
            "unexpected_keys": len(unexpected),
            "unexpected_all_mtp": all(k.startswith(mtp_prefix) for k in unexpected),
        },
        "quantized_linears": len(qmods),
        "byte_identity_check": check,
        "tensor_count": len(lost_h),
        "tensors_by_dtype": dtype_counts(lost_h),
    }
    short = {k[len(mtp_prefix) :]: v for k, v in how.items()}
    intact_entry = {
        **base,
        "case": intact.name,
        "mtp": "intact",
        "derived_from": lost.name,
        "files": sorted(p.name for p in intact.iterdir()),
        "mtp_quantized_linears": sorted(k for k, v in short.items() if v.startswith("quantized")),
        "mtp_dequant_max_abs_error": max(errors.values()),
        "loadback": {
            "missing_keys": sorted(intact_info["missing_keys"]),
            "unexpected_keys": len(intact_info["unexpected_keys"]),
            "unexpected_all_mtp": all(
                k.startswith(mtp_prefix) for k in intact_info["unexpected_keys"]
            ),
            "state_dict_equal_to_lost": True,
            "forward": forward,
        },
        "tensor_count": len(intact_h),
        "mtp_tensors_by_dtype": dtype_counts(
            {k: v for k, v in intact_h.items() if k.startswith(mtp_prefix)}
        ),
    }
    print(
        f"{lost.name}: {len(lost_h)} tensors, {len(qmods)} quantized Linears, "
        f"{check['quantized_entries']} entries byte-identical to our quantizer "
        "(bnb.nn module route and bitsandbytes.functional route), "
        f"{check['plain_tensors']} plain"
    )
    print(
        f"{intact.name}: +{len(mtp_t)} MTP tensors; loads back with "
        f"{len(intact_info['unexpected_keys'])} "
        f"unexpected keys, loaded state equal to -lost; {forward}"
    )
    return [lost_entry, intact_entry]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data/bitsandbytes")
    args = ap.parse_args()
    out_arg = Path(args.out).resolve()
    os.chdir(REPO)  # relative source paths: fixtures/<name>
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.getLogger("bitsandbytes").setLevel(
        logging.ERROR
    )  # "MatMul8bitLt: inputs will be cast ..."
    hf_logging.disable_progress_bar()
    use_the_generic_cpu_kernel()
    torch.use_deterministic_algorithms(True)
    out = out_arg
    out.mkdir(parents=True, exist_ok=True)
    for fixture in FIXTURES:
        for scheme in SCHEMES:
            for state in ("lost", "intact"):
                shutil.rmtree(out / f"{fixture}-{scheme}-{state}", ignore_errors=True)
    entries = []
    for fixture in FIXTURES:
        for scheme in SCHEMES:
            entries.extend(run_case(fixture, scheme, out))
    manifest = {
        "tool": "bitsandbytes via transformers (from_pretrained + save_pretrained)",
        "versions": {p: importlib.metadata.version(p) for p in PACKAGES},
        "cases": entries,
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(entries)} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
