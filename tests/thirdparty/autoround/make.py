"""Regenerate ``tests/data/autoround/``: int-quantized checkpoints written by the real tools.

Run by ``regenerate.sh`` (which builds the two virtual environments); by hand::

    VENV/bin/python tests/thirdparty/autoround/make.py --tool autoround [--out DIR] [--case SUBSTR]
    GVENV/bin/python tests/thirdparty/autoround/make.py --tool gptqmodel [--out DIR] [--case SUBSTR]
    VENV/bin/python tests/thirdparty/autoround/make.py --verify [--out DIR]

Tools: auto-round 0.16.1 (its transformers route ``AutoRound(model, tokenizer, ...)`` and
its model-free route ``AutoRound(model=path, model_free=True)``) and gptqmodel 7.7.0
(``GPTQModel.load`` + ``quantize`` + ``save``), all on CPU, seeded, RTN (``iters=0``,
``disable_opt_rtn=True``) for auto-round and GPTQ with 16 random calibration rows for
gptqmodel.

Sources (see NOTES.md for why two kinds):

* the shipped fixtures ``fixtures/deepseek_v3`` and ``fixtures/glm4_moe`` (hidden 16):
  used by the model-free route, and by one transformers-route case that shows what
  auto-round does to them as they are (it quantizes none of their main layers);
* ``<name>_w32``: the same two families rebuilt, with the repository's own
  ``fixtures/make_fixtures.py`` functions, with every Linear dimension a multiple of 32
  (hidden 32), which auto-round's transformers route and gptqmodel need.  They are
  written into ``OUT/sources/`` so a test can compare a quantized case with its source.

Each case is run in a subprocess of its own (the MTP copy switch
``AR_DISABLE_COPY_MTP_WEIGHTS`` is an environment variable).  Of each output the case
directory keeps ``config.json``, ``*.safetensors``, ``model.safetensors.index.json``,
``quantization_config.json`` (auto-round) and ``quantize_config.json`` (gptqmodel);
tokenizer files, ``generation_config.json`` and gptqmodel's ``quant_log.csv`` (timings)
are dropped.  ``OUT/MANIFEST.json`` records per case the call, the versions, the
quantization_config and what happened to the MTP layer (computed from the written
tensors); ``--verify`` adds, per format, a check that one layer decoded with the tool's
own code equals the numpy rule written in NOTES.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "autoround"
KEEP_NAMES = {
    "config.json",
    "model.safetensors.index.json",
    "quantization_config.json",
    "quantize_config.json",
}
SEED = 0
VOCAB = 64
#: Linear layers whose dims are not multiples of 32 cannot be packed by auto-round's
#: transformers route (see NOTES.md); the *_w32 sources use these dims instead.
WIDE = {
    "deepseek_v3": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "moe_intermediate_size": 32,
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
    },
    "glm4_moe": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "moe_intermediate_size": 32,
        "head_dim": 32,
    },
}
MTP_PREFIX = "model.layers.2."  # both families: num_hidden_layers 2, num_nextn_predict_layers 1

# --------------------------------------------------------------------------- #
# case table
# --------------------------------------------------------------------------- #


def _case(tool, route, fixture, fmt, bits, mtp, **kw):
    name = f"{tool}-{route}-{fixture}-{fmt}-{bits}b-{mtp}"
    return {
        "name": name,
        "tool": tool,
        "route": route,
        "fixture": fixture,
        "format": fmt,
        "bits": bits,
        "expected_mtp": mtp,
        **kw,
    }


def cases() -> list[dict]:
    ar_tf = {"group_size": 16, "sym": True}
    out = [
        # transformers route, widened sources, group 16
        _case(
            "autoround", "transformers", "deepseek_v3_w32", "auto_round", 4, "quantized", **ar_tf
        ),
        _case(
            "autoround",
            "transformers",
            "deepseek_v3_w32",
            "auto_round",
            4,
            "lost",
            copy_mtp=False,
            **ar_tf,
        ),
        # asym auto_round from this route is packed as auto_round:auto_awq;
        # its MTP is copied back in BF16
        _case(
            "autoround",
            "transformers",
            "deepseek_v3_w32",
            "auto_round_asym",
            4,
            "bf16",
            group_size=16,
            sym=False,
        ),
        _case(
            "autoround", "transformers", "deepseek_v3_w32", "auto_round", 8, "quantized", **ar_tf
        ),
        # 2-bit: the MTP copy-back packs the MTP at 4 bits
        # (auto_round/utils/missing_tensors.py falls back from 2 to 4)
        _case(
            "autoround",
            "transformers",
            "deepseek_v3_w32",
            "auto_round",
            2,
            "quantized-at-4b",
            **ar_tf,
        ),
        _case("autoround", "transformers", "deepseek_v3_w32", "auto_gptq", 4, "bf16", **ar_tf),
        _case(
            "autoround",
            "transformers",
            "deepseek_v3_w32",
            "auto_gptq",
            4,
            "lost",
            copy_mtp=False,
            **ar_tf,
        ),
        _case(
            "autoround",
            "transformers",
            "deepseek_v3_w32",
            "auto_gptq_asym",
            4,
            "bf16",
            group_size=16,
            sym=False,
        ),
        _case("autoround", "transformers", "deepseek_v3_w32", "auto_gptq", 3, "bf16", **ar_tf),
        _case("autoround", "transformers", "deepseek_v3_w32", "auto_awq", 4, "bf16", **ar_tf),
        _case(
            "autoround",
            "transformers",
            "deepseek_v3_w32",
            "auto_awq_asym",
            4,
            "bf16",
            group_size=16,
            sym=False,
        ),
        _case("autoround", "transformers", "glm4_moe_w32", "auto_round", 4, "quantized", **ar_tf),
        _case("autoround", "transformers", "glm4_moe_w32", "auto_gptq", 4, "bf16", **ar_tf),
        # transformers route on the shipped fixture as it is (group 4)
        _case(
            "autoround",
            "transformers",
            "deepseek_v3",
            "auto_round",
            4,
            "quantized-main-unquantized",
            group_size=4,
            sym=True,
        ),
        # model-free route, shipped fixtures, group 4
        _case(
            "autoround",
            "modelfree",
            "deepseek_v3",
            "auto_round",
            4,
            "quantized",
            group_size=4,
            sym=True,
        ),
        _case(
            "autoround",
            "modelfree",
            "deepseek_v3",
            "auto_round_asym",
            4,
            "quantized",
            group_size=4,
            sym=False,
        ),
        _case(
            "autoround",
            "modelfree",
            "deepseek_v3",
            "auto_round",
            8,
            "quantized",
            group_size=4,
            sym=True,
        ),
        _case(
            "autoround",
            "modelfree",
            "deepseek_v3",
            "auto_round",
            2,
            "quantized",
            group_size=4,
            sym=True,
        ),
        _case(
            "autoround",
            "modelfree",
            "deepseek_v3",
            "auto_round",
            4,
            "ignored-bf16",
            group_size=4,
            sym=True,
            ignore_layers="model.layers.2",
        ),
        _case(
            "autoround",
            "modelfree",
            "glm4_moe",
            "auto_round",
            4,
            "quantized",
            group_size=4,
            sym=True,
        ),
        # gptqmodel, widened source, group 16 (TorchLinear accepts -1, 16, 32, ...)
        _case(
            "gptqmodel",
            "gptq",
            "deepseek_v3_w32",
            "gptq_descact",
            4,
            "lost",
            group_size=16,
            sym=True,
            desc_act=True,
        ),
        _case(
            "gptqmodel",
            "gptq",
            "deepseek_v3_w32",
            "gptq",
            4,
            "lost",
            group_size=16,
            sym=True,
            desc_act=False,
        ),
        # glm4_moe_w32 is not run: gptqmodel 7.7.0's defuser 0.0.28 fails on GLM-4.5 MoE blocks
        # with transformers 5.2x (AttributeError: 'tuple' object has no attribute 'sigmoid';
        # NOTES.md)
        # gptqmodel on the shipped fixture: only per-channel groups (-1) fit its 8/12-wide inputs
        _case(
            "gptqmodel",
            "gptq",
            "deepseek_v3",
            "gptq_descact",
            4,
            "lost",
            group_size=-1,
            sym=True,
            desc_act=True,
        ),
    ]
    return out


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


def read_headers(directory: Path) -> dict[str, tuple[str, list[int], str]]:
    out: dict[str, tuple[str, list[int], str]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                out[name] = (info["dtype"], info["shape"], path.name)
    return out


def versions(tool: str) -> dict[str, str]:
    names = ["torch", "transformers", "safetensors", "accelerate", "tokenizers", "numpy"]
    names = (["auto-round"] if tool == "autoround" else ["gptqmodel", "torchao", "defuser"]) + names

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {n: version(n) for n in names}


def load_make_fixtures():
    spec = importlib.util.spec_from_file_location(
        "make_fixtures", REPO / "fixtures" / "make_fixtures.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_fixtures"] = mod
    spec.loader.exec_module(mod)
    return mod


def build_wide_sources(dest: Path) -> None:
    """Write deepseek_v3_w32 / glm4_moe_w32 with fixtures/make_fixtures.py's own builders."""
    import transformers

    mf = load_make_fixtures()
    mf.HIDDEN = 32  # make_fixtures' MTP eh_proj is [HIDDEN, 2*HIDDEN]
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    fams = {f.name: f for f in mf.families()}
    with tempfile.TemporaryDirectory() as tmp:
        for name, dims in WIDE.items():
            fam = dataclasses.replace(
                fams[name], config_kwargs={**fams[name].config_kwargs, **dims}
            )
            built = mf.build_family(fam, Path(tmp))
            target = dest / f"{name}_w32"
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(built, target)


def source_path(fixture: str, out: Path) -> Path:
    if fixture.endswith("_w32"):
        return out / "sources" / fixture
    return REPO / "fixtures" / fixture


def tiny_tokenizer():
    """Word-level tokenizer with the fixtures' 64 ids (auto-round wants a tokenizer object)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, "<pad>": 3}
    for i in range(4, VOCAB):
        vocab[f"w{i}"] = i
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


def base_format(fmt: str) -> str:
    return fmt.removesuffix("_asym").removesuffix("_descact")


# --------------------------------------------------------------------------- #
# one case (runs in a subprocess)
# --------------------------------------------------------------------------- #


def run_one(case: dict, src: Path, dst: Path) -> dict:
    import torch

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    if case["tool"] == "autoround" and case["route"] == "transformers":
        from auto_round import AutoRound
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16)
        kwargs = {
            "bits": case["bits"],
            "group_size": case["group_size"],
            "sym": case["sym"],
            "iters": 0,
            "disable_opt_rtn": True,
            "amp": False,
            "seed": SEED,
            "device_map": "cpu",
        }
        ar = AutoRound(model, tokenizer=tiny_tokenizer(), **kwargs)
        ar.quantize_and_save(str(dst), format=base_format(case["format"]))
        call = (
            "AutoRound(AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16), "
            "tokenizer=<tiny>, "
            + ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            + f").quantize_and_save(out, format={base_format(case['format'])!r})"
        )
    elif case["tool"] == "autoround" and case["route"] == "modelfree":
        from auto_round import AutoRound
        from auto_round.schemes import QuantizationScheme

        scheme = QuantizationScheme(
            bits=case["bits"],
            group_size=case["group_size"],
            sym=case["sym"],
            data_type="int",
            act_bits=16,
        )
        kwargs = {"model_free": True, "disable_opt_rtn": True, "enable_torch_compile": False}
        if case.get("ignore_layers"):
            kwargs["ignore_layers"] = case["ignore_layers"]
        ar = AutoRound(model=str(src), scheme=scheme, **kwargs)
        ar.quantize_and_save(str(dst), format="auto_round")
        call = (
            f"AutoRound(model=src, scheme=QuantizationScheme(bits={case['bits']}, "
            f"group_size={case['group_size']}, sym={case['sym']}, data_type='int', act_bits=16), "
            + ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            + ").quantize_and_save(out, format='auto_round')"
        )
    elif case["tool"] == "gptqmodel":
        from gptqmodel import GPTQModel, QuantizeConfig

        work = dst.parent / (dst.name + "-src")
        shutil.copytree(src, work)
        tok = tiny_tokenizer()
        tok.save_pretrained(str(work))  # gptqmodel loads a tokenizer from the model path
        gen = torch.Generator().manual_seed(SEED)
        calib = [
            {
                "input_ids": torch.randint(4, VOCAB, (1, 32), generator=gen),
                "attention_mask": torch.ones(1, 32, dtype=torch.long),
            }
            for _ in range(16)
        ]
        qkw = {
            "bits": case["bits"],
            "group_size": case["group_size"],
            "sym": case["sym"],
            "desc_act": case["desc_act"],
            "offload_to_disk": False,
        }
        if case["desc_act"]:
            qkw["act_group_aware"] = False  # desc_act=True disables it anyway (and warns)
        model = GPTQModel.load(str(work), QuantizeConfig(**qkw), device="cpu")
        model.quantize(calib, tokenizer=tok, batch_size=1)
        model.save(str(dst))
        call = (
            "GPTQModel.load(src_with_tokenizer, QuantizeConfig("
            + ", ".join(f"{k}={v!r}" for k, v in qkw.items())
            + "), device='cpu')"
            + ".quantize(16 x random rows [1, 32] of ids 4..63, batch_size=1); .save(out)"
        )
    else:
        raise ValueError(case)
    return {"call": call}


# --------------------------------------------------------------------------- #
# classification of what was written
# --------------------------------------------------------------------------- #

QUANT_SUFFIXES = (".qweight", ".qzeros", ".scales", ".g_idx")


def linear_states(headers: dict, prefix_pred) -> dict[str, str]:
    """module -> 'packed' or the dtype of its plain .weight, for 2-D weights / packed modules."""
    out = {}
    for name, (dtype, shape, _) in headers.items():
        if not prefix_pred(name):
            continue
        if name.endswith(".qweight"):
            out[name[: -len(".qweight")]] = "packed"
        elif name.endswith(".weight") and len(shape) == 2:
            out.setdefault(name[: -len(".weight")], dtype)
    return out


def summarize(states: dict[str, str]) -> dict:
    """{"packed": count, "<dtype>": [modules kept unquantized]}."""
    by: dict[str, list[str]] = {}
    for mod, st in sorted(states.items()):
        by.setdefault(st, []).append(mod)
    return {k: (len(v) if k == "packed" else v) for k, v in sorted(by.items())}


MTP_EXTRAS = ("eh_proj", "embed_tokens", "shared_head.head")


def mtp_state(headers: dict) -> tuple[str, dict, list]:
    """(state, extras, differences from main layer 1) for the MTP layer.

    The MTP layer's decoder-block Linears (attention and MoE experts; the router gate
    excluded) are compared with their counterparts in main layer 1 (also an MoE layer):
    ``quantized``: packed exactly where layer 1 is packed (and something is packed);
    ``quantized-main-unquantized``: packed where layer 1 is not; ``unquantized-<dtype>``:
    nothing packed; ``partly-quantized``: anything else; ``lost``: no MTP tensor at all.
    """
    if not any(n.startswith(MTP_PREFIX) for n in headers):
        return "lost", {}, []
    mtp = linear_states(headers, lambda n: n.startswith(MTP_PREFIX))
    main = linear_states(headers, lambda n: n.startswith("model.layers.1."))
    extras = {e: mtp.get(MTP_PREFIX + e, "absent") for e in MTP_EXTRAS}
    block = {
        m: st
        for m, st in mtp.items()
        if m[len(MTP_PREFIX) :] not in MTP_EXTRAS and not m.endswith(".mlp.gate")
    }
    diffs = []
    for m, st in sorted(block.items()):
        twin = main.get("model.layers.1." + m[len(MTP_PREFIX) :], "absent")
        if (st == "packed") != (twin == "packed"):
            diffs.append(f"{m}: {st} (layer 1: {twin})")
    kinds = set(block.values())
    if "packed" not in kinds:
        state = "unquantized-" + "+".join(sorted(k.lower() for k in kinds))
    elif not diffs:
        state = "quantized"
    elif all(block[d.split(":")[0]] == "packed" for d in diffs):
        state = "quantized-main-unquantized"
    else:
        state = "partly-quantized"
    return state, extras, diffs


EXPECTED_STATE = {
    "bf16": "unquantized-bf16",
    "ignored-bf16": "unquantized-bf16",
    "quantized-at-4b": "quantized",
}


def packed_bits(headers: dict, src_headers: dict, awq: bool, pred) -> dict[str, int]:
    """bits width (from the packed shapes and the source shape) -> number of modules."""
    out: dict[str, int] = {}
    for name, (_, shape, _) in headers.items():
        if not name.endswith(".qweight") or not pred(name):
            continue
        mod = name[: -len(".qweight")]
        src = src_headers.get(mod + ".weight")
        if src is None:
            continue
        out_f, in_f = src[1]
        t = {"qweight": _Shape(shape), "qzeros": _Shape(headers[mod + ".qzeros"][1])}
        fits = [
            b
            for b in (2, 3, 4, 8)
            if packed_shapes_fit("awq" if awq else "gptq", t, b, in_f, out_f)
        ]
        key = str(fits[0]) if len(fits) == 1 else "?"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


class _Shape:
    def __init__(self, shape):
        self.shape = tuple(shape)


def describe_output(case_dir: Path, src_dir: Path) -> dict:
    headers = read_headers(case_dir)
    src_headers = read_headers(src_dir)
    cfg = json.loads((case_dir / "config.json").read_text())
    qc = cfg.get("quantization_config") or {}
    awq = qc.get("quant_method") == "awq" or qc.get("packing_format") == "auto_round:auto_awq"
    main = linear_states(
        headers, lambda n: n.startswith("model.layers.") and not n.startswith(MTP_PREFIX)
    )
    mtp = linear_states(headers, lambda n: n.startswith(MTP_PREFIX))
    index = case_dir / "model.safetensors.index.json"
    if index.exists():
        wm = json.loads(index.read_text())["weight_map"]
        index_check = {
            "in_files_not_in_index": sorted(n for n in headers if n not in wm),
            "in_index_not_in_files": sorted(n for n in wm if n not in headers),
            "wrong_file": sorted(n for n in wm if n in headers and headers[n][2] != wm[n]),
        }
    else:
        index_check = None
    state, extras, diffs = mtp_state(headers)
    return {
        "index_check": index_check,
        "mtp_state": state,
        "mtp_extras": extras,
        "mtp_block_vs_main_layer_1": diffs,
        "packed_bits_main": packed_bits(
            headers, src_headers, awq, lambda n: not n.startswith(MTP_PREFIX)
        ),
        "packed_bits_mtp": packed_bits(
            headers, src_headers, awq, lambda n: n.startswith(MTP_PREFIX)
        ),
        "mtp_linears": summarize(mtp),
        "main_linears": summarize(main),
        "other_dtypes": sorted(
            {h[0] for n, h in headers.items() if not n.endswith(QUANT_SUFFIXES)}
        ),
        "files": sorted(p.name for p in case_dir.iterdir()),
        "bytes": sum(p.stat().st_size for p in case_dir.iterdir()),
        "quantization_config": cfg.get("quantization_config"),
    }


# --------------------------------------------------------------------------- #
# orchestration
# --------------------------------------------------------------------------- #


def find_output(dst: Path) -> Path:
    """auto-round's transformers route writes into OUT/<model>-w<bits>g<group>/."""
    if (dst / "config.json").exists():
        return dst
    subs = [p for p in dst.iterdir() if p.is_dir() and (p / "config.json").exists()]
    if len(subs) != 1:
        raise RuntimeError(f"no single output dir under {dst}: {subs}")
    return subs[0]


def check_no_paths(case_dir: Path, forbidden: list[str]) -> None:
    for p in case_dir.glob("*.json"):
        text = p.read_text()
        for f in forbidden:
            if f and f in text:
                raise RuntimeError(f"{p.name} names a machine path ({f})")


def run_tool(tool: str, out: Path, only: str | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "MANIFEST.json"
    manifest = (
        json.loads(manifest_path.read_text())
        if manifest_path.exists()
        else {"cases": {}, "versions": {}}
    )
    if tool == "autoround":
        build_wide_sources(out / "sources")
    selected = [c for c in cases() if c["tool"] == tool and (not only or only in c["name"])]
    if not only:  # a full run replaces all of this tool's cases
        for name in [n for n, e in manifest["cases"].items() if e["tool"] == tool]:
            manifest["cases"].pop(name)
            shutil.rmtree(out / name, ignore_errors=True)
    manifest["versions"][tool] = versions(tool)
    failures = []
    with tempfile.TemporaryDirectory(prefix="mtpcheck-autoround-") as tmp:
        for case in selected:
            src = source_path(case["fixture"], out)
            dst = Path(tmp) / case["name"]
            env = dict(
                os.environ,
                PYTHONHASHSEED="0",
                AR_MODEL_FREE_SHARD_PARALLELISM="1",
                GPTQMODEL_CPU_WORKERS="2",
                TOKENIZERS_PARALLELISM="false",
            )
            if case.get("copy_mtp", True):
                env.pop("AR_DISABLE_COPY_MTP_WEIGHTS", None)
            else:
                env["AR_DISABLE_COPY_MTP_WEIGHTS"] = "1"
            log = Path(tmp) / (case["name"] + ".log")
            with open(log, "w") as fh:
                rc = subprocess.run(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--one",
                        json.dumps(case),
                        "--src",
                        str(src),
                        "--dst",
                        str(dst),
                    ],
                    cwd=tmp,  # gptqmodel writes logs/ into its working directory
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                ).returncode
            if rc != 0:
                tail = log.read_text().splitlines()[-15:]
                print(f"FAILED {case['name']} (rc {rc})\n  " + "\n  ".join(tail))
                failures.append(case["name"])
                continue
            info = json.loads((Path(tmp) / (case["name"] + ".json")).read_text())
            written = find_output(dst)
            target = out / case["name"]
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for p in sorted(written.iterdir()):
                if p.name in KEEP_NAMES or p.name.endswith(".safetensors"):
                    shutil.copyfile(p, target / p.name)
            check_no_paths(target, [tmp, str(REPO), str(Path.home())])
            entry = {k: v for k, v in case.items() if k != "name"}
            entry["source"] = (
                f"tests/data/autoround/sources/{case['fixture']}"
                if case["fixture"].endswith("_w32")
                else f"fixtures/{case['fixture']}"
            )
            entry["env"] = (
                {} if case.get("copy_mtp", True) else {"AR_DISABLE_COPY_MTP_WEIGHTS": "1"}
            )
            entry.update(info)
            entry.update(describe_output(target, src))
            entry["dropped"] = sorted(
                p.name for p in written.iterdir() if not (target / p.name).exists()
            )
            manifest["cases"][case["name"]] = entry
            print(f"{case['name']}: mtp {entry['mtp_state']}, {entry['bytes']} bytes")
            if entry["mtp_state"] != EXPECTED_STATE.get(case["expected_mtp"], case["expected_mtp"]):
                print(
                    f"  NOTE: the case name says {case['expected_mtp']!r}, "
                    f"the output is {entry['mtp_state']!r}"
                )
                failures.append(case["name"])
    manifest["cases"] = dict(sorted(manifest["cases"].items()))
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if failures:
        sys.exit(f"{len(failures)} case(s) failed: {failures}")


# --------------------------------------------------------------------------- #
# decoding check: tool's own dequantize vs. the numpy rule of NOTES.md
# --------------------------------------------------------------------------- #


def np_unpack_rows(packed, bits):
    """[R, C] int32 -> [R * 32/bits, C]: value i of a word sits at bits*i (LSB first)."""
    import numpy as np

    pf = 32 // bits
    p = packed.astype(np.uint32)
    vals = [(p >> np.uint32(bits * k)) & np.uint32((1 << bits) - 1) for k in range(pf)]
    return np.stack(vals, axis=1).reshape(packed.shape[0] * pf, packed.shape[1]).astype(np.int64)


def np_unpack_cols(packed, bits, order=None):
    """[R, C] int32 -> [R, C * 32/bits]; order[k] = output column (within 8) held by nibble k."""
    import numpy as np

    pf = 32 // bits
    p = packed.astype(np.uint32)
    vals = np.stack(
        [(p >> np.uint32(bits * k)) & np.uint32((1 << bits) - 1) for k in range(pf)], axis=2
    )
    if order is not None:
        out = np.empty_like(vals)
        for k, col in enumerate(order):
            out[:, :, col] = vals[:, :, k]
        vals = out
    return vals.reshape(packed.shape[0], packed.shape[1] * pf).astype(np.int64)


def np_dequant(kind, t, bits, group, in_features):
    """Dequantize one Linear with the rule stated in NOTES.md; returns float16 [out, in]."""
    import numpy as np

    scales = t["scales"].astype(np.float64)
    if kind == "awq":
        q = np_unpack_cols(t["qweight"], bits, order=[0, 2, 4, 6, 1, 3, 5, 7])  # [in, out]
        z = np_unpack_cols(t["qzeros"], bits, order=[0, 2, 4, 6, 1, 3, 5, 7])  # [groups, out]
        g = np.arange(in_features) // group
    else:
        q = np_unpack_rows(t["qweight"], bits)[:in_features]  # [in, out]; rows past in are padding
        z = np_unpack_cols(t["qzeros"], bits)  # [groups, out]
        if kind == "gptq_v1":
            z = z + 1
        group = in_features if group == -1 else group
        g = t["g_idx"].astype(np.int64) if "g_idx" in t else np.arange(in_features) // group
    out_features = scales.shape[1]
    q, z = q[:, :out_features], z[:, :out_features]  # packed columns past out are padding
    w = scales[g, :] * (q - z[g, :])  # exact in float64, one rounding to float16 below
    return w.astype(np.float16).T


def tool_dequant(kind, t, bits, group, in_features, out_features):
    """The tool's own decode of the same tensors; returns float16 [out, in]."""
    import torch

    tt = {k: torch.from_numpy(v) for k, v in t.items()}
    if kind == "awq":
        from auto_round.export.export_to_awq.utils import dequantize_gemm

        w = dequantize_gemm(tt["qweight"], tt["qzeros"], tt["scales"], bits, group)  # [in, out]
        return w.to(
            torch.float16
        ).T.numpy(), "auto_round/export/export_to_awq/utils.py:dequantize_gemm"
    if kind == "gptqmodel":
        from gptqmodel.nn_modules.qlinear.torch import TorchLinear
        from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

        m = TorchLinear(
            bits=bits,
            group_size=group,
            sym=True,
            desc_act=True,
            in_features=in_features,
            out_features=out_features,
            bias=False,
            register_buffers=True,
        )
        with torch.no_grad():
            for k, v in tt.items():
                getattr(m, k).copy_(v)
        convert_gptq_v1_to_v2_format_module(
            m, bits, torch.int32
        )  # what loading a v1 checkpoint does
        with torch.no_grad():
            w = m.dequantize_weight()  # [in, out]
        return w.to(torch.float16).T.numpy(), (
            "gptqmodel/utils/model.py:convert_gptq_v1_to_v2_format_module + "
            "gptqmodel/nn_modules/qlinear/__init__.py:PackableQuantLinear.dequantize_weight"
        )
    if kind == "gptq_v1":
        from auto_round_extension.torch.qlinear_torch_zp import QuantLinear

        where = "auto_round_extension/torch/qlinear_torch_zp.py:QuantLinear.forward"
    else:
        from auto_round_extension.torch.qlinear_torch import QuantLinear

        where = "auto_round_extension/torch/qlinear_torch.py:QuantLinear.forward"
    m = QuantLinear(bits, group, in_features, out_features, False, g_idx="g_idx" in t)
    for k, v in tt.items():
        setattr(m, k, v)
    with torch.no_grad():
        w = m(torch.eye(in_features, dtype=torch.float32))  # x @ W^T with x = I gives W^T exactly
    return w.to(torch.float16).T.numpy(), where


def packed_shapes_fit(kind: str, t: dict, bits: int, in_f: int, out_f: int) -> bool:
    """Do qweight / qzeros have the shapes a `bits`-wide packing of [out_f, in_f] gives?"""
    if bits == 3:  # GPTQ 3-bit: 32 values in 3 words
        return (
            kind != "awq"
            and in_f % 32 == 0
            and out_f % 32 == 0
            and t["qweight"].shape[0] == in_f * 3 // 32
            and t["qzeros"].shape[1] == out_f * 3 // 32
        )
    if 32 % bits:
        return False
    per = 32 // bits
    ceil = lambda a: -(-a // per)  # noqa: E731
    if kind == "awq":
        return list(t["qweight"].shape) == [in_f, ceil(out_f)] and t["qzeros"].shape[1] == ceil(
            out_f
        )
    return t["qweight"].shape[0] == ceil(in_f) and t["qzeros"].shape[1] == ceil(out_f)


def decode_kind(entry: dict) -> str:
    qc = entry["quantization_config"] or {}
    if entry["tool"] == "gptqmodel":
        return "gptqmodel"
    if qc.get("quant_method") == "awq":
        return "awq"
    if qc.get("quant_method") == "gptq":
        return "gptq_v1"
    from auto_round.inference.backend import AWQ_FORMAT, GPTQ_FORMAT, GPTQ_FORMAT_NO_ZP

    pf = qc.get("packing_format")
    if pf in AWQ_FORMAT:
        return "awq"
    if pf in GPTQ_FORMAT:
        return "gptq_v1"
    if pf in GPTQ_FORMAT_NO_ZP:
        return "direct"
    raise ValueError(f"unknown packing_format {pf}")


def verify(out: Path) -> None:
    import numpy as np
    from safetensors.torch import load_file as torch_load

    def load_file(path):
        return {
            k: (v.float() if v.dtype == torch.bfloat16 else v).numpy()
            for k, v in torch_load(path).items()
        }

    import torch

    manifest_path = out / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    tool_here = "gptqmodel" if importlib.util.find_spec("gptqmodel") else "autoround"
    bad = []
    for name, entry in manifest["cases"].items():
        if entry["tool"] != tool_here:
            continue
        if entry["bits"] == 3:
            entry["decode_check"] = {
                "skipped": "3-bit packing straddles words; no numpy rule written"
            }
            continue
        tensors = {}
        for p in sorted((out / name).glob("*.safetensors")):
            tensors.update(load_file(p))
        src = {}
        for p in sorted(source_path(entry["fixture"], out).glob("*.safetensors")):
            src.update(load_file(p))
        kind = decode_kind(entry)
        results = []
        packed = sorted(n[: -len(".qweight")] for n in tensors if n.endswith(".qweight"))
        picks = (
            [m for m in packed if m.startswith("model.layers.1.")][:1]
            + [m for m in packed if m.startswith(MTP_PREFIX)][:1]
            + [m for m in packed if m.startswith("model.layers.0.") and m.endswith("o_proj")][:1]
        )
        for mod in picks:
            t = {
                k: tensors[f"{mod}.{k}"]
                for k in ("qweight", "qzeros", "scales", "g_idx")
                if f"{mod}.{k}" in tensors
            }
            ref = src[f"{mod}.weight"]
            out_f, in_f = ref.shape
            qc = entry["quantization_config"] or {}
            extra = (qc.get("extra_config") or {}).get(mod, {})
            bits = declared = int(extra.get("bits", entry["bits"]))
            group = int(extra.get("group_size", entry["group_size"]))
            fits = [b for b in (declared, 2, 4, 8) if packed_shapes_fit(kind, t, b, in_f, out_f)]
            bits = fits[0] if fits else declared  # the width the tensors were packed with
            mine = np_dequant("gptq_v1" if kind == "gptqmodel" else kind, t, bits, group, in_f)
            try:
                theirs, where = tool_dequant(kind, t, bits, group, in_f, out_f)
            except Exception as exc:  # recorded: the tool's own decoder refuses this layer
                results.append(
                    {
                        "module": mod,
                        "kind": kind,
                        "tool_error": f"{type(exc).__name__}: {exc}",
                        "parts": {k: [str(v.dtype), list(v.shape)] for k, v in t.items()},
                        "max_abs_err_vs_source": float(
                            np.max(np.abs(mine.astype(np.float32) - ref.astype(np.float32)))
                        ),
                    }
                )
                continue
            # compared as numbers: the tool's x @ W with x = I turns -0.0
            # (negative scale x 0) into +0.0
            same = bool(np.array_equal(mine, theirs))
            err = float(np.max(np.abs(mine.astype(np.float32) - ref.astype(np.float32))))
            res = {
                "module": mod,
                "kind": kind,
                "tool_function": where,
                "exact_match": same,
                "bits_declared": declared,
                "bits_in_tensors": bits,
                "parts": {k: [str(v.dtype), list(v.shape)] for k, v in t.items()},
            }
            if "g_idx" in t:
                g = t["g_idx"]
                res["g_idx_is_sorted"] = bool(np.all(np.diff(g) >= 0))
            res["max_abs_err_vs_source"] = err
            res["max_abs_scale"] = float(np.abs(t["scales"].astype(np.float32)).max())
            res["negative_scales"] = int((t["scales"] < 0).sum())
            results.append(res)
            if not same:
                bad.append(f"{name}:{mod}")
        entry["decode_check"] = results
        print(
            f"{name}: "
            + ", ".join(
                f"{r['module']} "
                + ("TOOL ERROR" if "tool_error" in r else "ok" if r["exact_match"] else "MISMATCH")
                for r in results
            )
        )
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if bad:
        sys.exit(f"decode mismatch: {bad}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", choices=["autoround", "gptqmodel"])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--case", default=None, help="only cases whose name contains this")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--dst", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        case = json.loads(args.one)
        info = run_one(case, args.src, args.dst)
        (args.dst.parent / (case["name"] + ".json")).write_text(json.dumps(info))
        return
    out = args.out.resolve()
    if args.verify:
        verify(out)
        return
    if not args.tool:
        ap.error("--tool or --verify is required")
    run_tool(args.tool, out, args.case)


if __name__ == "__main__":
    main()
