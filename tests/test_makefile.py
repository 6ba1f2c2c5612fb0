"""The Makefile's install stamp: ``make test`` / ``make demo`` / ``make bench`` install first in a fresh clone
(CI's ``.ci/run`` runs the README's ``make test`` on one) but not again once ``make install`` has run for
this Python, until pyproject.toml or the Makefile change; ``make install`` always installs. Checked with
``make -n`` (prints the recipes, runs nothing) on a copy of the Makefile."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="no `make` on PATH")

PIP = "-m pip install"
#: The suite's run in ``make test``: two pytest-xdist workers, each file whole in one of them.
PYTEST_RUN = "-m pytest -n 2 --dist loadfile tests"


# What a parent make exports to its recipes: under CI's ``make test`` these reach the ``make -n`` below, which
# then runs as a sub-make ("make[1]: Entering directory ..." lines around the plan, the parent's variables);
# and the Makefile's own variables, which a ``make test PY=... INSTALL_STAMP=...`` puts in the environment
# (GNU make exports command-line variables) where the Makefile's ``?=`` would take them.
_PARENT_MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MAKE_TERMOUT", "MAKE_TERMERR",
                    "PY", "PIP", "INSTALL_STAMP", "TEST_WORKERS")


def _plan(cwd: Path, target: str, **var: str) -> list[str]:
    """The commands ``make TARGET`` would run (``make -n``), with ``PY`` this interpreter; the same whether
    pytest runs alone or inside ``make test`` (the parent make's environment is dropped)."""
    args = [str(MAKE), "-n", "--no-print-directory", target, f"PY={sys.executable}",
            *(f"{k}={v}" for k, v in var.items())]
    env = {k: v for k, v in os.environ.items() if k not in _PARENT_MAKE_ENV}
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.splitlines()


def _touch(path: Path, t: float) -> None:
    path.touch()
    os.utime(path, (t, t))


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A copy of the Makefile and pyproject.toml (the stamp's prerequisites), dated an hour ago."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
        _touch(tmp_path / name, os.stat(ROOT / name).st_mtime - 3600)
    return tmp_path


def test_fresh_clone_installs_before_the_tests(clone: Path) -> None:
    plan = _plan(clone, "test", INSTALL_STAMP="stamp")
    first_pip = next(i for i, c in enumerate(plan) if PIP in c)
    assert first_pip < next(i for i, c in enumerate(plan) if "-m ruff check" in c)
    assert any("touch stamp" in c for c in plan) and plan[-1].endswith(PYTEST_RUN)


@pytest.mark.parametrize("target, runs", [("test", PYTEST_RUN), ("demo", "-m auditor demo"),
                                          ("bench", "benchmarks/spec_decode.py")])
def test_installed_stamp_skips_the_install(clone: Path, target: str, runs: str) -> None:
    stamp = clone / "stamp"
    _touch(stamp, os.stat(clone / "Makefile").st_mtime + 60)
    plan = _plan(clone, target, INSTALL_STAMP="stamp")
    assert not any(PIP in c for c in plan) and plan[-1].endswith(runs), plan
    # `make install` still installs (and renews the stamp)
    assert any(PIP in c for c in _plan(clone, "install", INSTALL_STAMP="stamp"))
    # a changed pyproject.toml (new dependency) or Makefile (new pins) installs again
    for changed in ("pyproject.toml", "Makefile"):
        _touch(clone / changed, os.stat(stamp).st_mtime + 60)
        assert any(PIP in c for c in _plan(clone, target, INSTALL_STAMP="stamp")), changed
        _touch(stamp, os.stat(clone / changed).st_mtime + 60)


def test_default_stamp_is_per_environment_and_git_ignored(clone: Path) -> None:
    """Without INSTALL_STAMP the stamp is ``.make/installed-<hash of sys.prefix>``: another venv has its
    own, and the repository ignores it."""
    stamps = {m.group(1) for c in _plan(clone, "install") if (m := re.search(r"touch (\S+)", c))}
    assert len(stamps) == 1
    stamp = stamps.pop()
    assert re.fullmatch(r"\.make/installed-[0-9a-f]{12}", stamp), stamp
    if (ROOT / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", stamp], cwd=ROOT, timeout=60)
        assert ignored.returncode == 0, f"{stamp} is not git-ignored"


def test_ci_runs_the_readme_test_command() -> None:
    """CI (``.ci/run``, a clean clone) runs ``make test``, the README's test command."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "```\nmake test\n```" in readme
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert "make test" in ci


def test_test_workers_can_be_set(clone: Path) -> None:
    """``make test TEST_WORKERS=N`` runs N workers; 0 is one process (pytest-xdist's own meaning of ``-n 0``)."""
    stamp = clone / "stamp"
    _touch(stamp, os.stat(clone / "Makefile").st_mtime + 60)
    assert _plan(clone, "test", INSTALL_STAMP="stamp", TEST_WORKERS="0")[-1].endswith("-m pytest -n 0 --dist loadfile tests")
