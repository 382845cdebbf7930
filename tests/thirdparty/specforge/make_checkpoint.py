"""Writes, for one case, what a SpecForge 0.2.0 EAGLE-3 run leaves before `specforge export`:

    python make_checkpoint.py TARGET WORK CASE [AUX_IDS]

WORK/CASE/draft_config.json   the draft config a user passes as model.draft_model_config
                              (SpecForge's stock Llama EAGLE-3 layout, shaped from TARGET's
                              config.json, draft_vocab_size 128; with AUX_IDS, e.g. "1,2,3",
                              also eagle_config.eagle_aux_hidden_state_layer_ids)
WORK/CASE/cache/vocab_mapping/vocab_mapping.pt
                              specforge.data.preprocessing.generate_vocab_mapping_file
WORK/CASE/run/                specforge.training.checkpoint.CheckpointManager.save of the
                              payload SpecForge's trainer writes (strategy "eagle3")

No training step runs (online capture needs an SGLang server on a GPU): the draft keeps its
seeded random init. Everything else is SpecForge's own code path, on CPU.
"""

import json
import os
import sys
from types import SimpleNamespace

import torch
from datasets import Dataset
from specforge.algorithms.eagle3.model import OnlineEagle3Model
from specforge.algorithms.eagle3.providers import resume_contract
from specforge.data.preprocessing import generate_vocab_mapping_file
from specforge.modeling.auto import AutoDraftModel
from specforge.training.checkpoint import CheckpointManager
from specforge.training.model_loading import load_draft_config_source
from specforge.training.strategies.base import Eagle3TrainStrategy

DRAFT_VOCAB = 128
TOKENS = 4096


def draft_config(target_dir, aux_ids):
    with open(os.path.join(target_dir, "config.json")) as f:
        t = json.load(f)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": t["hidden_act"],
        "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"],
        "num_attention_heads": t["num_attention_heads"],
        "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t["head_dim"],
        "num_hidden_layers": 1,
        "max_position_embeddings": t["max_position_embeddings"],
        "rms_norm_eps": t["rms_norm_eps"],
        "rope_theta": t["rope_parameters"]["rope_theta"],
        "initializer_range": t["initializer_range"],
        "pad_token_id": 0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": t["vocab_size"],
        "draft_vocab_size": DRAFT_VOCAB,
    }
    if aux_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux_ids}
    return cfg


def token_dataset(vocab_size):
    # stands in for a tokenized chat dataset: TOKENS ids drawn with probability ~ 1/rank over
    # a seeded permutation of the target vocabulary, every token loss-bearing
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(vocab_size, generator=g)
    p = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
    ids = perm[torch.multinomial(p, TOKENS, replacement=True, generator=g)]
    ds = Dataset.from_dict({"input_ids": [ids.tolist()], "loss_mask": [[1] * TOKENS]})
    return ds.with_format("torch")


def main():
    target_dir, work, case = sys.argv[1:4]
    aux_ids = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
    out = os.path.join(work, case)
    os.makedirs(out, exist_ok=True)

    cfg_path = os.path.join(out, "draft_config.json")
    with open(cfg_path, "w") as f:
        json.dump(draft_config(target_dir, aux_ids), f, indent=2)
        f.write("\n")

    # the draft exactly as specforge.algorithms.model_providers.build_eagle3_draft builds it
    torch.manual_seed(0)
    config = load_draft_config_source(cfg_path)
    model = AutoDraftModel.from_config(config, attention_backend="sdpa", torch_dtype=torch.bfloat16)
    mapping = generate_vocab_mapping_file(
        token_dataset(config.vocab_size),
        target_vocab_size=config.vocab_size,
        draft_vocab_size=config.draft_vocab_size,
        cache_dir=os.path.join(out, "cache", "vocab_mapping"),
    )
    model.load_vocab_mapping(mapping)
    model.load_embedding(target_dir, embedding_key="model.embed_tokens.weight")
    model.freeze_embedding()

    # the checkpoint payload of specforge.training.controller.save_checkpoint
    online = OnlineEagle3Model(model, length=7, attention_backend="sdpa")
    strategy = Eagle3TrainStrategy(online)
    state = {
        "draft_state_dict": strategy.checkpoint_state_filter(online.state_dict()),
        "global_step": 1,
        "epoch": 0,
        "epoch_batch": 1,
        "epoch_samples": 1,
        "strategy": strategy.name,
        "run_id": case,
        "world_size": 1,
        # the trainer's checkpoint_extra: the EAGLE-3 resume contract (training defaults)
        **resume_contract(
            SimpleNamespace(
                training=SimpleNamespace(compact_teacher=False, compact_teacher_chunk_size=None)
            ),
            model,
            online,
        ),
    }
    ckpt = CheckpointManager(os.path.join(out, "run"), case).save(state, 1)
    print(f"draft config {cfg_path}")
    print(f"vocab mapping {mapping}")
    print(f"checkpoint {ckpt}: {sorted(state['draft_state_dict'])}")


if __name__ == "__main__":
    main()
