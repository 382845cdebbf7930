"""mtpcheck's MTP head against a reference nobody in this project wrote: transformers' own
``MtpModel`` (the drafter behind ``generate(use_mtp=True)``), run teacher-forced on the same
sequences. Same drafts position by position, logits within float32 noise."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from mtpcheck.accept.loading import Drafter, open_drafter
from mtpcheck.accept.scoring import score_batch
from mtpcheck.accept.workloads import load_tokenizer, tokenise
from tests.conftest import FIXTURES

ACCEPT = FIXTURES / "accept_deepseek_v3"


def _reference_logits(
    fixture: Path, pattern: str, kinds: tuple[str, str] | None, ids: torch.Tensor
) -> torch.Tensor:
    """transformers' MtpModel, teacher-forced: slot t drafts token t+2 from the main model's
    hidden state at t and the embedding of token t+1. ``kinds``: the (attention, MLP) kind of
    the MTP layer, for configs that do not declare ``num_mtp_layers`` (Qwen3-Next)."""
    import transformers
    from transformers.modeling_layers import MtpModel

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.float32)
    # its MTP pattern names the released depth (layers.61, .46, .92); the fixtures' is 2
    model._keys_to_ignore_on_load_unexpected = [pattern]
    if kinds is not None:
        config = model.config.get_text_config()
        config.num_mtp_layers = 1
        config.mtp_layer_types = [kinds[0]]
        if getattr(config, "mlp_layer_types", None):
            config.mtp_mlp_layer_types = [kinds[1]]
    mtp = MtpModel.from_pretrained(model).eval()
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[-1]
        positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        state = mtp.forward_layer(0, hidden[:, :-1], positions[:, 1:], None, input_ids=ids[:, 1:])
        return mtp._project_to_logits(state)


WORDS = "w01 w02 w03 w05 w08 w13 w21 w34 w55 w09 w04 w40"
LAYER_2 = r"model\.layers\.2\..*"


@pytest.mark.parametrize(
    ("fixture", "pattern", "kinds", "words"),
    [
        (ACCEPT, LAYER_2, None, None),  # the trained fixture, on its in-domain workload
        (FIXTURES / "glm4_moe", LAYER_2, None, WORDS),
        (FIXTURES / "qwen3_next", r"^mtp.*", ("full_attention", "sparse"), WORDS),
        (FIXTURES / "accept_qwen3_next", r"^mtp.*", ("full_attention", "sparse"), None),
        (FIXTURES / "qwen3_5_text", r"^mtp.*", ("full_attention", "dense"), WORDS),
        (FIXTURES / "qwen3_5_moe", r"^mtp.*", ("full_attention", "sparse"), WORDS),
    ],
    ids=[
        "deepseek_v3",
        "glm4_moe",
        "qwen3_next",
        "qwen3_next_trained",
        "qwen3_5_text",
        "qwen3_5_moe_vlm_packed",
    ],
)
def test_mtp_head_matches_transformers_mtp_model(
    fixture: Path, pattern: str, kinds: tuple[str, str] | None, words: str | None
) -> None:
    tokenizer = load_tokenizer(ACCEPT)
    if words is None:
        path = fixture / "workloads" / "in_domain.jsonl"
        sequences = [list(s) for s in tokenise("w", path, tokenizer, 512).sequences[:6]]
    else:  # ids 4..63: inside the untrained GLM fixture's 64-token vocabulary
        sequences = [tokenizer(words)["input_ids"], tokenizer(words[::-1])["input_ids"]]
        sequences = [s[: min(map(len, sequences))] for s in sequences]
    ids = torch.tensor(sequences)
    drafter = open_drafter(fixture, dtype="float32")
    assert isinstance(drafter, Drafter)
    reference = _reference_logits(fixture, pattern, kinds, ids)
    with torch.no_grad():
        hidden = drafter.model(input_ids=ids, output_hidden_states=True, use_cache=False)
        ours = drafter.head(hidden.hidden_states[-1][:, :-1], ids[:, 1:])
    assert (ours.argmax(-1) == reference.argmax(-1)).all()  # the same draft everywhere
    assert float((ours - reference).abs().max()) < 1e-4
    # and the greedy verdicts mtpcheck reports are the reference's
    with torch.no_grad():
        main = drafter.model(input_ids=ids, use_cache=False).logits[:, 1:].argmax(-1)
    for row, (hits, _) in enumerate(score_batch(drafter, sequences, 0.0)):
        assert hits.tolist() == (reference[row].argmax(-1) == main[row]).tolist()
