"""Generate with vLLM's MTP speculative decoding on a fixture; print vLLM's own counters.

    /work/venvs/vllm/bin/python tests/thirdparty/vllm/run_vllm.py FIXTURE \
        --workload PATH --draft-tokens K --new-tokens N --prompt-tokens P [--temperature T]

Prompts are the first P token ids of each document of the workload, tokenised with the
fixture's own tokenizer by mtpcheck's own workload reader (``mtpcheck.accept.workloads``,
imported from this checkout's ``src``). The fixture is copied (``harness.prepare_fixture``)
and run through ``vllm.LLM`` with ``speculative_config={"method": "mtp",
"num_speculative_tokens": K}``, float32, eager, on CPU, with the patches of ``harness.py``.

Prints one JSON object. The acceptance figures are read from vLLM's public metrics API,
``LLM.get_metrics()`` (``vllm/v1/metrics/reader.py``), as the difference of the counters
after and before ``generate``:

* ``vllm:spec_decode_num_drafts`` (Counter): verify steps that carried a draft;
* ``vllm:spec_decode_num_draft_tokens`` (Counter): draft tokens proposed;
* ``vllm:spec_decode_num_accepted_tokens`` (Counter): draft tokens accepted;
* ``vllm:spec_decode_num_accepted_tokens_per_pos`` (Vector, one int per draft position).

From them: acceptance = accepted / draft tokens, acceptance per position = accepted at
position i / drafts, mean acceptance length = 1 + accepted / drafts (the formulas of
``SpecDecodingProm`` and ``SpecDecodingLogging``, ``vllm/v1/spec_decode/metrics.py``).
vLLM's per-request metrics (``per_request_spec_decode_metrics="detailed"``, surfaced as
``CompletionOutput.spec_decode_metrics``) are reported per prompt beside them, with their
sum, which must equal the global counters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

SPEC_METRICS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("fixture", type=Path)
    p.add_argument("--workload", type=Path, required=True)
    p.add_argument("--draft-tokens", type=int, required=True, help="num_speculative_tokens")
    p.add_argument("--new-tokens", type=int, required=True, help="max_tokens per prompt")
    p.add_argument("--prompt-tokens", type=int, required=True, help="token ids per prompt")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="keep generating past the EOS token (default: stop at EOS)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="default: the fixture's max_position_embeddings",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where the patched fixture copy goes (default: a temporary folder)",
    )
    p.add_argument(
        "--skip-patch",
        action="append",
        default=[],
        choices=["moe", "mla", "rope", "step3p7", "cpu_attn", "router", "expand", "mla_backend"],
        help="leave one of harness.py's run-time patches out (to show its effect)",
    )
    p.add_argument("--kv-cache-bytes", type=int, default=64 << 20)
    return p.parse_args(argv)


def load_prompts(fixture: Path, workload: Path, prompt_tokens: int) -> tuple[list, str]:
    """Token ids per document, cut to ``prompt_tokens``, the way ``mtpcheck accept`` does."""
    sys.path.insert(0, str(REPO / "src"))
    from mtpcheck.accept import workloads

    tokenizer = workloads.load_tokenizer(fixture)
    loaded = workloads.tokenise("w", workload, tokenizer, prompt_tokens)
    return [list(s) for s in loaded.sequences], "mtpcheck.accept.workloads.tokenise"


def spec_counters(metrics) -> dict:
    """The spec-decode counters of one ``LLM.get_metrics()`` snapshot, summed over engines."""
    from vllm.v1.metrics.reader import Counter, Vector

    out: dict = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_pos": []}
    found = set()
    for metric in metrics:
        for key, name in SPEC_METRICS.items():
            if metric.name != name:
                continue
            found.add(key)
            if isinstance(metric, Vector):
                values = list(metric.values)
                acc = out["accepted_per_pos"]
                acc.extend([0] * (len(values) - len(acc)))
                out["accepted_per_pos"] = [a + v for a, v in zip(acc, values, strict=True)]
            elif isinstance(metric, Counter):
                out[key] += int(metric.value)
    out["found"] = sorted(found)
    return out


def summarise(before: dict, after: dict) -> dict:
    drafts = after["drafts"] - before["drafts"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    prev = before["accepted_per_pos"] + [0] * (
        len(after["accepted_per_pos"]) - len(before["accepted_per_pos"])
    )
    per_pos = [a - b for a, b in zip(after["accepted_per_pos"], prev, strict=True)]
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "accepted_per_pos": per_pos,
        "acceptance": accepted / draft_tokens if draft_tokens else None,
        "acceptance_per_pos": [a / drafts for a in per_pos] if drafts else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # vLLM logs to stdout by default; keep stdout for the one JSON object.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if args.skip_patch:
        os.environ["MTPCHECK_VLLM_SKIP_PATCHES"] = ",".join(args.skip_patch)
    sys.path.insert(0, str(HERE))
    import harness  # sets VLLM_ENABLE_V1_MULTIPROCESSING=0 and patches, before the engine

    t0 = time.monotonic()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="mtpcheck-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = harness.prepare_fixture(args.fixture, work)
    prompts, tokenised_with = load_prompts(model_dir, args.workload, args.prompt_tokens)

    config = json.loads((model_dir / "config.json").read_text())
    text_config = config.get("text_config", config)
    max_model_len = args.max_model_len or int(text_config.get("max_position_embeddings", 128))

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t1 = time.monotonic()
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        disable_log_stats=False,
        max_model_len=max_model_len,
        kv_cache_memory_bytes=args.kv_cache_bytes,
        seed=args.seed,
        speculative_config={"method": "mtp", "num_speculative_tokens": args.draft_tokens},
        per_request_spec_decode_metrics="detailed",
        # text-only prompts: a vision-language checkpoint runs without its vision tower
        **({"language_model_only": True} if "vision_config" in config else {}),
    )
    t2 = time.monotonic()
    params = SamplingParams(
        temperature=args.temperature,
        max_tokens=args.new_tokens,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )
    harness.reset_calls()
    before = spec_counters(llm.get_metrics())
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
    )
    after = spec_counters(llm.get_metrics())
    t3 = time.monotonic()

    per_request = []
    request_sum = {
        "drafts": 0,
        "draft_tokens": 0,
        "accepted_tokens": 0,
        "accepted_per_pos": [0] * args.draft_tokens,
    }
    for out in outputs:
        completion = out.outputs[0]
        m = completion.spec_decode_metrics
        entry = {
            "prompt": list(out.prompt_token_ids),
            "generated": list(completion.token_ids),
            "finish_reason": completion.finish_reason,
        }
        if m is not None:
            d = m.to_dict()
            entry["spec_decode"] = {
                k: d[k]
                for k in (
                    "num_spec_steps",
                    "num_draft_tokens",
                    "num_accepted_draft_tokens",
                    "acceptance_histogram",
                )
            }
            request_sum["drafts"] += d["num_spec_steps"]
            request_sum["draft_tokens"] += d["num_draft_tokens"]
            request_sum["accepted_tokens"] += d["num_accepted_draft_tokens"]
            for j, count in enumerate(d["acceptance_histogram"]):
                for pos in range(j):
                    request_sum["accepted_per_pos"][pos] += count
        per_request.append(entry)

    import vllm

    counters = summarise(before, after)
    result = {
        "fixture": str(args.fixture),
        "model_copy": str(model_dir),
        "workload": str(args.workload),
        "tokenised_with": tokenised_with,
        "num_prompts": len(prompts),
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "draft_tokens_k": args.draft_tokens,
        "temperature": args.temperature,
        "ignore_eos": args.ignore_eos,
        "vllm_version": vllm.__version__,
        "engine_in_process": harness.engine_in_process(),
        "patches_applied": harness.applied(),
        "patch_calls": dict(harness.CALLS),
        "metrics_found": after["found"],
        **counters,
        "per_request_sum": request_sum,
        "per_request_sum_matches": all(
            request_sum[k] == counters[k]
            for k in ("drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos")
        ),
        "generated_tokens": sum(len(e["generated"]) for e in per_request),
        "seconds": {
            "prepare": round(t1 - t0, 2),
            "engine_start": round(t2 - t1, 2),
            "generate": round(t3 - t2, 2),
            "total": round(t3 - t0, 2),
        },
        "requests": per_request,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
