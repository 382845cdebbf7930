"""What vLLM builds for a DeepSeek-V3 checkpoint's MoE router, from its config.json.

    shimmed_python probe_router.py CHECKPOINT...

Starts vLLM's offline engine in this process for each checkpoint in turn (no tokenizer), and
prints one line each: ``ROUTER {"<module>": [scoring_func, has e_score_correction_bias]}``
read from the built model with ``LLM.apply_model``, or ``REFUSED <exception type>: <message>``
for a load that fails.
Run by tests/test_serving.py.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _router(model) -> dict[str, list[object]]:
    return {
        name: [
            str(module.scoring_func),
            getattr(module, "e_score_correction_bias", None) is not None,
        ]
        for name, module in model.named_modules()
        if "experts" in name and hasattr(module, "scoring_func")
    }


def probe(path: str) -> None:
    import gc

    from vllm import LLM

    try:
        llm = LLM(
            model=path,
            skip_tokenizer_init=True,
            dtype="float32",
            enforce_eager=True,
            max_model_len=64,
            max_num_seqs=1,
            kv_cache_memory_bytes=64 << 20,  # the default reserves gigabytes on CPU
        )
    except Exception as e:  # the refusal is the result
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        print(f"REFUSED {type(cause).__name__}: {cause}", flush=True)
        return
    print("ROUTER " + json.dumps(llm.apply_model(_router)[0]), flush=True)
    del llm
    gc.collect()


if __name__ == "__main__":
    for checkpoint in sys.argv[1:]:
        probe(checkpoint)
