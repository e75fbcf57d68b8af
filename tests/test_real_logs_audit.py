"""The real public logs of fixtures/real-logs, audited as a user pastes them: no false all-clear on a short
excerpt around a spike, and no alarm from a timing field that is NaN before timing starts."""

from __future__ import annotations

import json

from forensics.cli import main


def test_bloom_excerpt_yields_its_spike_and_says_the_grad_norm_led(real_logs_dir, tmp_path, capsys):
    out = tmp_path / "f.json"
    assert (
        main(
            ["audit", "--metrics", str(real_logs_dir / "bloom-176b-tr11-megatron.log"), "--no-html", "--json", str(out)]
        )
        == 0
    )
    capsys.readouterr()
    findings = json.loads(out.read_text())
    (loss,) = [s for s in findings["spikes"] if s["metric"] == "lm loss"]
    # Megatron prints iteration N after the N-th update: canonical step N - 1, logged as printed.
    assert (loss["peak_step"], loss["logged_step"]) == (31218, 31219)
    assert loss["value"] > 5.0 and loss["details"]["judged_by"] == "two_sided"
    assert findings["run"]["logged_offset"] == 1
    assert "steps before the loss" in findings["verdict"] and "optimizer-led" in findings["verdict"]


def test_nanogpt_timing_nans_are_info_and_do_not_fail_ci(real_logs_dir, tmp_path, capsys):
    out = tmp_path / "f.json"
    code = main(
        [
            "audit",
            "--metrics",
            str(real_logs_dir / "modded-nanogpt-1b-adamw.log"),
            "--no-html",
            "--json",
            str(out),
            "--fail-on",
            "nonfinite",
        ]
    )
    capsys.readouterr()
    findings = json.loads(out.read_text())
    assert code == 0
    assert {(f["metric"], f["severity"]) for f in findings["nonfinite"]} == {("step_avg", "info")}
    assert len(findings["nonfinite"]) == 13
    assert len([s for s in findings["spikes"] if s["metric"] == "train_loss"]) == 36
