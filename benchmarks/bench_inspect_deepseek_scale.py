"""Benchmark 3: ``mtpcheck inspect`` on a DeepSeek-V3-scale checkpoint (sparse files).

A generator writes DeepSeek-V3's 163 shards with its real tensor names, dtypes and shapes
(from the published config: hidden 7168, 61 layers of which the first 3 dense, 1 MTP layer at
``model.layers.61``, 256 routed + 1 shared expert, MLA, FP8 E4M3 weights with fp32
``weight_scale_inv`` per 128x128 block): 91,991 tensors, about 688 GB declared. Each shard is
its header followed by a hole, so only the headers take disk space, except what ``inspect``
reads of the MTP layer's values, written as a trained release holds them (its norms, scales
and the first 256 KiB of its BF16 matrices, about 4 MB). The config carries the release's
router keys, so the checkpoint passes every check as the real one does.

Timed: ``python -m mtpcheck inspect DIR`` (interpreter start-up included) against a baseline
that only starts Python and ``json.loads`` the 163 headers (a floor for any Python tool), and
that floor plus config.json and the 8.9 MB index, which ``inspect`` must read too (config, index
and every header read once by a plain loop). Targets: <= 1.0 s wall, no torch import (checked
with ``python -X importtime``); aim: <= 1.5 x the floor with config and index.
A breakdown of mtpcheck's own time (imports, opening, checks, rendering; medians of in-process
timers over the same rounds) says where the rest goes.

    python benchmarks/bench_inspect_deepseek_scale.py [--repeats 5] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    alternate,
    child_env,
    machine,
    median,
    mtpcheck_cmd,
    print_table,
    round_ratios,
    run_measured,
    tensor_offset,
    write_index,
    write_sparse_shard,
)

HIDDEN = 7168
LAYERS = 61
DENSE = 3
EXPERTS = 256
INTER = 18432
MOE_INTER = 2048
VOCAB = 129280
Q_LORA = 1536
KV_LORA = 512
ROPE = 64
NOPE = 128
V_HEAD = 128
HEADS = 128
BLOCK = 128
SHARDS = 163
TARGET_S = 1.0
AIM_VS_INDEX = 1.5
HEAVY = ("torch", "transformers", "megatron", "safetensors", "numpy")

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "moe_intermediate_size": MOE_INTER,
    "num_hidden_layers": LAYERS,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "n_routed_experts": EXPERTS,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": DENSE,
    "moe_layer_freq": 1,
    "q_lora_rank": Q_LORA,
    "kv_lora_rank": KV_LORA,
    "qk_rope_head_dim": ROPE,
    "qk_nope_head_dim": NOPE,
    "v_head_dim": V_HEAD,
    "vocab_size": VOCAB,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    # the router as the release's config.json declares it (serving engines read these keys)
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "n_group": 8,
    "topk_group": 4,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "initializer_range": 0.02,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK],
    },
}


def _ceil(a: int) -> int:
    return -(-a // BLOCK)


def _fp8(name: str, rows: int, cols: int) -> list[tuple[str, str, tuple[int, ...]]]:
    return [
        (f"{name}.weight", "F8_E4M3", (rows, cols)),
        (f"{name}.weight_scale_inv", "F32", (_ceil(rows), _ceil(cols))),
    ]


def _attention(p: str) -> list[tuple[str, str, tuple[int, ...]]]:
    a = f"{p}self_attn."
    return [
        (f"{p}input_layernorm.weight", "BF16", (HIDDEN,)),
        (f"{p}post_attention_layernorm.weight", "BF16", (HIDDEN,)),
        *_fp8(f"{a}q_a_proj", Q_LORA, HIDDEN),
        (f"{a}q_a_layernorm.weight", "BF16", (Q_LORA,)),
        *_fp8(f"{a}q_b_proj", HEADS * (NOPE + ROPE), Q_LORA),
        *_fp8(f"{a}kv_a_proj_with_mqa", KV_LORA + ROPE, HIDDEN),
        (f"{a}kv_a_layernorm.weight", "BF16", (KV_LORA,)),
        *_fp8(f"{a}kv_b_proj", HEADS * (NOPE + V_HEAD), KV_LORA),
        *_fp8(f"{a}o_proj", HIDDEN, HEADS * V_HEAD),
    ]


def _mlp(p: str, inter: int) -> list[tuple[str, str, tuple[int, ...]]]:
    return [
        *_fp8(f"{p}gate_proj", inter, HIDDEN),
        *_fp8(f"{p}up_proj", inter, HIDDEN),
        *_fp8(f"{p}down_proj", HIDDEN, inter),
    ]


def _moe_layer(p: str) -> list[tuple[str, str, tuple[int, ...]]]:
    out = _attention(p)
    out += [
        (f"{p}mlp.gate.weight", "BF16", (EXPERTS, HIDDEN)),
        (f"{p}mlp.gate.e_score_correction_bias", "F32", (EXPERTS,)),
    ]
    for e in range(EXPERTS):
        out += _mlp(f"{p}mlp.experts.{e}.", MOE_INTER)
    out += _mlp(f"{p}mlp.shared_experts.", MOE_INTER)
    return out


def deepseek_v3_tensors() -> list[tuple[str, str, tuple[int, ...]]]:
    """Every tensor of the FP8 DeepSeek-V3 release, in layer order."""
    out = [("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN))]
    for k in range(LAYERS + 1):
        p = f"model.layers.{k}."
        out += _attention(p) + _mlp(f"{p}mlp.", INTER) if k < DENSE else _moe_layer(p)
        if k == LAYERS:  # the MTP module
            out += [
                (f"{p}embed_tokens.weight", "BF16", (VOCAB, HIDDEN)),
                (f"{p}enorm.weight", "BF16", (HIDDEN,)),
                (f"{p}hnorm.weight", "BF16", (HIDDEN,)),
                (f"{p}eh_proj.weight", "BF16", (HIDDEN, 2 * HIDDEN)),
                (f"{p}shared_head.norm.weight", "BF16", (HIDDEN,)),
                (f"{p}shared_head.head.weight", "BF16", (VOCAB, HIDDEN)),
            ]
    out += [("model.norm.weight", "BF16", (HIDDEN,)), ("lm_head.weight", "BF16", (VOCAB, HIDDEN))]
    return out


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = {"BF16": 2, "F32": 4, "F8_E4M3": 1}[dtype]
    for d in shape:
        n *= d
    return n


def generate(root: Path) -> tuple[int, int]:
    """Write the sparse checkpoint under ``root``; returns (tensor count, declared bytes)."""
    tensors = deepseek_v3_tensors()
    total = sum(_nbytes(d, s) for _, d, s in tensors)
    per_shard = -(-total // SHARDS)
    shards: list[list[tuple[str, str, tuple[int, ...]]]] = [[]]
    size = 0
    for t in tensors:
        nb = _nbytes(t[1], t[2])
        if shards[-1] and size + nb > per_shard and len(shards) < SHARDS:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nb
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):06d}.safetensors"
        write_sparse_shard(root / name, sorted(shard))
        weight_map.update({t[0]: name for t in shard})
    write_index(root, weight_map, total)
    (root / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    _write_trained_mtp_values(root, tensors, weight_map)
    return len(tensors), total


MTP_PREFIX = f"model.layers.{LAYERS}."
MTP_COPIES = ("embed_tokens.weight", "shared_head.head.weight")
"""The MTP layer's copies of the embedding and head: holes, like the originals they equal."""
TRAINED_SAMPLE = 256 * 1024


def _write_trained_mtp_values(
    root: Path, tensors: list[tuple[str, str, tuple[int, ...]]], weight_map: dict[str, str]
) -> None:
    """Values like a trained MTP layer's where inspect's value checks read them (its norms,
    scales and the first 256 KiB of its BF16 / F32 matrices; FP8 matrices are not read by
    them); the rest stays a hole."""
    rng = random.Random(0)
    for name, dtype, _ in tensors:
        if not name.startswith(MTP_PREFIX) or name.endswith(MTP_COPIES) or dtype == "F8_E4M3":
            continue
        shard = root / weight_map[name]
        offset, nbytes = tensor_offset(shard, name)
        with open(shard, "r+b") as f:
            f.seek(offset)
            f.write(_trained_values(rng, name, dtype, min(nbytes, TRAINED_SAMPLE)))


def _trained_values(rng: random.Random, name: str, dtype: str, size: int) -> bytes:
    """``size`` bytes of ``dtype`` values: norms about 1, F32 scales small and positive,
    matrices normal with a std no initialiser of this config uses (0.035, not 0.02)."""
    count = size // (4 if dtype == "F32" else 2)
    if name.endswith("norm.weight"):
        values = [rng.gauss(1.0, 0.1) for _ in range(count)]
    elif dtype == "F32":
        values = [rng.uniform(1e-4, 1e-3) for _ in range(count)]
    else:
        values = [rng.gauss(0.0, 0.035) for _ in range(count)]
    wide = array("f", values).tobytes()
    if dtype == "F32":
        return wide
    narrow = bytearray(2 * count)  # BF16: the top half of each little-endian float32
    narrow[0::2], narrow[1::2] = wide[2::4], wide[3::4]
    return bytes(narrow)


FLOOR = """
import json, struct, sys
from pathlib import Path
for p in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with open(p, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        json.loads(f.read(n))
"""
# the aim is against this one: config.json and the index (8.9 MB of JSON) inspect must read
# and check too; the floor of the issue: config, index and every header, by a plain loop
FLOOR_WITH_INDEX = (
    FLOOR
    + """
json.loads((Path(sys.argv[1]) / "config.json").read_bytes())
json.loads((Path(sys.argv[1]) / "model.safetensors.index.json").read_bytes())
"""
)

# mtpcheck's own time, part by part, in one process (the CLI's imports include rich, which
# renders the table; opening reads the index and the headers; the checks read MTP bytes)
BREAKDOWN = """
import io, json, sys, time
t0 = time.perf_counter()
import mtpcheck.cli
from mtpcheck.checks.inspect_checks import inspect_report
from mtpcheck.formats import open_input
from mtpcheck.report import renderer
table = renderer("table")
t1 = time.perf_counter()
checkpoint = open_input(sys.argv[1])
t2 = time.perf_counter()
report = inspect_report(checkpoint)
t3 = time.perf_counter()
table.render(report, io.StringIO())
t4 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "open": t2 - t1, "checks": t3 - t2, "render": t4 - t3}))
"""
PARTS = ("imports", "open", "checks", "render")


def heavy_imports(root: Path, env: dict[str, str]) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mtpcheck", "inspect", str(root)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    found = set()
    for line in run.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            module = line.rsplit("|", 1)[1].strip()
            if module.split(".")[0] in HEAVY:
                found.add(module.split(".")[0])
    return sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoint")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mtpbench-dsv3-", dir=args.workdir))
    try:
        root = work / "DeepSeek-V3"
        root.mkdir()
        count, declared = generate(root)
        shards = len(list(root.glob("*.safetensors")))
        print(
            f"generated {shards} sparse shards, {count} tensors, {declared / 1e9:.1f} GB "
            f"declared, {sum(p.stat().st_blocks for p in root.iterdir()) * 512 / 1e6:.1f} MB "
            f"on disk, under {root}",
            file=sys.stderr,
        )
        env = child_env(work)
        check = run_measured(mtpcheck_cmd("inspect", root, "--format", "json"), env=env)
        report = json.loads(check.stdout)
        (layer,) = report["inputs"][0]["mtp_layers"]
        print(
            f"inspect: exit {check.returncode}, ok={report['ok']}, "
            f"{report['inputs'][0]['tensor_count']} tensors, MTP layer {layer['prefix']} "
            f"{len(layer['tensors'])} tensors, complete={layer['complete']}",
            file=sys.stderr,
        )
        heavy = heavy_imports(root, env)

        results = alternate(
            {
                "floor": lambda: run_measured([sys.executable, "-c", FLOOR, str(root)]),
                "floor+index": lambda: run_measured(
                    [sys.executable, "-c", FLOOR_WITH_INDEX, str(root)]
                ),
                "mtpcheck": lambda: run_measured(mtpcheck_cmd("inspect", root), env=env),
                "parts": lambda: run_measured(
                    [sys.executable, "-c", BREAKDOWN, str(root)], env=env
                ),
            },
            args.repeats,
        )
        parts = [json.loads(m.stdout) for m in results["parts"]]
        floor = median(m.wall for m in results["floor"])
        ours = median(m.wall for m in results["mtpcheck"])
        cpu = median(m.cpu for m in results["mtpcheck"])
        floor_cpu = median(m.cpu for m in results["floor"])
        with_index = median(m.wall for m in results["floor+index"])
        rss = max(m.maxrss_mib for m in results["mtpcheck"])
        print(f"\nmachine: {machine()}")
        print_table(
            f"inspect on DeepSeek-V3 scale ({shards} shards, {count} tensors, "
            f"{declared / 1e9:.0f} GB declared), medians of {args.repeats}",
            [
                ("python + json.loads of headers", f"{floor:.3f}", f"{floor_cpu:.2f}", "", ""),
                ("  ... and of config.json and the index", f"{with_index:.3f}", "", "", ""),
                (
                    "mtpcheck inspect",
                    f"{ours:.3f}",
                    f"{cpu:.2f}",
                    f"{rss:.0f}",
                    "met" if ours <= TARGET_S else "NOT met",
                ),
            ],
            ("run", "wall s", "CPU s", "peak RSS MiB", f"target <= {TARGET_S} s"),
        )
        worst = max(round_ratios(results["mtpcheck"], results["floor"]))
        worst_index = max(round_ratios(results["mtpcheck"], results["floor+index"]))
        print(f"ratio mtpcheck / floor: {ours / floor:.2f} (worst round {worst:.2f})")
        print(
            f"ratio mtpcheck / floor with config and index: {ours / with_index:.2f} (worst round "
            f"{worst_index:.2f}; aim <= {AIM_VS_INDEX}: "
            f"{'met' if ours / with_index <= AIM_VS_INDEX else 'not met'})"
        )
        print(
            "mtpcheck's parts in one process (medians): "
            + ", ".join(f"{k} {median(p[k] for p in parts):.3f} s" for k in PARTS)
        )
        print(f"heavy imports on the inspect path: {', '.join(heavy) or 'none'}")
        ok = ours <= TARGET_S and not heavy and check.returncode == 0 and report["ok"]
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
