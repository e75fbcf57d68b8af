"""The documentation's generated parts: the findings reference from the kinds registry, the CLI reference from the
parsers. Commands and finding kinds change often; typed by hand, their lists would drift from the code.

Used as an mkdocs hook (mkdocs.yml ``hooks``): a page holding a marker gets it replaced at build time:

- ``<!-- forensics:findings -->``: every registered finding kind (:mod:`forensics.detect.kinds`);
- ``<!-- forensics:cli -->``: every command of ``forensics`` with its options (:func:`forensics.cli.build_parser`);
- ``<!-- forensics:cli NAME -->``: one command's options (its page under ``commands/``);
- ``<!-- forensics:commands -->``: one line per command, linked to its page.

``python3 docs/gen_reference.py findings|cli`` prints a part, to read it without building the site.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))  # this checkout's package, not another one installed in the environment

MARKER = re.compile(r"<!-- forensics:(findings|cli|commands)(?: ([\w-]+))? -->")


def _md(text: str) -> str:
    """Help text as Markdown: no raw HTML, no table breaks."""
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def findings_reference() -> str:
    """Every registered kind, in registration order: a table of names, then one entry each."""
    import forensics.detect.rules  # noqa: F401  (a rule module may register kinds of its own)
    from forensics.detect.kinds import KINDS

    lines = ["| kind | title | findings.json section | `--fail-on` |", "| --- | --- | --- | --- |"]
    for k in KINDS.values():
        section = f"`{k.section}`" + (" (one object)" if k.object_section else "") if k.section else "`findings` only"
        lines.append(
            f"| [`{k.kind}`](#{k.kind.replace('_', '-')}) | {_md(k.title)} | {section} | "
            f"{f'`{k.fail_on}`' if k.fail_on else '-'} |"
        )
    lines.append("")
    for k in KINDS.values():
        lines += [f"## `{k.kind}` {{#{k.kind.replace('_', '-')}}}", "", f"**{_md(k.title)}**.", ""]
        lines.append(f"- **Triggers**: {k.triggers or 'not described yet.'}")
        lines.append(f"- **`details`**: {k.details or 'nothing beyond the common fields.'}")
        lines.append(
            "- **`--fail-on`**: " + (f"`{k.fail_on}` (its critical findings count)" if k.fail_on else "not a gate.")
        )
        if k.told_by:
            lines.append(f"- **Told by**: the `{k.told_by}` section's card and lines.")
        if k.false_positives:
            lines.append(f"- **Known false positives**: {k.false_positives}")
        lines.append("")
    return "\n".join(lines)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """``{name: (parser, one-line help)}`` in the order ``forensics --help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (p, helps.get(name, "")) for name, p in action.choices.items()}
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    out = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + formatter._format_args(action, action.dest.upper())
            name = ", ".join(f"`{o}{metavar}`" for o in action.option_strings)
        else:
            name = f"`{formatter._format_args(action, action.dest)}`"
        text = formatter._expand_help(action) if action.help else ""
        out.append(f"- {name}: {_md(' '.join(text.split()))}")
    return out


def command_reference(name: str, parser: argparse.ArgumentParser, level: int = 2) -> str:
    """One command: its description, usage and options."""
    usage = " ".join(parser.format_usage().split())
    usage = usage[len("usage: ") :] if usage.startswith("usage: ") else usage
    lines = [f"{'#' * level} `forensics {name}` {{#{name}}}", ""]
    if parser.description:
        lines += [_md(" ".join(parser.description.split())), ""]
    lines += ["```", usage, "```", ""] + _options(parser) + [""]
    if parser.epilog:
        lines += ["```", parser.epilog.strip("\n"), "```", ""]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    from forensics.cli import build_parser

    return build_parser()


def cli_reference() -> str:
    """Every command of ``forensics``."""
    commands = _subcommands(_parser())
    return "\n".join(command_reference(name, p) for name, (p, _) in commands.items())


def commands_list(page_dir: Path | None = None) -> str:
    """One line per command: its name (linked to its page when it has one) and its one-line help."""
    lines = []
    for name, (_, text) in _subcommands(_parser()).items():
        has_page = page_dir is not None and (page_dir / f"{name}.md").is_file()
        label = f"[`forensics {name}`]({name}.md)" if has_page else f"`forensics {name}`"
        lines.append(f"- {label}: {_md(text)}")
    return "\n".join(lines)


def render(markdown: str, page_dir: Path | None = None) -> str:
    """``markdown`` with every marker replaced by its generated part."""

    def part(m: re.Match) -> str:
        what, arg = m.group(1), m.group(2)
        if what == "findings":
            return findings_reference()
        if what == "commands":
            return commands_list(page_dir)
        if arg is None:
            return cli_reference()
        commands = _subcommands(_parser())
        if arg not in commands:
            raise ValueError(f"no command {arg!r} for the marker {m.group(0)}")
        return command_reference(arg, commands[arg][0], level=2)

    return MARKER.sub(part, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 (mkdocs' hook signature)
    """mkdocs hook: fill the markers of a page."""
    return render(markdown, Path(page.file.abs_src_path).parent)


if __name__ == "__main__":
    print({"findings": findings_reference, "cli": cli_reference}[sys.argv[1] if len(sys.argv) > 1 else "cli"]())
