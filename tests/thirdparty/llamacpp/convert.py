#!/usr/bin/env python3
"""Convert one shipped HF fixture with llama.cpp's real ``convert_hf_to_gguf.py``.

    python3 convert.py FIXTURE_DIR OUT_DIR [--outtype f32|bf16|q8_0|...] [--mode full|no-mtp|mtp]
                       [--tokenizer auto|none] [--trim-vocab auto|no] [--glm-specials auto|no]
                       [--tokpre-fallback NAME|none] [--no-dump]

Runs with any python3 (stdlib only); the converter itself runs in the venv made by
install_venv.sh (``--venv``, default /work/venvs/llamacpp) from the source tree it extracted
(``--src``, default /work/venvs/llamacpp-src/llama.cpp).

What it does:
1. stages a copy of FIXTURE_DIR in a temp dir named like the fixture;
   if the fixture has no ``tokenizer.json`` and ``--tokenizer auto``: copies ``tokenizer.json``
   and ``tokenizer_config.json`` from fixtures/accept_deepseek_v3 (a 96-entry WordLevel
   tokenizer); with ``--trim-vocab auto`` drops the vocab entries whose id >= config
   ``vocab_size`` (the converter asserts max token id < vocab_size); for GLM-4.5
   (``Glm4MoeForCausalLM``) with ``--glm-specials auto`` turns the last 4 ids into the added
   special tokens ``[gMASK] <|user|> <|endoftext|> <|observation|>`` that the converter's
   ``_set_vocab_glm`` looks up.  Every change is recorded in convert.json ``staging``;
2. runs ``_converter_shim.py`` -> ``convert_hf_to_gguf.py <staged> --outtype T --outfile OUT_DIR/
   [--no-mtp | --mtp]`` (OUT_DIR as ``--outfile`` lets the converter choose the file name, and
   only then does ``--mtp`` add its ``mtp-`` prefix).  With ``--tokpre-fallback NAME`` (default
   ``default``) the shim makes an unrecognised BPE pre-tokenizer hash yield NAME;
3. writes OUT_DIR/convert.json (argv, versions, exit code, error tail, outputs with sha256,
   patches that fired), OUT_DIR/convert.log (converter output) and, on success,
   OUT_DIR/dump.json (see dump_gguf.py).
Exit status: the converter's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TOKENIZER_DONOR = REPO / "fixtures" / "accept_deepseek_v3"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
GLM_SPECIALS = ("[gMASK]", "<|user|>", "<|endoftext|>", "<|observation|>")


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def stage(fixture: Path, dst: Path, args: argparse.Namespace) -> list[dict]:
    """Copy the fixture to dst, adding/editing tokenizer files as asked; return the change log."""
    log: list[dict] = []
    shutil.copytree(fixture, dst, ignore=shutil.ignore_patterns("workloads"))
    cfg = json.loads((dst / "config.json").read_text())
    vocab_size = cfg.get("vocab_size", cfg.get("text_config", {}).get("vocab_size"))
    added_by_us = False
    if not (dst / "tokenizer.json").exists() and args.tokenizer == "auto":
        for name in TOKENIZER_FILES:
            shutil.copy2(TOKENIZER_DONOR / name, dst / name)
            log.append(
                {
                    "action": "copied",
                    "file": name,
                    "from": str((TOKENIZER_DONOR / name).relative_to(REPO)),
                    "sha256": sha256(TOKENIZER_DONOR / name),
                }
            )
        added_by_us = True
    tj_path = dst / "tokenizer.json"
    if not tj_path.exists():
        return log
    tj = json.loads(tj_path.read_text())
    vocab = tj.get("model", {}).get("vocab")
    changed = False
    if isinstance(vocab, dict) and vocab_size and args.trim_vocab == "auto":
        over = {k: v for k, v in vocab.items() if v >= vocab_size}
        if over:
            tj["model"]["vocab"] = {k: v for k, v in vocab.items() if v < vocab_size}
            tj["added_tokens"] = [t for t in tj.get("added_tokens", []) if t["id"] < vocab_size]
            log.append(
                {
                    "action": "trimmed_vocab",
                    "file": "tokenizer.json",
                    "config_vocab_size": vocab_size,
                    "tokenizer_entries_before": len(vocab),
                    "dropped_ids": f"{min(over.values())}..{max(over.values())}",
                    "reason": "the converter asserts max(tokenizer.vocab.values()) < vocab_size",
                }
            )
            changed = True
    arch = (cfg.get("architectures") or [""])[0]
    if (
        added_by_us
        and args.glm_specials == "auto"
        and arch in ("Glm4MoeForCausalLM",)
        and isinstance(tj.get("model", {}).get("vocab"), dict)
    ):
        v = tj["model"]["vocab"]
        n = max(v.values()) + 1
        inv = {i: k for k, i in v.items()}
        replaced = []
        for j, special in enumerate(GLM_SPECIALS):
            tid = n - len(GLM_SPECIALS) + j
            old = inv.get(tid)
            if old is not None:
                del v[old]
            v[special] = tid
            tj.setdefault("added_tokens", []).append(
                {
                    "id": tid,
                    "content": special,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
            )
            replaced.append({"id": tid, "was": old, "now": special})
        log.append(
            {
                "action": "glm_specials",
                "file": "tokenizer.json",
                "replaced": replaced,
                "reason": "conversion/base.py _set_vocab_glm reads get_added_vocab()[...] "
                "for [gMASK] <|user|> <|endoftext|> <|observation|>",
            }
        )
        changed = True
    if changed:
        tj_path.write_text(json.dumps(tj, indent=1, ensure_ascii=False))
        log.append(
            {
                "action": "result",
                "file": "tokenizer.json",
                "sha256": sha256(tj_path),
                "entries": len(tj["model"]["vocab"]),
            }
        )
    return log


def venv_versions(py: Path) -> dict:
    code = (
        "import importlib.metadata as m, sys, json;"
        "print(json.dumps({'python': sys.version.split()[0], **{p: m.version(p) for p in "
        "['torch','numpy','transformers','tokenizers','safetensors','sentencepiece','protobuf','gguf']}}))"
    )
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("fixture", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--outtype", default="f32")
    ap.add_argument("--mode", choices=["full", "no-mtp", "mtp"], default="full")
    ap.add_argument("--tokenizer", choices=["auto", "none"], default="auto")
    ap.add_argument("--trim-vocab", choices=["auto", "no"], default="auto")
    ap.add_argument("--glm-specials", choices=["auto", "no"], default="auto")
    ap.add_argument(
        "--tokpre-fallback",
        default="default",
        help="value for tokenizer.ggml.pre when the hash is unknown; 'none' = no patch",
    )
    ap.add_argument(
        "--venv", type=Path, default=Path(os.environ.get("LLAMACPP_VENV", "/work/venvs/llamacpp"))
    )
    ap.add_argument(
        "--src",
        type=Path,
        default=Path(os.environ.get("LLAMACPP_SRC", "/work/venvs/llamacpp-src")) / "llama.cpp",
    )
    ap.add_argument(
        "--split-max-tensors",
        type=int,
        default=0,
        help="passed on: the converter writes NAME-0000i-of-0000N.gguf shards of N tensors",
    )
    ap.add_argument("--no-dump", action="store_true")
    args = ap.parse_args()

    fixture = args.fixture.resolve()
    out = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    py = args.venv / "bin" / "python"
    versions_file = args.src.parent / "VERSIONS.json"
    record: dict = {
        "fixture": str(fixture.relative_to(REPO)) if fixture.is_relative_to(REPO) else str(fixture),
        "outtype": args.outtype,
        "mode": args.mode,
        "options": {
            k: getattr(args, k)
            for k in (
                "tokenizer",
                "trim_vocab",
                "glm_specials",
                "tokpre_fallback",
                "split_max_tensors",
            )
        },
        "versions": {
            **(json.loads(versions_file.read_text()) if versions_file.exists() else {}),
            **venv_versions(py),
        },
    }
    with tempfile.TemporaryDirectory(prefix="llamacpp-stage-") as tmp:
        staged = Path(tmp) / fixture.name
        record["staging"] = stage(fixture, staged, args)
        conv_args = [str(staged), "--outtype", args.outtype, "--outfile", str(out) + os.sep]
        if args.split_max_tensors:
            conv_args += ["--split-max-tensors", str(args.split_max_tensors)]
        if args.mode == "no-mtp":
            conv_args.append("--no-mtp")
        elif args.mode == "mtp":
            conv_args.append("--mtp")
        patch_log = Path(tmp) / "patches.json"
        env = dict(os.environ)
        env.pop("MTPCHECK_TOKPRE_FALLBACK", None)
        if args.tokpre_fallback != "none":
            env["MTPCHECK_TOKPRE_FALLBACK"] = args.tokpre_fallback
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
        cmd = [
            str(py),
            str(HERE / "_converter_shim.py"),
            str(args.src),
            str(patch_log),
            "--",
            *conv_args,
        ]
        record["argv"] = [
            "convert_hf_to_gguf.py",
            f"<staged copy of {record['fixture']}>",
            *conv_args[1:],
        ]
        record["argv"] = [a.replace(str(out), "<out>") for a in record["argv"]]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        record["seconds"] = round(time.time() - t0, 2)
        text = (proc.stdout + proc.stderr).replace(str(staged), f"<staged>/{fixture.name}")
        text = text.replace(str(out), "<out>").replace(str(args.src), "<llama.cpp>")
        (out / "convert.log").write_text(text)
        record["exit_code"] = proc.returncode
        record["patches"] = json.loads(patch_log.read_text()) if patch_log.exists() else None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if proc.returncode != 0:
        exc_lines = [
            ln for ln in lines if re.match(r"^([A-Za-z_.]*(Error|Exception)\b|ERROR:)", ln)
        ]
        record["error"] = (exc_lines[-1] if exc_lines else lines[-1] if lines else "")[:300]
        record["error_tail"] = lines[-25:]
    outputs = sorted(out.glob("*.gguf"))
    record["outputs"] = [
        {"file": p.name, "size": p.stat().st_size, "sha256": sha256(p)} for p in outputs
    ]
    if proc.returncode == 0 and outputs and not args.no_dump:
        d = subprocess.run(
            [str(py), str(HERE / "dump_gguf.py"), str(out / "dump.json"), *map(str, outputs)],
            capture_output=True,
            text=True,
        )
        record["dump_exit_code"] = d.returncode
        if d.returncode != 0:
            record["dump_error_tail"] = (d.stdout + d.stderr).splitlines()[-15:]
    (out / "convert.json").write_text(json.dumps(record, indent=1) + "\n")
    status = "OK " if proc.returncode == 0 else "ERR"
    print(
        f"{status} {record['fixture']} {args.outtype} {args.mode}: "
        f"{', '.join(o['file'] for o in record['outputs']) or record.get('error', '')}"
    )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
