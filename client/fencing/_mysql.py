"""MySQL/MariaDB guard over a PyMySQL connection: the SqlGuard contract in MySQL's dialect.

The token lives in a column of the guarded row (``fencing_token BIGINT``,
NULL = no token yet), as for :class:`~fencepost.client.fencing.SqlGuard`.
Each write is ONE conditional statement that does the fencing; for a table
``invoices`` keyed by ``id`` with columns ``status`` and ``total``::

    -- MySqlGuard.update(): the row must exist
    UPDATE `invoices` SET `status` = %s, `total` = %s, `fencing_token` = %s
     WHERE `id` = %s AND (`fencing_token` IS NULL OR `fencing_token` <= %s)

    -- MySqlGuard.upsert(): MySQL has no conditional ON CONFLICT, so every
    -- assignment keeps the old value unless the STORED token allows the write
    INSERT INTO `invoices` (`id`, `status`, `total`, `fencing_token`) VALUES (%s, %s, %s, %s)
    ON DUPLICATE KEY UPDATE
      `status` = IF(`fencing_token` IS NULL OR `fencing_token` <= %s, %s, `status`),
      `total` = IF(`fencing_token` IS NULL OR `fencing_token` <= %s, %s, `total`),
      `fencing_token` = IF(`fencing_token` IS NULL OR `fencing_token` <= %s, %s, `fencing_token`)

Here ```fencing_token` <= %s`` is shortened: in full it is ``(CAST(`fencing_token`
AS CHAR) REGEXP '^(0|[1-9][0-9]*)$' AND `fencing_token` <= %s)``, so that a
stored 7.5, ``'1e3'``, ``'abc'`` or -5 refuses the write (then
:class:`~fencepost.client.fencing.MalformedTokenError`).

MySQL evaluates these assignments left to right, each one seeing the columns
already assigned: the token column is assigned LAST, so that every value's
condition reads the stored token, never the one being written.

Telling accepted from refused. MySQL's affected-rows count is not the
number of matched rows:

=========  =====  ===================================  ===================================
statement  count  default connection                   ``client_flag=CLIENT.FOUND_ROWS``
=========  =====  ===================================  ===================================
UPDATE     1      accepted (changed)                   accepted (matched)
UPDATE     0      refused, missing, or accepted but    refused or missing
                  the same values (nothing changed)
upsert     1      inserted                             inserted, refused, or accepted but
                                                       the same values
upsert     2      updated                              updated
upsert     0      refused, or accepted but the same    (never)
                  values
=========  =====  ===================================  ===================================

The guard works with either setting. When the count says "accepted" it is
done; otherwise it reads the row's token with ``SELECT ... FOR UPDATE`` in
the SAME transaction, right after the statement, whose row lock (InnoDB)
still holds: a token above the writer's means refused; no row means missing
(``update``); otherwise the statement matched, and ``update`` runs it once
more under that lock (a no-op when the values were already there; and if the
row was inserted by someone else after the UPDATE found none, which READ
COMMITTED allows, this is what writes it). That read decides nothing about
the fencing: the conditional statement did; the read only reports what it
did. A same-token rewrite of the same values is accepted.

Transactions: as SqlGuard (the caller's transaction; ``commit=True`` commits
after each write, accepted or refused). A connection in autocommit mode with
no transaction open (PyMySQL's ``autocommit=True``) gets a transaction of the
guard's own around its statements, committed before the write returns, so
that the read runs under the statement's lock. Use InnoDB tables (MyISAM has
no transactions or row locks). Names are validated, then quoted with
backticks. Needs a unique index or primary key on the key column. Tested with
PyMySQL on MariaDB 10.11; other drivers with ``%s`` placeholders whose
connection has ``get_autocommit()`` and ``server_status`` should work alike.

The guard owns the key and token columns (see SqlGuard). Existing tables get
the token column with :func:`~fencepost.client.fencing.add_token_column`,
which quotes with backticks on a MySQL connection.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import MissingRecordError, StaleTokenError
from ._ahead import TokenHold
from ._guard import TOKEN_FIELD, RejectHook, writer_token
from ._sql import SqlGuard, allows, check_columns, quoted, update_statement

#: pymysql.constants.CLIENT.FOUND_ROWS: affected rows = matched rows (not changed rows).
CLIENT_FOUND_ROWS = 2
#: pymysql.constants.SERVER_STATUS.SERVER_STATUS_IN_TRANS: a transaction is open.
SERVER_STATUS_IN_TRANS = 1


def mysql_update_statement(table: str, key_column: str, columns: list[str], *,
                           token_column: str = TOKEN_FIELD) -> str:
    """The conditional UPDATE in MySQL's dialect (parameters: values..., token, key, token).

    Raises:
        InvalidArgument: a name is not an identifier, or ``columns`` names the
            key or the token column (field ``values``).
    """
    return update_statement(table, key_column, columns, token_column=token_column, placeholder="%s", quote="`",
                            dialect="mysql")


def mysql_upsert_statement(table: str, key_column: str, columns: list[str], *,
                           token_column: str = TOKEN_FIELD) -> str:
    """The conditional ``INSERT ... ON DUPLICATE KEY UPDATE``, the token column assigned last.

    Parameters, in order: key, values..., token (the INSERT), then token and
    value for each column, then token, token (the token's own assignment).

    Raises:
        InvalidArgument: a name is not an identifier, or ``columns`` names the
            key or the token column (field ``values``).
    """
    check_columns(table, key_column, token_column, columns)
    names = [key_column, *columns, token_column]
    tok = quoted(token_column, "`")
    cond = allows(tok, "%s", "mysql")
    # Left to right: the token column comes last so every condition reads the stored token.
    sets = ", ".join(f"{quoted(c, '`')} = IF({cond}, %s, {quoted(c, '`')})" for c in [*columns, token_column])
    return (f"INSERT INTO {quoted(table, '`')} ({', '.join(quoted(n, '`') for n in names)}) "
            f"VALUES ({', '.join('%s' for _ in names)}) ON DUPLICATE KEY UPDATE {sets}")


class MySqlGuard(SqlGuard):
    """Fenced writes to the rows of one MySQL/MariaDB table, each one conditional statement.

    Args:
        conn: A PyMySQL connection (``pymysql.connect(...)``, with or without
            ``client_flag=CLIENT.FOUND_ROWS``, autocommit on or off). Use it
            from one thread at a time, as the driver requires.
        table: The table name (InnoDB); must match ``^[A-Za-z_][A-Za-z0-9_]*$``.
        key_column: The key column (unique or primary key), same rule.
        token_column: The BIGINT token column, same rule.
        commit: Commit after each write, accepted or refused (default: the
            caller commits; in autocommit mode every write is committed).
        on_reject: Hook called with each StaleTokenError (see FencingGuard).
        metrics: A ``prometheus_client.CollectorRegistry`` to count writes in
            (see FencingGuard); ``storage`` is ``mysql``.

    Raises:
        InvalidArgument: ``conn`` is not a connection, a name is not an
            identifier, the token column is the key column, or the driver's
            placeholders are not ``%s``.
    """

    mysql = True

    def __init__(self, conn: Any, table: str, key_column: str, *, token_column: str = TOKEN_FIELD,
                 commit: bool = False, on_reject: RejectHook | None = None, metrics: Any = None) -> None:
        super().__init__(conn, table, key_column, token_column=token_column, paramstyle="format",
                         commit=commit, on_reject=on_reject, metrics=metrics)
        # Unknown driver: assume counts may be matched rows (the stricter reading).
        self.found_rows = bool(getattr(conn, "client_flag", CLIENT_FOUND_ROWS) & CLIENT_FOUND_ROWS)

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
            StaleTokenError: the row holds a higher token; nothing was written
                (StoredTokenAheadError while the hold given as ``token`` is live).
            MissingRecordError: no row has that key; nothing was written.
            InvalidArgument: a bad key, token, values mapping or column name;
                nothing was sent.
            pymysql.err.Error: the driver's own errors (a lost connection, a deadlock).
        """
        token, hold = writer_token(token)
        columns = self._check(key, token, values)
        sql = mysql_update_statement(self.table, self.key_column, columns, token_column=self.token_column)
        params = [values[c] for c in columns] + [token, key, token]
        with self._transaction():
            if self._run(sql, params) != 1:
                stored, found = self._locked_token(key)
                current = self._token_of(key, token, stored)
                if not found:
                    raise MissingRecordError(f"no row of {self.table!r} has {self.key_column} = {key!r}",
                                             record=key)
                if current is not None and current > token:
                    raise self._reject(key, token, current, hold=hold)
                # The row is ours under FOR UPDATE and its token allows the write: it matches now.
                self._run(sql, params)
        self._accepted()

    def upsert(self, key: Any, token: int | TokenHold, values: Mapping[str, Any]) -> None:
        """Insert the row, or update it if ``token`` is not lower than its token.

        Args:
            key: The row's key (bound as a parameter; not None).
            token: The writer's fencing token, or its lock handle (as :meth:`update`).
            values: Column name -> value (names must be identifiers, and
                neither the key column nor the token column).

        Raises:
            StaleTokenError: the row holds a higher token; nothing was written
                (StoredTokenAheadError while the hold given as ``token`` is live).
            InvalidArgument: a bad key, token, values mapping or column name;
                nothing was sent.
            pymysql.err.Error: the driver's own errors (a lost connection, a deadlock).
        """
        token, hold = writer_token(token)
        columns = self._check(key, token, values)
        sql = mysql_upsert_statement(self.table, self.key_column, columns, token_column=self.token_column)
        params = [key, *(values[c] for c in columns), token]
        for c in columns:
            params += [token, values[c]]
        params += [token, token]
        with self._transaction():
            count = self._run(sql, params)
            if not (count == 2 or (count == 1 and not self.found_rows)):
                # The statement inserted or row-locked the row: its token now is the writer's
                # (accepted: inserted, or the same values) or a higher one (refused).
                current = self._token_of(key, token, self._locked_token(key)[0])
                if current is not None and current > token:
                    raise self._reject(key, token, current, hold=hold)
        self._accepted()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction around a write's statements; commit as SqlGuard does (a refusal changed nothing)."""
        own = self._autocommit_outside_transaction()
        if own:
            self._run("START TRANSACTION", None)
        try:
            yield
        except (StaleTokenError, MissingRecordError):  # MalformedTokenError too
            if own or self.commit:
                self.conn.commit()
            raise
        except BaseException:
            if own:
                self.conn.rollback()
            raise
        if own or self.commit:
            self.conn.commit()

    def _autocommit_outside_transaction(self) -> bool:
        get = getattr(self.conn, "get_autocommit", None)
        if get is None or not get():
            return False
        return not getattr(self.conn, "server_status", 0) & SERVER_STATUS_IN_TRANS

    def _run(self, sql: str, params: list[Any] | None) -> int:
        cur = self.conn.cursor()
        try:
            cur.execute(sql, params)
            return int(cur.rowcount)
        finally:
            cur.close()

    def _locked_token(self, key: Any) -> tuple[object, bool]:
        """The row's stored token, read with FOR UPDATE (current, not snapshot), as the driver returns it.

        Returns:
            (stored token, row found).
        """
        cur = self.conn.cursor()
        try:
            cur.execute(f"SELECT {quoted(self.token_column, '`')} FROM {quoted(self.table, '`')} "
                        f"WHERE {quoted(self.key_column, '`')} = %s FOR UPDATE", [key])
            row = cur.fetchone()
        finally:
            cur.close()
        if row is None:
            return None, False
        return row[0], True
