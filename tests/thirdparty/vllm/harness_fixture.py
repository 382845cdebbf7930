"""Patch 1 of ``harness.py``: the config-only copy of a fixture that vLLM reads.

Standard library only, so that mtpcheck's own test suite (whose venv has no vLLM) can make the
copy too (``tests/test_accept_vllm.py``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

#: config.json keys added to a DeepSeek-V3 fixture copy when absent.
DEEPSEEK_V3_ROUTER_KEYS = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}


def prepare_fixture(src: str | os.PathLike, dest_dir: str | os.PathLike) -> Path:
    """Copy fixture ``src`` to ``dest_dir/<name>`` and patch its config.json for vLLM.

    What it changes: for ``model_type == "deepseek_v3"`` it adds ``topk_method: "noaux_tc"``
    and ``scoring_func: "sigmoid"`` where absent (the release config of DeepSeek-V3 carries
    both; ``save_pretrained`` leaves them out, and the shipped fixture has them since its
    generator adds them). Why:
    transformers' ``DeepseekV3TopkRouter`` always scores experts with ``sigmoid`` and adds
    ``e_score_correction_bias`` for the choice (``modeling_deepseek_v3.py``), whereas vLLM's
    ``DeepseekV2MoE`` reads ``getattr(config, "scoring_func", "softmax")`` and creates the
    ``e_score_correction_bias`` parameter only when ``topk_method == "noaux_tc"``
    (``vllm/model_executor/models/deepseek_v2.py``). Without the two keys vLLM routes a
    different function of the same weights. The weight files are copied byte for byte; the
    tokenizer and workloads are copied unchanged. Other families are copied unchanged.

    Returns the path of the copy (replaced if it exists).
    """
    src = Path(src)
    dest = Path(dest_dir) / src.name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    config_path = dest / "config.json"
    config = json.loads(config_path.read_text())
    added = {}
    if config.get("model_type") == "deepseek_v3":
        for key, value in DEEPSEEK_V3_ROUTER_KEYS.items():
            if key not in config:
                config[key] = value
                added[key] = value
    if added:
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    return dest
