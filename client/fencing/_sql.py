"""SQL guard over a DB-API connection: SQLite (``sqlite3``) and PostgreSQL (psycopg 3).

The token lives in a column of the guarded row (``fencing_token BIGINT``,
NULL = no token yet). Each write is ONE statement whose WHERE clause is the
fencing check; nothing is read before it. For a table ``invoices`` keyed by
``id`` with columns ``status`` and ``total`` (``?`` for sqlite3, ``%s`` for
psycopg)::

    -- SqlGuard.update(): the row must exist
    UPDATE "invoices" SET "status" = ?, "total" = ?, "fencing_token" = ?
     WHERE "id" = ? AND ("fencing_token" IS NULL OR "fencing_token" <= ?)

    -- SqlGuard.upsert(): insert the row, or update it under the same check
    INSERT INTO "invoices" ("id", "status", "total", "fencing_token") VALUES (?, ?, ?, ?)
    ON CONFLICT ("id") DO UPDATE SET "status" = excluded."status", "total" = excluded."total",
                                     "fencing_token" = excluded."fencing_token"
     WHERE "invoices"."fencing_token" IS NULL OR "invoices"."fencing_token" <= excluded."fencing_token"

Here ``"fencing_token" <= ?`` is shortened: in full it is ``(<is a token> AND
"fencing_token" <= ?)``, where <is a token> (:data:`IS_TOKEN`) is
``typeof("fencing_token") = 'integer' AND "fencing_token" >= 0`` in SQLite and
``pg_typeof("fencing_token") IN ('bigint'::regtype, ...) AND "fencing_token" >= 0``
in PostgreSQL: a stored REAL, TEXT or BLOB, a NUMERIC column's value or a
negative one refuses the write, and the read after the refusal raises
:class:`~fencepost.client.fencing.MalformedTokenError`.

The statement's row count decides (1 = accepted, 0 = refused or, for
``update``, no such row). Only after a refusal does the guard read the row's
token, to tell "stale" from "missing" and to fill the error; that read decides
nothing. SQLite needs 3.24 or later for the upsert; PostgreSQL needs a unique
index or primary key on the key column.

Existing tables get the column with :func:`add_token_column`, i.e.
``ALTER TABLE "invoices" ADD COLUMN "fencing_token" BIGINT``; rows keep NULL
until their first guarded write.

Transactions: the guard runs its statement on the caller's connection, in the
caller's transaction, and does not commit unless made with ``commit=True``
(then it commits after every write, accepted or refused; a refused write
changed nothing). Without ``commit=True`` a refused write leaves the
transaction open and usable, neither committed nor rolled back (note that
PostgreSQL keeps the conflicting row locked by a refused upsert until then). In
PostgreSQL an accepted UPDATE holds the row lock until that transaction ends,
so a concurrent writer waits and then re-checks the committed token. Names
are validated, then double-quoted: in PostgreSQL they are case-sensitive.

The guard owns two columns: it writes the token column itself, and the key
column picks the row. ``values`` naming either (compared case-insensitively)
raises :class:`~fencepost.client.InvalidArgument` (field ``values``) before
any statement: a caller's ``fencing_token`` would replace the fencing token,
and a new ``id`` would move the record to another key.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgument, MissingRecordError
from ._ahead import TokenHold
from ._guard import (TOKEN_FIELD, FencingGuard, RejectHook, check_identifier, check_text, check_token, stored_token,
                     writer_token)

_PLACEHOLDERS = {"qmark": "?", "format": "%s", "pyformat": "%s"}

#: The driver modules of MySQL and MariaDB connections (their statements are MySqlGuard's).
MYSQL_DRIVERS = frozenset({"pymysql", "MySQLdb", "mysql", "mariadb"})


#: Per dialect, the SQL test that a stored token (``{tok}``) is a token: a non-negative value of an integer
#: type (SQLite: storage class INTEGER; PostgreSQL: an integer column). MySQL has no per-value type: its
#: text form must be canonical digits (a DOUBLE column's 7 passes, its 7.5 does not). '': other drivers.
IS_TOKEN = {
    "sqlite": "typeof({tok}) = 'integer' AND {tok} >= 0",
    "postgresql": "pg_typeof({tok}) IN ('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype) AND {tok} >= 0",
    "mysql": "CAST({tok} AS CHAR) REGEXP '^(0|[1-9][0-9]*)$'",
    "": "{tok} >= 0",
}


def quoted(name: str, quote: str = '"') -> str:
    return f"{quote}{name}{quote}"


#: The ``storage`` metrics label of a DB-API driver's connections, by the driver's top module.
STORAGE_OF_DRIVER = {"sqlite3": "sqlite", "psycopg": "postgresql", "psycopg2": "postgresql", "pymysql": "mysql",
                     "MySQLdb": "mysql", "mysql": "mysql", "mariadb": "mysql"}


def storage_of(conn: Any) -> str:
    """The ``storage`` label of ``conn``'s guard: ``sqlite``, ``postgresql``, ``mysql``, or the driver's module."""
    module = type(conn).__module__.split(".")[0]
    return STORAGE_OF_DRIVER.get(module, module.lower())


def is_mysql(conn: Any) -> bool:
    """Whether ``conn`` comes from a MySQL/MariaDB driver (PyMySQL, mysqlclient, Connector/Python, mariadb)."""
    return type(conn).__module__.split(".")[0] in MYSQL_DRIVERS


def _paramstyle(conn: Any, paramstyle: str | None) -> str:
    if paramstyle is None:
        module = sys.modules.get(type(conn).__module__.split(".")[0])
        paramstyle = getattr(module, "paramstyle", None)
        if paramstyle is None:
            raise InvalidArgument(f"paramstyle: cannot tell the paramstyle of {type(conn).__name__}; pass it",
                                  field="paramstyle")
    if paramstyle not in _PLACEHOLDERS:
        raise InvalidArgument(f"paramstyle must be one of {sorted(_PLACEHOLDERS)}, got {paramstyle!r}",
                              field="paramstyle")
    return _PLACEHOLDERS[paramstyle]


def check_columns(table: str, key_column: str, token_column: str, columns: list[str]) -> None:
    """Check the names of a statement: identifiers, and no written column that the guard owns.

    The token column is written by the guard alone (a caller's value there
    would replace the fencing token), and the key column picks the row (a
    value there would move the record to another key). Names are compared
    case-insensitively, as SQLite does.

    Raises:
        InvalidArgument: a name is not an identifier (field: its argument), or
            ``columns`` names the key or the token column (field ``values``).
    """
    check_identifier(table, "table")
    check_identifier(key_column, "key_column")
    check_identifier(token_column, "token_column")
    if key_column.lower() == token_column.lower():
        raise InvalidArgument(f"token_column must not be the key column, got {token_column!r}",
                              field="token_column")
    for column in columns:
        check_identifier(column, "values")
        if column.lower() == token_column.lower():
            raise InvalidArgument(f"values must not set the token column {column!r}: the guard writes the "
                                  f"fencing token itself", field="values")
        if column.lower() == key_column.lower():
            raise InvalidArgument(f"values must not set the key column {column!r}: the key picks the row; "
                                  f"write the record under its new key instead", field="values")


def allows(tok: str, value: str, dialect: str) -> str:
    """The fencing condition: the stored token ``tok`` is NULL, or a token (:data:`IS_TOKEN`) <= ``value``."""
    return f"{tok} IS NULL OR ({IS_TOKEN.get(dialect, IS_TOKEN['']).format(tok=tok)} AND {tok} <= {value})"


def update_statement(table: str, key_column: str, columns: list[str], *,
                     token_column: str = TOKEN_FIELD, placeholder: str = "?", quote: str = '"',
                     dialect: str = "sqlite") -> str:
    """The conditional UPDATE for ``columns`` (parameters: values..., token, key, token).

    Args:
        quote: The identifier quote: ``"`` (SQL standard), or a backtick for MySQL.
        dialect: ``sqlite``, ``postgresql`` or ``mysql``: which test of :data:`IS_TOKEN`
            refuses a stored value that is not a token.

    Raises:
        InvalidArgument: a name is not an identifier, or ``columns`` names the
            key or the token column (field ``values``).
    """
    check_columns(table, key_column, token_column, columns)
    p = placeholder
    sets = "".join(f"{quoted(c, quote)} = {p}, " for c in columns)
    tok = quoted(token_column, quote)
    return (f"UPDATE {quoted(table, quote)} SET {sets}{tok} = {p} "
            f"WHERE {quoted(key_column, quote)} = {p} AND ({allows(tok, p, dialect)})")


def upsert_statement(table: str, key_column: str, columns: list[str], *,
                     token_column: str = TOKEN_FIELD, placeholder: str = "?", dialect: str = "sqlite") -> str:
    """The conditional upsert for ``columns`` (parameters: key, values..., token).

    Args:
        dialect: ``sqlite`` or ``postgresql`` (see :func:`update_statement`).

    Raises:
        InvalidArgument: a name is not an identifier, or ``columns`` names the
            key or the token column (field ``values``).
    """
    check_columns(table, key_column, token_column, columns)
    p = placeholder
    names = [key_column, *columns, token_column]
    tok = quoted(token_column)
    sets = ", ".join(f"{quoted(c)} = excluded.{quoted(c)}" for c in [*columns, token_column])
    return (f"INSERT INTO {quoted(table)} ({', '.join(quoted(n) for n in names)}) "
            f"VALUES ({', '.join(p for _ in names)}) "
            f"ON CONFLICT ({quoted(key_column)}) DO UPDATE SET {sets} "
            f"WHERE {allows(f'{quoted(table)}.{tok}', f'excluded.{tok}', dialect)}")


def add_token_column(conn: Any, table: str, *, token_column: str = TOKEN_FIELD,
                     commit: bool = False) -> None:
    """Add the token column to an existing table: ``ALTER TABLE t ADD COLUMN fencing_token BIGINT``.

    Existing rows get NULL (no token yet): their first guarded write is
    accepted whatever its token. On a MySQL/MariaDB connection the names are
    quoted with backticks (``ALTER TABLE `t` ADD COLUMN `fencing_token` BIGINT``;
    MySQL commits the DDL itself).

    Args:
        conn: A DB-API connection (sqlite3, psycopg, PyMySQL).
        table: The table name (an identifier).
        token_column: The column to add.
        commit: Commit the caller's transaction afterwards.

    Raises:
        InvalidArgument: ``table`` or ``token_column`` is not an identifier.
        The driver's error: the column exists already, or no such table.
    """
    check_identifier(table, "table")
    check_identifier(token_column, "token_column")
    quote = "`" if is_mysql(conn) else '"'
    cur = conn.cursor()
    try:
        cur.execute(f"ALTER TABLE {quoted(table, quote)} ADD COLUMN {quoted(token_column, quote)} BIGINT")
    finally:
        cur.close()
    if commit:
        conn.commit()


class SqlGuard(FencingGuard):
    """Fenced writes to the rows of one table, each one conditional statement.

    Args:
        conn: A DB-API 2 connection (``sqlite3.Connection``, ``psycopg.Connection``).
            Use it from one thread at a time, as the driver requires.
        table: The table name; must match ``^[A-Za-z_][A-Za-z0-9_]*$``.
        key_column: The key column (unique or primary key), same rule.
        token_column: The BIGINT token column, same rule.
        paramstyle: ``"qmark"`` (sqlite3) or ``"format"``/``"pyformat"``
            (psycopg); None reads the driver module's ``paramstyle``.
        commit: Commit after each write, accepted or refused (default: the caller commits).
        on_reject: Hook called with each StaleTokenError (see FencingGuard).
        metrics: A ``prometheus_client.CollectorRegistry`` to count writes in
            (see FencingGuard); ``storage`` is ``sqlite`` or ``postgresql``
            (another driver: its module's name).

    Raises:
        InvalidArgument: ``conn`` is not a connection, or is a MySQL/MariaDB
            one (use :class:`~fencepost.client.fencing.MySqlGuard`), a name is
            not an identifier, the token column is the key column, or the
            paramstyle is unknown.
    """

    #: Whether the guard speaks MySQL (MySqlGuard); SqlGuard refuses MySQL connections.
    mysql = False

    def __init__(self, conn: Any, table: str, key_column: str, *, token_column: str = TOKEN_FIELD,
                 paramstyle: str | None = None, commit: bool = False,
                 on_reject: RejectHook | None = None, metrics: Any = None) -> None:
        super().__init__(on_reject=on_reject, metrics=metrics, storage="mysql" if self.mysql else storage_of(conn))
        if not callable(getattr(conn, "cursor", None)):
            raise InvalidArgument(f"conn must be a DB-API connection (sqlite3, psycopg), got {conn!r}", field="conn")
        if is_mysql(conn) and not self.mysql:
            raise InvalidArgument("conn is a MySQL/MariaDB connection: use MySqlGuard (MySQL has no ON CONFLICT "
                                  "and quotes names with backticks)", field="conn")
        check_columns(table, key_column, token_column, [])
        self.table = table
        self.key_column = key_column
        self.token_column = token_column
        self.placeholder = _paramstyle(conn, paramstyle)
        self.dialect = "mysql" if self.mysql else self.storage if self.storage in IS_TOKEN else ""
        self.conn = conn
        self.commit = commit

    def update(self, key: Any, token: int | TokenHold, values: Mapping[str, Any]) -> None:
        """Update an existing row if ``token`` is not lower than the row's token.

        Args:
            key: The row's key (bound as a parameter; not None).
            token: The writer's fencing token, or its lock handle (then a
                refusal while the hold is live is a StoredTokenAheadError).
            values: Column name -> new value (names must be identifiers, and
                neither the key column nor the token column; ``{}`` writes
                the token alone).

        Raises:
            StaleTokenError: the row holds a higher token; nothing was written.
            StoredTokenAheadError: (a StaleTokenError) the same, while the
                hold given as ``token`` is live.
            MissingRecordError: no row has that key; nothing was written.
            InvalidArgument: a bad key, token, values mapping or column name,
                or a str key or value that is not valid UTF-8;
                nothing was sent.
        """
        token, hold = writer_token(token)
        columns = self._check(key, token, values)
        sql = update_statement(self.table, self.key_column, columns, token_column=self.token_column,
                               placeholder=self.placeholder, dialect=self.dialect)
        params = [values[c] for c in columns] + [token, key, token]
        if self._execute(sql, params):
            return
        stored, found = self._current(key)
        self._end_refused()
        current = self._token_of(key, token, stored)
        if not found or current is None or current <= token:
            raise MissingRecordError(f"no row of {self.table!r} has {self.key_column} = {key!r}", record=key)
        raise self._reject(key, token, current, hold=hold)

    def upsert(self, key: Any, token: int | TokenHold, values: Mapping[str, Any]) -> None:
        """Insert the row, or update it if ``token`` is not lower than its token.

        Args:
            key: The row's key (bound as a parameter; not None).
            token: The writer's fencing token, or its lock handle (as :meth:`update`).
            values: Column name -> value (names must be identifiers, and
                neither the key column nor the token column).

        Raises:
            StaleTokenError: the row holds a higher token; nothing was written.
            StoredTokenAheadError: (a StaleTokenError) the same, while the
                hold given as ``token`` is live.
            InvalidArgument: a bad key, token, values mapping or column name,
                or a str key or value that is not valid UTF-8;
                nothing was sent.
        """
        token, hold = writer_token(token)
        columns = self._check(key, token, values)
        sql = upsert_statement(self.table, self.key_column, columns, token_column=self.token_column,
                               placeholder=self.placeholder, dialect=self.dialect)
        params = [key] + [values[c] for c in columns] + [token]
        if self._execute(sql, params):
            return
        stored, _ = self._current(key)
        self._end_refused()
        raise self._reject(key, token, self._token_of(key, token, stored), hold=hold)

    def _check(self, key: Any, token: int, values: Mapping[str, Any]) -> list[str]:
        """Check a write's arguments before any statement; returns the column names."""
        check_token(token)
        if key is None:
            raise InvalidArgument(f"key must not be None: it picks the row of {self.table!r}", field="key")
        if not isinstance(values, Mapping):
            raise InvalidArgument(f"values must be a mapping of column name to value, got {type(values).__name__}",
                                  field="values")
        check_text(key, "key")
        check_text(values, "values")
        return list(values)

    def _execute(self, sql: str, params: list[Any]) -> bool:
        cur = self.conn.cursor()
        try:
            cur.execute(sql, params)
            accepted = cur.rowcount == 1
        finally:
            cur.close()
        if accepted and self.commit:
            self.conn.commit()
        if accepted:
            self._accepted()
        return accepted

    def _end_refused(self) -> None:
        # A refused upsert still row-locks the conflicting row in PostgreSQL:
        # with commit=True end that transaction too (it changed nothing).
        if self.commit:
            self.conn.commit()

    def _token_of(self, key: Any, token: int, stored: object) -> int | None:
        """The row's stored token read after a refusal (None: no token, or no row).

        Raises:
            MalformedTokenError: ``stored`` is not a non-negative int (a REAL,
                TEXT or BLOB in SQLite, a NUMERIC in PostgreSQL; counted as a refusal).
        """
        if stored is None:
            return None
        current = stored_token(stored, text=False)
        if current is None:
            raise self._malformed(key, token, stored, what=f"{self.token_column} column value")
        return current

    def _current(self, key: Any) -> tuple[object, bool]:
        """The row's stored token as the driver returns it, after a refusal, for the error only: (token, found)."""
        p = self.placeholder
        cur = self.conn.cursor()
        try:
            cur.execute(f"SELECT {quoted(self.token_column)} FROM {quoted(self.table)} "
                        f"WHERE {quoted(self.key_column)} = {p}", [key])
            row = cur.fetchone()
        finally:
            cur.close()
        if row is None:
            return None, False
        return row[0], True
