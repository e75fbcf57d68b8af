"""The documentation: the site builds offline with warnings as errors, its generated references hold every command
and every finding kind, the README stays short and names only files the repository holds, and the shell blocks of
Getting started run as written in a fresh folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Paths a page may name that the repository holds; outputs the bench scripts write are not among them.
REPO_PATH = re.compile(r"^(forensics|tests|bench|fixtures|docs|\.ci)/[\w./*-]+$")
#: A measured figure: seconds, a ratio, a share, a size.
FIGURE = re.compile(r"\b\d+(\.\d+)?\s?(s|ms|x|%|MB|GB|MiB|GiB)\b")


def _commands() -> dict:
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(ROOT / "docs"))
    from forensics.cli import build_parser

    return gen_reference._subcommands(build_parser())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once by mkdocs itself (no network: the material theme and the hook are local)."""
    pytest.importorskip("mkdocs", reason="mkdocs comes with the test extra")
    pytest.importorskip("material", reason="mkdocs-material comes with the test extra")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _section(html: str, anchor: str) -> str:
    """The HTML from heading ``anchor`` to the next heading of the same level."""
    m = re.search(rf'<h2 id="{re.escape(anchor)}"', html)
    assert m, f"no generated entry #{anchor}"
    end = html.find("<h2 ", m.end())
    return html[m.start() : end if end >= 0 else len(html)]


@pytest.mark.slow
def test_cli_reference_has_every_command_and_option(site: Path):
    html = (site / "reference" / "cli" / "index.html").read_text()
    commands = _commands()
    assert len(commands) >= 13
    for name, (parser, _) in commands.items():
        section = _section(html, name)
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in section, f"forensics {name}: {flag} missing from the CLI reference"
        page = site / "commands" / name / "index.html"
        assert page.is_file(), f"forensics {name} has no page under docs/commands/"
        assert f'<h2 id="{name}"' in page.read_text(), f"forensics {name}'s page lacks its generated options"


@pytest.mark.slow
def test_findings_reference_has_every_kind(site: Path):
    from forensics.detect.kinds import KINDS

    html = (site / "reference" / "findings" / "index.html").read_text()
    assert len(KINDS) >= 20
    for kind in KINDS.values():
        section = _section(html, kind.kind.replace("_", "-"))
        assert f"<code>{kind.kind}</code>" in section
        if kind.fail_on:
            assert f"<code>{kind.fail_on}</code>" in section, f"{kind.kind}: --fail-on {kind.fail_on} not shown"
        else:
            assert "not a gate" in section


def test_every_kind_says_what_triggers_it():
    """The findings reference is only as good as the registry's words: a new kind registers them too
    (:func:`forensics.detect.kinds.document_kind`)."""
    import forensics.detect.rules  # noqa: F401
    from forensics.detect.kinds import KINDS

    assert [k.kind for k in KINDS.values() if not k.triggers.strip()] == []


def test_every_command_has_a_page_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [name for name in _commands() if f"commands/{name}.md" not in nav]
    assert missing == []


def test_readme_is_short_and_has_no_figures():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert [m.group(0) for m in FIGURE.finditer(text)] == []


def test_readme_keeps_the_two_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in readme
    assert (
        "python3 -m pip install torch==2.13.0 && python3 -m pip install -e '.[all]' && forensics audit --demo" in readme
    )


@pytest.mark.parametrize(
    "name", ["README.md", "CHANGELOG.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
)
def test_pages_name_only_files_the_repository_holds(name: str):
    text = (ROOT / name).read_text()
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target or target.startswith("#"):
            continue
        path = (ROOT / name).parent / target.split("#")[0]
        if not path.exists():
            missing.append(target)
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.rstrip(",.:;")
        if REPO_PATH.match(token) and not token.startswith("bench/out/") and not any(ROOT.glob(token)):
            missing.append(token)
    assert missing == []


def _shell_blocks(markdown: str) -> list[str]:
    """The ```bash blocks that do not install anything."""
    blocks = re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)
    return [b for b in blocks if "pip install" not in b]


@pytest.mark.slow
def test_getting_started_runs_as_written(tmp_path: Path):
    """Every non-installing shell block of Getting started, in order, in a fresh folder, with ``forensics`` being
    this checkout's command."""
    blocks = _shell_blocks((ROOT / "docs" / "getting-started.md").read_text())
    blocks += _shell_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 3
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "forensics"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m forensics "$@"\n')
    shim.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    for block in blocks:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{block}\n{done.stderr[-3000:]}"
    assert (work / "demo" / "static" / "findings.json").is_file()
    assert (work / "demo" / "static" / "report.html").is_file()
