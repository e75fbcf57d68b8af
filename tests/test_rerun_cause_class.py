"""The cause-class decision at each of its boundaries: one row per rule, and the rows where two rules meet."""

from __future__ import annotations

import pytest

from forensics.replay.cause_class import (
    CAUSE_CLASSES,
    ClassEvidence,
    action,
    apply_cause_classes,
    cause_class,
    verdict_with_class,
)

E = ClassEvidence
ROWS = [
    # numerics first: an overflow decides whatever else holds
    (E(nonfinite=True, reproduced=True, spike_gone=True), "numerics"),
    (E(nonfinite=True, reproduced=False, deterministic=True), "numerics"),
    (E(nonfinite=True, spike=False), "numerics"),
    (E(loss_scale_drop=True, reproduced=True, spike_gone=False), "numerics"),
    (E(nan_iterations=True, reproduced=True, spike_gone=True), "numerics"),
    (E(nan_iterations=True, crash="ecc"), "numerics"),
    (E(spike=False, nan_iterations=True), None),
    # no spike: nothing to class, whatever moved in a healthy run
    (E(spike=False, reproduced=True, spike_gone=True), None),
    (E(spike=False, loss_scale_drop=True), None),
    (E(spike=False, crash="ecc"), None),
    (E(spike=False, reproduced=False, deterministic=True), None),
    (E(spike=False, optimizer_jump=True, logits_past_range=True), None),
    (E(spike=True, reproduced=True, spike_gone=True), "data"),
    (E(spike=None, reproduced=True, spike_gone=True), "data"),
    # a hardware crash line beats everything but an overflow
    (E(crash="ecc", reproduced=True, spike_gone=True), "hardware"),
    (E(crash="nccl"), "hardware"),
    (E(crash="oom", reproduced=True, spike_gone=True), "data"),
    # not reproduced: hardware only when the replay itself is deterministic and no dropout
    (E(reproduced=False, deterministic=True), "hardware"),
    (E(reproduced=False, deterministic=False), "unknown"),
    (E(reproduced=False, deterministic=True, dropout=True), "unknown"),
    (E(reproduced=False, deterministic=None), "unknown"),
    # reproduced: the replaced batch decides
    (E(reproduced=True, deterministic=True, spike_gone=True), "data"),
    (E(reproduced=True, deterministic=True, spike_gone=True, optimizer_jump=True), "data"),
    (E(reproduced=True, deterministic=True, spike_gone=False), "optimizer"),
    (E(reproduced=True, spike_gone=False, logits_past_range=True), "optimizer"),
    # no replaced batch: the jumps before the step, then the logits
    (E(reproduced=True, spike_gone=None, optimizer_jump=True), "optimizer"),
    (E(reproduced=None, optimizer_jump=True, logits_past_range=True), "optimizer"),
    (E(reproduced=True, spike_gone=None, logits_past_range=True), "numerics"),
    (E(reproduced=True, spike_gone=None), "unknown"),
    (E(), "unknown"),
    # the logged update or params norm leading the loss: optimizer, where the re-run's jumps decide
    (E(reproduced=True, spike_gone=None, logged_update_rise=True), "optimizer"),
    (E(logged_update_rise=True, logits_past_range=True), "optimizer"),
    (E(reproduced=True, spike_gone=True, logged_update_rise=True), "data"),
    (E(reproduced=False, deterministic=True, logged_update_rise=True), "hardware"),
    (E(loss_scale_drop=True, logged_update_rise=True), "numerics"),
    (E(spike=False, logged_update_rise=True), None),
    # the logged z loss or zero-gradient count at or before it: numerics, only when nothing above decides
    (E(reproduced=True, spike_gone=None, logged_numerics_rise=True), "numerics"),
    (E(logged_numerics_rise=True, optimizer_jump=True), "optimizer"),
    (E(logged_numerics_rise=True, logged_update_rise=True), "optimizer"),
    (E(reproduced=True, spike_gone=True, logged_numerics_rise=True), "data"),
    (E(reproduced=True, spike_gone=False, logged_numerics_rise=True), "optimizer"),
    (E(spike=False, logged_numerics_rise=True), None),
]


@pytest.mark.parametrize(("evidence", "expected"), ROWS)
def test_cause_class_rule_order(evidence: ClassEvidence, expected: str | None) -> None:
    cls, why = cause_class(evidence)
    assert cls == expected
    assert why


def test_every_class_has_an_action_naming_the_checkpoint() -> None:
    for cls in CAUSE_CLASSES:
        text = action(cls, 14, 12, "block.0.attn")
        assert "12" in text and text.endswith(".")
    assert "block.0.attn" in action("optimizer", 14, 12, "block.0.attn")
    assert "before it" in action("hardware", 3, None)


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("transformer.wte.weight", "embeddings"),
        ("transformer.wpe.weight", "embeddings"),
        ("model.embed_tokens.weight", "embeddings"),
        ("transformer.h.0.attn.c_attn.weight", "block.0.attn"),
        ("transformer.h.11.attn.c_proj.bias", "block.11.attn"),
        ("transformer.h.1.mlp.c_fc.weight", "block.1.mlp"),
        ("model.layers.3.self_attn.q_proj.weight", "block.3.attn"),
        ("model.layers.3.mlp.down_proj.weight", "block.3.mlp"),
        ("transformer.h.0.ln_1.weight", "norms"),
        ("transformer.ln_f.bias", "norms"),
        ("model.layers.2.input_layernorm.weight", "norms"),
        ("model.norm.weight", "norms"),
        ("lm_head.weight", "head"),
    ],
)
def test_parameter_groups_follow_the_modules(name: str, group: str) -> None:
    from forensics.replay.rerun import param_group

    assert param_group(name) == group


BASE = "loss spiked at step 17: samples 1, 2 were in its batch."


@pytest.mark.parametrize(
    ("verdict", "cause", "expected"),
    [
        (BASE, {}, BASE),
        (BASE, {"cause_class": None, "action": None}, BASE),
        (BASE, {"cause_class": "data", "action": "Skip them."}, BASE[:-1] + "; re-run: cause class data (Skip them)."),
        # told again: the clause is replaced, never repeated
        (
            BASE[:-1] + "; re-run: cause class data (Skip them).",
            {"cause_class": "optimizer", "action": "Lower the lr."},
            BASE[:-1] + "; re-run: cause class optimizer (Lower the lr).",
        ),
        (BASE[:-1] + "; re-run: cause class data (Skip them).", {}, BASE),
        ("", {"cause_class": "data", "action": "Skip them."}, ""),
    ],
)
def test_verdict_names_the_main_cause_class_once(verdict: str, cause: dict, expected: str) -> None:
    assert verdict_with_class(verdict, cause) == expected


def test_apply_cause_classes_twice_gives_what_once_gives() -> None:
    rerun = {"cause_class": "hardware", "action": "Quarantine the node that ran step 13 and resume from checkpoint 8."}
    replay = {"steps": [{"step": 13, "rerun": rerun}]}
    findings = {
        "verdict": BASE,
        "causes": [{"id": "C1", "kind": "batch", "steps": [13, 20]}, {"id": "C2", "kind": "batch", "steps": [30]}],
    }
    once = apply_cause_classes(findings, replay)
    assert once["causes"][0]["cause_class"] == "hardware"
    assert "cause_class" not in once["causes"][1]
    assert once["verdict"] == BASE[:-1] + "; re-run: cause class hardware (" + rerun["action"][:-1] + ")."
    import copy

    assert apply_cause_classes(copy.deepcopy(once), replay) == once
