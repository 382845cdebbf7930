"""vLLM's offline engine on a target with a separate drafter; vLLM's own counters over one
``generate``, read independently of mtpcheck's driver.

    tests/thirdparty/vllm/shimmed_python tests/thirdparty/vllm/drafter/run_offline.py \
        TARGET DRAFTER PROMPTS.json [--method eagle3] [--draft-tokens 3] [--new-tokens 40] \
        [--temperature 0]

PROMPTS.json: a list of token-id lists. Runs ``vllm.LLM(model=TARGET, speculative_config=
{"method": METHOD, "model": DRAFTER, "num_speculative_tokens": K}, dtype="float32",
enforce_eager=True, max_model_len=128, kv_cache_memory_bytes=64 MiB, seed=0,
disable_log_stats=False)`` and prints one JSON object: the difference of
``LLM.get_metrics()``'s spec-decode counters after - before ``generate`` (summed over
engines), and vLLM's version. vLLM's log goes to stderr.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

NAMES = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_position",
}


def counters(llm) -> dict:
    from vllm.v1.metrics.reader import Counter, Vector

    out = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
    for metric in llm.get_metrics():
        key = NAMES.get(metric.name)
        if key is None:
            continue
        if isinstance(metric, Vector):
            old = out[key]
            values = [int(v) for v in metric.values]
            out[key] = [v + (old[i] if i < len(old) else 0) for i, v in enumerate(values)]
        elif isinstance(metric, Counter):
            out[key] += int(metric.value)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("drafter")
    p.add_argument("prompts")
    p.add_argument("--method", default="eagle3")
    p.add_argument("--draft-tokens", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=40)
    p.add_argument("--temperature", type=float, default=0.0)
    args = p.parse_args()
    with open(args.prompts) as f:
        prompts = json.load(f)

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=args.target,
        speculative_config={
            "method": args.method,
            "model": args.drafter,
            "num_speculative_tokens": args.draft_tokens,
        },
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
        disable_log_stats=False,
    )
    before = counters(llm)
    llm.generate(
        [TokensPrompt(prompt_token_ids=q) for q in prompts],
        SamplingParams(temperature=args.temperature, max_tokens=args.new_tokens, seed=0),
        use_tqdm=False,
    )
    after = counters(llm)
    moved = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted_tokens")}
    old = before["accepted_per_position"]
    moved["accepted_per_position"] = [
        v - (old[i] if i < len(old) else 0) for i, v in enumerate(after["accepted_per_position"])
    ]
    print(json.dumps({"vllm_version": vllm.__version__, "counters": moved}))


if __name__ == "__main__":
    sys.exit(main())
