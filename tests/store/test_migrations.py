"""Migrations: upgrade from empty and downgrade to base on SQLite and PostgreSQL; the models
match the migrations (Alembic autogenerate finds no difference)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from auditor.store import db as sdb
from auditor.store.models import metadata

REPO = Path(__file__).resolve().parents[2]
EXPECTED_TABLES = {
    "providers",
    "audit_runs",
    "probes",
    "probe_attempts",
    "normalized_tokens",
    "reference_cache",
    "detector_results",
    "verdicts",
    "schedules",
    "alerts",
    "calibration_results",
}


def _diff(engine: sa.Engine) -> list:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return compare_metadata(ctx, metadata)


def _tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}


def _roundtrip(url: str) -> None:
    engine = sdb.make_engine(url)
    try:
        assert sdb.current_revision(engine) is None
        assert _tables(engine) == set()
        sdb.upgrade(engine, "head")
        assert sdb.current_revision(engine) == sdb.head_revision()
        assert _tables(engine) == EXPECTED_TABLES == set(metadata.tables)
        assert _diff(engine) == []
        # the schema really works: insert a run and a probe, the unique key holds
        with engine.begin() as c:
            c.execute(
                sa.text(
                    "INSERT INTO audit_runs (id, provider_name, kind, config_snapshot, status, prompt_tokens, "
                    "completion_tokens, cost_usd, started_at, summary) VALUES ('r1','p','probe','{}','running',0,0,0,"
                    "CURRENT_TIMESTAMP,'{}')"
                )
            )
            c.execute(
                sa.text(
                    "INSERT INTO probes (run_id, probe_key, request_json, status, n_attempts, anomalies, created_at) "
                    "VALUES ('r1','a#0','{}','pending',0,'[]',CURRENT_TIMESTAMP)"
                )
            )
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as c:
            c.execute(
                sa.text(
                    "INSERT INTO probes (run_id, probe_key, request_json, status, n_attempts, anomalies, created_at) "
                    "VALUES ('r1','a#0','{}','pending',0,'[]',CURRENT_TIMESTAMP)"
                )
            )
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as c:  # foreign keys are enforced
            c.execute(
                sa.text(
                    "INSERT INTO probes (run_id, probe_key, request_json, status, n_attempts, anomalies, created_at) "
                    "VALUES ('nope','a#0','{}','pending',0,'[]',CURRENT_TIMESTAMP)"
                )
            )
        sdb.downgrade(engine, "base")
        assert sdb.current_revision(engine) is None
        assert _tables(engine) == set()
        sdb.upgrade(engine, "head")  # and back up again from base
        assert _diff(engine) == []
    finally:
        engine.dispose()


def test_sqlite_upgrade_downgrade_and_no_drift(sqlite_url):
    _roundtrip(sqlite_url)


@pytest.mark.postgres
def test_postgres_upgrade_downgrade_and_no_drift(pg_url):
    _roundtrip(pg_url)


def test_sqlite_pragmas(sqlite_url):
    engine = sdb.make_engine(sqlite_url)
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar().lower() == "wal"
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


def test_single_head_and_every_revision_has_downgrade():
    script = ScriptDirectory.from_config(sdb.alembic_config())
    assert len(script.get_heads()) == 1
    for rev in script.walk_revisions():
        assert callable(getattr(rev.module, "downgrade", None))


def test_open_store_upgrades_and_url_resolution(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'sub' / 'a.db'}"
    monkeypatch.setenv(sdb.ENV_DB_URL, url)
    assert sdb.resolve_db_url(None) == url
    assert sdb.resolve_db_url("sqlite:///x.db") == "sqlite:///x.db"
    assert sdb.resolve_db_url(str(tmp_path / "b.db")) == f"sqlite:///{tmp_path / 'b.db'}"
    store = sdb.open_store()  # from the env var; creates the directory and migrates
    assert store.url == url
    assert sdb.current_revision(store.engine) == sdb.head_revision()
    store.close()
    monkeypatch.delenv(sdb.ENV_DB_URL)
    monkeypatch.setenv("SPEC_AUDITOR_HOME", str(tmp_path / "home"))
    assert sdb.resolve_db_url(None) == f"sqlite:///{tmp_path / 'home' / 'auditor.db'}"


def test_open_store_in_memory():
    store = sdb.open_store("sqlite://")
    with store.session() as s:
        assert s.execute(sa.text("select count(*) from audit_runs")).scalar() == 0
    store.close()


def test_open_store_bad_url_is_a_clear_error():
    with pytest.raises(sdb.StoreError, match="database URL"):
        sdb.open_store("notadialect+nodriver://x")


def test_cli_db_commands(tmp_path):
    from typer.testing import CliRunner

    from auditor.cli import app

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    r = CliRunner()
    res = r.invoke(app, ["db", "current", "--db", url])
    assert res.exit_code == 0, res.output
    assert "current: base" in res.output
    res = r.invoke(app, ["db", "upgrade", "--db", url])
    assert res.exit_code == 0, res.output
    assert f"base -> {sdb.head_revision()}" in res.output
    res = r.invoke(app, ["db", "current", "--db", url])
    assert "up to date" in res.output
    res = r.invoke(app, ["db", "downgrade", "base", "--yes", "--db", url])
    assert res.exit_code == 0, res.output
    assert f"{sdb.head_revision()} -> base" in res.output
    res = r.invoke(app, ["db", "current", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/x"])
    assert res.exit_code == 3


def test_repo_alembic_ini_points_at_packaged_migrations(tmp_path, monkeypatch):
    """`alembic upgrade head` from the repository root uses the same migrations."""
    from alembic.config import Config

    from alembic import command

    ini = REPO / "alembic.ini"
    assert ini.is_file()
    url = f"sqlite:///{tmp_path / 'ini.db'}"
    monkeypatch.setenv(sdb.ENV_DB_URL, url)
    cfg = Config(str(ini))
    cfg.attributes["configure_logger"] = False
    command.upgrade(cfg, "head")
    engine = sdb.make_engine(url)
    assert sdb.current_revision(engine) == sdb.head_revision()
    assert _diff(engine) == []
    engine.dispose()
