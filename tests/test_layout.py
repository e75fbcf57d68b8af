"""The house rules of docs/architecture.md, read from the source: no import cycle anywhere (lazy imports count), the
detect stage reads tables and never the report or tagging code, no product stage imports the means to judge itself
(datasets/, evaluation/), and the CLI stays thin (no Parquet writes, no contract JSON, no range checks)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "forensics"
PRODUCT_STAGES = ("sources", "plan", "tagging", "detect", "replay", "report", "schema", "integrations")


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        rel = f.relative_to(PACKAGE.parent).with_suffix("")
        out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = f
    return out


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every forensics module ``name`` imports, at the top or inside functions (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    skip = {
        id(x)
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
        for x in ast.walk(n)
        if x is not n.test
    }
    out: set[str] = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            for a in n.names:
                parts = a.name.split(".")
                out.update(".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in mods)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for a in n.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
        elif isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "import_module":
            if n.args and isinstance(n.args[0], ast.Constant) and str(n.args[0].value) in mods:
                out.add(str(n.args[0].value))
    out.discard(name)
    return {m for m in out if m in mods}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, f, mods) for m, f in mods.items()}


def test_no_import_cycle_anywhere_lazy_imports_included():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_detect_reads_tables_not_the_report_or_tagging():
    bad = {
        (m, i)
        for m, deps in _graph().items()
        if _stage(m) == "detect"
        for i in deps
        if _stage(i) in ("report", "tagging")
    }
    assert bad == set()


def test_no_product_stage_imports_the_means_to_judge_itself():
    bad = {
        (m, i)
        for m, deps in _graph().items()
        if _stage(m) in PRODUCT_STAGES
        for i in deps
        if _stage(i) in ("datasets", "evaluation")
    }
    assert bad == set()


def test_the_cli_only_parses_calls_and_renders():
    """No Parquet writes, no contract JSON built, no range checks of parameters in cli/."""
    for f in (PACKAGE / "cli").glob("*.py"):
        text = f.read_text()
        assert "pyarrow" not in text and "to_parquet" not in text, f.name
        assert not re.search(r'\["(compared|settings|pair_retention|spikes)"\]\s*=', text), f.name
        assert not re.search(r"if [^\n]*(< 1|<= 0|> 1\b|< 0\b)[^\n]*:\n\s*raise", text), f.name


def test_a_command_imports_only_its_own_module():
    """``forensics ingest`` pays for no other command's imports (the plan stage, tagging, the demo simulator);
    ``--help`` still lists every command."""
    import subprocess
    import sys

    code = (
        "import sys; from forensics.cli import build_parser; p = build_parser('ingest'); "
        "print(sorted(m for m in sys.modules if m.startswith(('forensics.', 'sklearn', 'scipy', 'plotly'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    ).stdout
    assert "forensics.cli.ingest" in out
    for other in (
        "forensics.plan",
        "forensics.tagging",
        "forensics.datasets",
        "forensics.cli.audit",
        "sklearn",
        "scipy",
        "plotly",
    ):
        assert f"'{other}" not in out, other
    from forensics.cli import build_parser

    help_text = build_parser().format_help()
    assert all(name in help_text for name in ("audit", "ingest", "check-plan", "demo", "validate"))


def test_the_top_level_holds_only_what_every_stage_imports():
    """Everything else lives in a package whose name says its job (compiled/, pipeline/, stats/, ...)."""
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= 4, top
    assert top == ["_threads.py", "cache.py", "errors.py"]


def test_the_robust_sd_constant_is_read_through_its_helper():
    """``stats.robust_sd`` (and ``stats.grouped_robust_sd``, the same formula per group) is the one formula; the
    compiled spike kernel alone multiplies by the constant itself (a compiled loop cannot call a Python helper)."""
    allowed = {"stats/__init__.py", "detect/spikes/kernel.py"}
    users = set()
    for f in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            named = (isinstance(node, ast.Name) and node.id == "MAD_TO_SD") or (
                isinstance(node, ast.Constant) and node.value == 1.4826
            )
            if named:
                users.add(f.relative_to(PACKAGE).as_posix())
    assert "stats/__init__.py" in users  # the walk sees the constant where it is declared
    assert users <= allowed, users - allowed


def test_no_module_resolves_its_names_on_first_use():
    """Names are plain imports, visible to IDEs and type checkers: no module-level ``__getattr__``. A heavy optional
    dependency is imported inside the function that needs it instead (the spike package's is removed on its own)."""
    lazy = set()
    for f in PACKAGE.rglob("*.py"):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                lazy.add(f.relative_to(PACKAGE).as_posix())
    assert lazy <= {"detect/spikes/__init__.py"}, lazy


def test_the_packages_import_without_their_heavy_dependencies():
    """The report, compare, replay and W&B packages and the torch integration import without plotly, torch, wandb or
    streamlit (their functions import them when they draw, replay, read the API or build a sampler), and the
    recorder a training script imports loads neither pandas nor the gate."""
    import json
    import subprocess
    import sys

    heavy = ("plotly", "torch", "wandb", "streamlit", "pandas", "forensics.plan.gate")
    code = (
        "import importlib, json, sys; importlib.import_module(sys.argv[1]); "
        f"print(json.dumps(sorted(h for h in {heavy!r} if h in sys.modules)))"
    )

    def loaded(module: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", code, module], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
        )
        return json.loads(done.stdout.strip())

    assert loaded("forensics.integrations.torch") == []
    assert loaded("forensics.plan.recorder") == []
    for package in ("forensics.report", "forensics.compare", "forensics.replay", "forensics.sources.wandb"):
        assert loaded(package) == ["pandas"], package


def test_the_gate_is_called_from_the_plan_package_as_documented_without_loading_it_on_import():
    """``from forensics.plan import assert_batches_vary`` (the CI use), while a training script that imports the
    recorder through the package loads neither the gate nor pandas."""
    code = (
        "import sys\n"
        "import forensics.plan.recorder\n"
        "assert 'pandas' not in sys.modules and 'forensics.plan.gate' not in sys.modules\n"
        "from forensics.plan import assert_batches_vary, check_plan\n"
        "import pandas as pd\n"
        "plan = pd.DataFrame({'epoch': [0] * 4 + [1] * 4, 'batch_id': [0, 0, 1, 1, 1, 1, 0, 0],\n"
        "                     'sample_id': [0, 1, 2, 3, 2, 3, 0, 1]})\n"
        "r = check_plan(plan=plan)\n"
        "assert r.static, r.to_json()\n"
        "try:\n"
        "    assert_batches_vary(plan)\n"
        "except AssertionError:\n"
        "    print('failed as it should')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "failed as it should"
