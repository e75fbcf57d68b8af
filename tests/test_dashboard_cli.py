"""``forensics dashboard``: the streamlit command it runs (127.0.0.1, headless, options passed through), bad input in
one line with exit 2, and the Markdown escaping of dataset text on the page."""

from __future__ import annotations

import pytest

from forensics.cli import main
from forensics.cli.dashboard import split_streamlit_options, streamlit_command
from forensics.dashboard.text import md


def test_streamlit_options_pass_through_in_both_spellings() -> None:
    ours, theirs = split_streamlit_options(
        ["case", "--server.port", "8600", "--browser.serverAddress=x", "--host", "h", "--theme.base", "dark"]
    )
    assert ours == ["case", "--host", "h"]
    assert theirs == ["--server.port", "8600", "--browser.serverAddress=x", "--theme.base", "dark"]


def test_command_binds_localhost_headless_by_default() -> None:
    cmd = streamlit_command(["/runs/case"])
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("forensics/dashboard/entry.py")
    opts = dict(zip(cmd[5:-2:2], cmd[6:-2:2]))
    assert opts == {"--server.address": "127.0.0.1", "--server.headless": "true", "--browser.gatherUsageStats": "false"}
    assert cmd[-2:] == ["--", "/runs/case"]
    cmd = streamlit_command([], host="0.0.0.0", port=9000, options=["--server.headless", "false"])
    assert cmd[cmd.index("--server.address") + 1] == "0.0.0.0" and cmd[cmd.index("--server.port") + 1] == "9000"
    assert cmd.count("--server.headless") == 1 and cmd[cmd.index("--server.headless") + 1] == "false"
    assert cmd[-1] == "--"


def test_cli_prints_the_command_with_targets_after_options(tmp_path, capsys) -> None:
    log = tmp_path / "train.jsonl"
    log.write_text('{"step": 0, "loss": 1.0}\n')
    assert main(["dashboard", "--port", "8123", str(log), "--server.runOnSave", "false", "--print-command"]) == 0
    out = capsys.readouterr().out.split()
    assert out[-2:] == ["--", str(log)]
    assert "--server.runOnSave" in out and out[out.index("--server.port") + 1] == "8123"


def test_missing_source_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    assert main(["dashboard", str(tmp_path / "nope.jsonl"), "--print-command"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.jsonl does not exist" in err[0]
    with pytest.raises(SystemExit) as exc:
        main(["dashboard", "--bogus"])
    assert exc.value.code == 2


def test_port_given_twice_is_bad_input(capsys) -> None:
    assert main(["dashboard", "--port", "1", "--server.port", "2", "--print-command"]) == 2
    assert "--port or --server.port" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text", ["<script>alert(1)</script>", "**bold** _it_ [a](http://x) `c` # h | t ~~s~~ $x$", "a\\b > q"]
)
def test_dataset_text_is_escaped_for_markdown(text: str) -> None:
    out = md(text)
    assert "<" not in out
    for ch in "*_[]`#|~$>":
        assert all(out[i - 1] == "\\" for i, c in enumerate(out) if c == ch)
    # unescaping gives back the text (newlines folded)
    assert out.replace("&lt;", "<").replace("&amp;", "&").replace("\\\\", "\x00").replace("\\", "").replace(
        "\x00", "\\"
    ) == " ".join(text.split())
