"""Where a model config keeps a key: top level first, then ``text_config``."""

from mtpcheck.model.config_keys import MISSING, is_int, lookup, text_value

VLM = {"model_type": "qwen3_5_moe", "text_config": {"hidden_size": 64, "mtp_num_hidden_layers": 1}}


def test_a_nested_key_is_found_under_text_config_with_its_path() -> None:
    assert text_value(VLM, "mtp_num_hidden_layers") == ("text_config.mtp_num_hidden_layers", 1)
    assert text_value(VLM, "num_nextn_predict_layers") is None


def test_the_top_level_comes_first() -> None:
    config = {"hidden_size": 32, "text_config": {"hidden_size": 64}}
    assert text_value(config, "hidden_size") == ("hidden_size", 32)


def test_accept_passes_over_a_value_it_refuses() -> None:
    config = {"hidden_size": "wide", "text_config": {"hidden_size": 64}}
    assert text_value(config, "hidden_size") == ("hidden_size", "wide")
    assert text_value(config, "hidden_size", is_int) == ("text_config.hidden_size", 64)
    assert text_value({"hidden_size": True}, "hidden_size", is_int) is None


def test_null_is_a_value_and_a_missing_path_is_not() -> None:
    assert text_value({"mtp_num_layers": None}, "mtp_num_layers") == ("mtp_num_layers", None)
    assert lookup({"a": {"b": None}}, "a.b") is None
    assert lookup({"a": 1}, "a.b") is MISSING
    assert lookup({"text_config": "not an object"}, "text_config.hidden_size") is MISSING
