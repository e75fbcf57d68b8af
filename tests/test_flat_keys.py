"""How nested keys become metric names: one rule (``a/b``, outermost first), the same whichever source carried the
value (a JSONL line, a W&B history row, an Arrow struct column)."""

from __future__ import annotations

from forensics.schema import KEY_SEPARATOR, flatten_keys, nested_key

ROW = {
    "train/loss": 0.5,
    "opt": {"lr": 1e-3, "grad": {"norm": 2.0}},
    "caption": "row 1",
    "empty": {},
    "weights": {"_type": "histogram", "values": [1, 2]},
    "eval": {"acc": None},
}


def test_nested_keys_join_their_parts_outermost_first():
    assert KEY_SEPARATOR == "/"
    assert nested_key("opt", "grad", "norm") == "opt/grad/norm"
    assert flatten_keys({"opt": {"grad": {"norm": 2.0}}}) == {"opt/grad/norm": 2.0}


def test_flatten_keys_keeps_every_leaf_in_first_seen_order_and_drops_empty_mappings():
    flat = flatten_keys(ROW)
    assert list(flat) == [
        "train/loss",
        "opt/lr",
        "opt/grad/norm",
        "caption",
        "weights/_type",
        "weights/values",
        "eval/acc",
    ]
    assert flat["weights/values"] == [1, 2] and flat["eval/acc"] is None


def test_a_mapping_kept_whole_is_one_leaf_under_its_own_name():
    flat = flatten_keys(ROW, is_leaf=lambda d: "_type" in d)
    assert flat["weights"] == {"_type": "histogram", "values": [1, 2]} and "weights/_type" not in flat


def test_a_prefix_names_the_mapping_and_a_later_key_wins():
    assert flatten_keys({"x": 1, "y": {"z": 2}}, prefix="run") == {"run/x": 1, "run/y/z": 2}
    assert flatten_keys({"": {"x": 1}}) == {"/x": 1}
    assert flatten_keys({"a": {"b": 1}, "a/b": 2}) == {"a/b": 2}
