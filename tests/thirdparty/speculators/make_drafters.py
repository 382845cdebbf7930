"""Writes the speculators drafters for the tiny Llama target with speculators' own classes.

    python make_drafters.py WORK

Run with WORK holding ``llama-target`` (make_target.py) and ``other/llama-target`` (the same
Llama with vocab_size 300, make_target_300 below); the current directory is changed to WORK
(and to WORK/other for the wrong-vocabulary case) so that every drafter records its verifier
as the relative path ``llama-target``, the folder beside it in the shipped corpus. Each case
is written to WORK/<case> by the model's ``save_pretrained``; NOTES.md says what each is.
"""

import os
import sys
import warnings
from pathlib import Path

import torch
from datasets import Dataset
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.dflash import DFlashDraftModel
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from speculators.models.peagle import PEagleDraftModel
from speculators.proposals.greedy import GreedyTokenProposalConfig
from speculators.train.cli import create_transformer_layer_config
from speculators.train.vocab_mapping import (
    build_vocab_mappings_from_distribution,
    save_token_frequency_distribution,
)

VERIFIER = "llama-target"
DRAFT_VOCAB = 128
AUX_IDS = [1, 2, 3]
# The "training data" whose token counts pick the 128 draft tokens: 4096 token ids drawn with
# a seeded generator from a Zipf-like law (probability 1/rank) over a seeded permutation of
# the target's 256 ids, loss on every token; so the kept ids are spread over the vocabulary.
NUM_TOKENS = 4096


def layer_config(arch: str = "llama", num_layers: int = 1):
    """The draft decoder config as `speculators train` synthesizes it (one full-attention
    layer shaped like the verifier's)."""
    return create_transformer_layer_config(
        verifier_name_or_path=VERIFIER,
        num_layers=num_layers,
        draft_arch=arch,
        hidden_act="silu",
        sliding_window=2048,
        full_attention_indices=list(range(num_layers)),
    )


def vocab_mappings(target_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t, t2d from speculators' own token-frequency pipeline."""
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(256, generator=g)
    weights = 1.0 / torch.arange(1, 257, dtype=torch.float64)
    ids = order[torch.multinomial(weights, NUM_TOKENS, replacement=True, generator=g)]
    ds = Dataset.from_dict({"input_ids": [ids.tolist()], "loss_mask": [[1] * NUM_TOKENS]})
    ds = ds.with_format("torch")
    path = Path("token_freq.pt")
    if path.exists():
        path.unlink()
    save_token_frequency_distribution(ds, path)
    freq = torch.load(path, weights_only=True)
    path.unlink()
    return build_vocab_mappings_from_distribution(
        token_freq_dict=freq, draft_vocab_size=DRAFT_VOCAB, target_vocab_size=target_vocab
    )


def eagle3(out: str, *, aux_ids=AUX_IDS, draft_vocab=DRAFT_VOCAB, target_vocab=256):
    torch.manual_seed(0)
    d2t, t2d = vocab_mappings(target_vocab) if draft_vocab < target_vocab else (None, None)
    model = Eagle3DraftModel.from_training_args(
        verifier_config=layer_config(),
        t2d=t2d,
        d2t=d2t,
        verifier_name_or_path=VERIFIER,
        target_layer_ids=aux_ids,
        draft_vocab_size=draft_vocab,
        norm_before_residual=False,
        ttt_steps=3,
        draft_attn_impl="sdpa",
    )
    model.save_pretrained(out)


def eagle3_no_aux_ids(out: str):
    """The config class and model class without eagle_aux_hidden_state_layer_ids, as
    `speculators train --from-pretrained CONFIG_DIR` builds a fresh draft from a saved config
    (_build_from_config_only): config, model, load_vocab_mappings, load_verifier_weights."""
    torch.manual_seed(0)
    d2t, t2d = vocab_mappings(256)
    tl = layer_config()
    tl._attn_implementation = "sdpa"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=tl,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=False,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(VERIFIER),
        ),
    )
    model = Eagle3DraftModel(config=config)
    model.load_vocab_mappings(t2d, d2t)
    model.load_verifier_weights()
    model.save_pretrained(out)


def peagle(out: str):
    torch.manual_seed(0)
    d2t, t2d = vocab_mappings(256)
    model = PEagleDraftModel.from_training_args(
        verifier_config=layer_config(),
        t2d=t2d,
        d2t=d2t,
        verifier_name_or_path=VERIFIER,
        target_layer_ids=AUX_IDS,
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=False,
        mask_token_id=255,
        num_depths=4,
        draft_attn_impl="sdpa",
    )
    model.save_pretrained(out)


def dflash(out: str):
    torch.manual_seed(0)
    model = DFlashDraftModel.from_training_args(
        verifier_config=layer_config("qwen3", num_layers=2),
        verifier_name_or_path=VERIFIER,
        target_layer_ids=AUX_IDS,
        draft_vocab_size=256,
        block_size=4,
        mask_token_id=255,
        draft_attn_impl="sdpa",
    )
    model.save_pretrained(out)


def main(work: str) -> None:
    warnings.simplefilter("ignore")
    work = os.path.abspath(work)
    os.chdir(work)
    eagle3(f"{work}/eagle3")
    eagle3_no_aux_ids(f"{work}/eagle3-no-aux-ids")
    eagle3(f"{work}/eagle3-4aux", aux_ids=[1, 2, 3, 4])
    eagle3(f"{work}/eagle3-shared-embed", draft_vocab=256)
    peagle(f"{work}/peagle")
    dflash(f"{work}/dflash")
    # trained against a different "llama-target": the same Llama with 300 tokens
    os.chdir(f"{work}/other")
    eagle3(f"{work}/eagle3-wrong-vocab", target_vocab=300)


if __name__ == "__main__":
    main(sys.argv[1])
