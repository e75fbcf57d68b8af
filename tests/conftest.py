"""Shared fixtures: the demo case folders (built once per session at small scale) and paths to real logs."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def main_module_kept():
    """Streamlit's script runner (AppTest) installs the app as ``__main__`` and leaves it there; a later test that
    spawns processes would then re-run the dashboard in each child. Every test gets back the ``__main__`` it had."""
    import sys

    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory):
    """The user cache (fitted clusters, the dashboard's demo) in a folder of this session, never the user's own."""
    import os

    from forensics.cache import CACHE_ENV

    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("user-cache"))
    yield Path(os.environ[CACHE_ENV])
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the folder holding ``pyproject.toml``)."""
    return Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def real_logs_dir(repo_root: Path) -> Path:
    """The real public training logs committed under fixtures/real-logs (source and licence in its README)."""
    return repo_root / "fixtures" / "real-logs"


@pytest.fixture(scope="module")
def dask_client():
    """One real distributed LocalCluster of 2 workers (threads, in this process) for the module's Dask runs."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="session")
def demo_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the demo's ``static/`` and ``bucketed/`` case folders at ``--scale small`` (seed 0).

    Built once per test session by the real builder; treat it as read-only (copy it before changing anything).
    """
    from forensics.datasets import build_demo

    out = tmp_path_factory.mktemp("demo-small")
    build_demo(out, scale="small", seed=0)
    return out


@pytest.fixture(scope="session")
def runs():
    """Real Hugging Face Trainer runs (tiny random GPT-2 on CPU, fixtures/hf_runs.py), built once per session."""
    pytest.importorskip("transformers")
    from fixtures.hf_runs import hf_runs

    return hf_runs()


@pytest.fixture(scope="session")
def hf_cases():
    """``{name: HFCase}`` of the real Trainer cases with known causes (fixtures/hf_cases.py): each is built on first
    access, or read from the content-keyed cache (``$FORENSICS_FIXTURE_CACHE``); read-only, copy before writing."""
    pytest.importorskip("transformers")
    from fixtures.hf_cases import LazyCases

    return LazyCases()


@pytest.fixture(scope="session")
def wandb_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real W&B offline runs written once per session by ``tests/wandb_writers.py``'s ``WRITER``: ``nested/``,
    ``multi/`` (other1, resumed1 twice) and ``logged.json`` (what was logged)."""
    import subprocess
    import sys

    pytest.importorskip("wandb")
    from tests.wandb_writers import WRITER, isolated_env

    out = tmp_path_factory.mktemp("wandb-runs")
    script = out / "writer.py"
    script.write_text(WRITER)
    subprocess.run(
        [sys.executable, str(script), str(out)], env=isolated_env(out), check=True, timeout=120, capture_output=True
    )
    return out


@pytest.fixture(scope="session")
def hf_family():
    """``{member name: HFCase}`` of the family of small real Trainer runs whose loss moves with their batches'
    content (fixtures/hf_family.py: three content types, three samplers, clean and corrupted twins), each built on
    first access or read from the content-keyed cache; read-only."""
    pytest.importorskip("transformers")
    from fixtures.hf_family import family_member, members

    built: dict = {}

    def member(name: str):
        if name not in built:
            built[name] = family_member(next(m for m in members() if m.name == name))
        return built[name]

    return member
