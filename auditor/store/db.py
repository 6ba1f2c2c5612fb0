"""Engine and session helpers, database URL resolution and programmatic Alembic migrations.

Where the database lives (first match wins):

1. an explicit URL (``--db URL`` on the command line, or the ``url`` argument);
2. the ``AUDITOR_DB_URL`` environment variable (any SQLAlchemy URL, e.g.
   ``postgresql+psycopg://user@host:5432/dbname``);
3. ``sqlite:///$SPEC_AUDITOR_HOME/auditor.db`` when ``SPEC_AUDITOR_HOME`` is set;
4. ``sqlite:///<platformdirs user data dir of "spec-auditor">/auditor.db``.

SQLite connections get ``PRAGMA journal_mode=WAL`` (readers such as the dashboard never block the
writer), ``foreign_keys=ON``, ``synchronous=NORMAL`` (a killed process loses nothing that was
committed; only an OS crash may lose the last transactions) and a 30 s ``busy_timeout``.

Migrations ship inside the package (``auditor/store/migrations``), so ``auditor db upgrade`` and
:func:`open_store` work from a source checkout and from an installed wheel alike; the top-level
``alembic.ini`` points the ``alembic`` command at the same directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

ENV_DB_URL = "AUDITOR_DB_URL"
ENV_HOME = "SPEC_AUDITOR_HOME"
#: Directory holding Alembic's env.py, script.py.mako and versions/ (inside the package).
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


class StoreError(RuntimeError):
    """The database cannot be opened or migrated (message names the URL and the fix)."""


def default_db_path() -> Path:
    """Path of the default SQLite file (see module docstring); the directory is not created."""
    home = os.environ.get(ENV_HOME)
    if home:
        return Path(home).expanduser() / "auditor.db"
    import platformdirs

    return Path(platformdirs.user_data_dir("spec-auditor", appauthor=False)) / "auditor.db"


def resolve_db_url(url: str | None = None) -> str:
    """Return the database URL to use: ``url``, else ``$AUDITOR_DB_URL``, else the default SQLite file.

    A bare filesystem path (no ``://``) is accepted and turned into a ``sqlite:///`` URL.
    """
    chosen = url or os.environ.get(ENV_DB_URL)
    if not chosen:
        return f"sqlite:///{default_db_path()}"
    if "://" not in chosen:
        return f"sqlite:///{Path(chosen).expanduser().resolve()}"
    return chosen


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to print or log)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def _is_memory_sqlite(url: str) -> bool:
    u = make_url(url)
    return u.get_backend_name() == "sqlite" and (u.database in (None, "", ":memory:"))


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
    finally:
        cur.close()


def make_engine(url: str | None = None, *, echo: bool = False) -> Engine:
    """Create an :class:`~sqlalchemy.Engine` for ``url`` (resolved by :func:`resolve_db_url`).

    For a file-backed SQLite URL the parent directory is created. In-memory SQLite
    (``sqlite://``) uses one shared connection (``StaticPool``) so every session sees the same
    database.

    Raises:
        StoreError: the URL cannot be parsed or its driver is not installed.
    """
    url = resolve_db_url(url)
    try:
        u = make_url(url)
    except Exception as exc:
        raise StoreError(
            f"invalid database URL {url!r} (from --db or ${ENV_DB_URL}): {exc}. "
            "Use a SQLAlchemy URL such as sqlite:///path/auditor.db or "
            "postgresql+psycopg://user@host:5432/dbname."
        ) from exc
    kwargs: dict[str, Any] = {"echo": echo, "future": True}
    if u.get_backend_name() == "sqlite":
        if _is_memory_sqlite(url):
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            assert u.database is not None  # a URL without a database is in-memory (above)
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            kwargs.update(connect_args={"check_same_thread": False, "timeout": 30})
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(u, **kwargs)
    except Exception as exc:  # missing DBAPI driver etc.
        raise StoreError(
            f"cannot use the database URL {redact_url(url)} (from --db or ${ENV_DB_URL}): {exc}. "
            "Fix: use a SQLAlchemy URL with an installed driver, e.g. sqlite:///path/auditor.db or "
            "postgresql+psycopg://user@host:5432/dbname."
        ) from exc
    if u.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
    return engine


# ---------------------------------------------------------------------------------------------
# Alembic, driven programmatically (no alembic.ini needed at run time)
# ---------------------------------------------------------------------------------------------


def alembic_config(engine: Engine | None = None) -> Any:
    """An :class:`alembic.config.Config` pointing at the packaged migrations.

    When ``engine`` is given, ``env.py`` uses it (``config.attributes["engine"]``) instead of
    building one from a URL, so URLs with ``%`` characters need no escaping.
    """
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str | None:
    """The newest migration revision id shipped with the package."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database at ``engine`` is at (None for an empty database)."""
    from alembic.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run migrations up to ``revision`` (default ``head``).

    Raises:
        StoreError: a migration failed (the message names the URL).
    """
    from alembic import command

    try:
        command.upgrade(alembic_config(engine), revision)
    except Exception as exc:
        raise StoreError(
            f"migrating {engine.url.render_as_string(hide_password=True)} to {revision} failed: {exc}"
        ) from exc


def downgrade(engine: Engine, revision: str = "-1") -> None:
    """Undo migrations down to ``revision`` (``base`` drops every table; ``-1`` one step)."""
    from alembic import command

    command.downgrade(alembic_config(engine), revision)


def ensure_schema(engine: Engine) -> None:
    """Upgrade to head unless the database is already there (cheap check first).

    Two processes upgrading the same fresh SQLite file at once may race; the loser's error is
    ignored when the database ends up at head anyway.
    """
    head = head_revision()
    if current_revision(engine) == head:
        return
    try:
        upgrade(engine, "head")
    except StoreError:
        if current_revision(engine) != head:
            raise


# ---------------------------------------------------------------------------------------------
# Store handle
# ---------------------------------------------------------------------------------------------


@dataclass
class Store:
    """An open audit database: engine + session factory.

    Use ``with store.session() as s: ...`` for a unit of work (commit on success, rollback on
    error). Query functions in :mod:`auditor.store.queries` take that ``Session``.
    """

    engine: Engine
    url: str
    _factory: sessionmaker[Session] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._factory = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in a transaction: committed when the block exits normally, else rolled back."""
        with self._factory() as s, s.begin():
            yield s

    def new_session(self) -> Session:
        """A bare session (caller manages ``commit``/``close``); prefer :meth:`session`."""
        return self._factory()

    @property
    def display_url(self) -> str:
        """The URL with the password hidden."""
        return redact_url(self.url)

    def close(self) -> None:
        """Dispose of the engine's connection pool."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(url: str | None = None, *, upgrade: bool = True, echo: bool = False) -> Store:
    """Open the audit database at ``url`` (see :func:`resolve_db_url`), migrating it to head.

    Every command that touches the database opens it through here, so a new install or an
    upgrade of spec-auditor needs no separate ``auditor db upgrade`` step.

    Raises:
        StoreError: the URL is invalid, the server unreachable, or a migration failed.
    """
    resolved = resolve_db_url(url)
    engine = make_engine(resolved, echo=echo)
    if upgrade:
        try:
            ensure_schema(engine)
        except StoreError:
            engine.dispose()
            raise
        except Exception as exc:
            engine.dispose()
            raise StoreError(
                f"cannot open the audit database {redact_url(resolved)}: {exc}. "
                f"Check --db / ${ENV_DB_URL} and that the server is running."
            ) from exc
    return Store(engine=engine, url=resolved)
