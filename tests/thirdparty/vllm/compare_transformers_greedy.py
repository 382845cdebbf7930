"""Check vLLM's greedy speculative output against transformers' plain greedy generation.

    .venv/bin/python tests/thirdparty/vllm/compare_transformers_greedy.py RESULT.json ...

Runs in mtpcheck's own venv (transformers, no vLLM). For each ``run_vllm.py`` result at
temperature 0, it loads the result's fixture with transformers (``AutoModelForCausalLM``,
or ``AutoModelForImageTextToText`` for a vision-language checkpoint, float32, CPU) and
generates greedily from each prompt as many tokens as vLLM returned. Greedy speculative
decoding must return exactly the target model's greedy tokens, whatever the drafter
proposes, so equality checks that the patched engine computes the same main model as
transformers (the patches of ``harness.py`` included); the drafter is not checked by this.
Prints one JSON line per result; exit 1 when any sequence differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]


def load_model(fixture: Path):
    import transformers

    config = json.loads((fixture / "config.json").read_text())
    cls = (
        transformers.AutoModelForImageTextToText
        if "vision_config" in config
        else transformers.AutoModelForCausalLM
    )
    return cls.from_pretrained(str(fixture), dtype=torch.float32).eval()


def greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def main(paths: list[str]) -> int:
    ok = True
    for path in paths:
        result = json.loads(Path(path).read_text())
        if "requests" not in result:
            continue  # not a run_vllm.py result
        if result["temperature"] != 0:
            print(json.dumps({"result": path, "skipped": "not greedy"}))
            continue
        fixture = Path(result["fixture"])
        if not fixture.is_absolute():
            fixture = REPO / fixture
        model = load_model(fixture)
        first_diff = []
        for request in result["requests"]:
            ours = greedy(model, request["prompt"], len(request["generated"]))
            theirs = request["generated"]
            first_diff.append(
                next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
            )
        same = sum(d is None for d in first_diff)
        ok &= same == len(first_diff)
        print(
            json.dumps(
                {
                    "result": path,
                    "identical_sequences": same,
                    "of": len(first_diff),
                    "first_divergence": [d for d in first_diff if d is not None],
                }
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
