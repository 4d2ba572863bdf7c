/**
 * The PostgreSQL fencing guard: the Python `SqlGuard`'s statements and
 * contract, over `pg` (node-postgres).
 *
 * The token lives in a column of the guarded row (`fencing_token BIGINT`,
 * NULL = no token yet). Each write is ONE statement whose WHERE clause is the
 * fencing check; nothing is read before it. For a table `invoices` keyed by
 * `id` with a column `total`:
 *
 * ```sql
 * -- updateWithFencing(): the row must exist
 * UPDATE "invoices" SET "total" = $1, "fencing_token" = $2
 *  WHERE "id" = $3 AND ("fencing_token" IS NULL OR "fencing_token" <= $4)
 *
 * -- upsertWithFencing(): insert the row, or update it under the same check
 * INSERT INTO "invoices" ("id", "total", "fencing_token") VALUES ($1, $2, $3)
 * ON CONFLICT ("id") DO UPDATE SET "total" = excluded."total", "fencing_token" = excluded."fencing_token"
 *  WHERE "invoices"."fencing_token" IS NULL OR "invoices"."fencing_token" <= excluded."fencing_token"
 * ```
 *
 * A write with token `t` is accepted when the row has no token yet or
 * `t >= stored` (one holder may write many times), and refused when
 * `t < stored`: {@link StaleTokenError} with `record`, `token` and
 * `currentToken`, the row unchanged. A stored token that is not a value >= 0 of an integer column
 * (`"fencing_token" <= $4` above is, in full, `pg_typeof(...) IN ('bigint'::regtype, ...) AND
 * "fencing_token" >= 0 AND "fencing_token" <= $4`) refuses the write too:
 * {@link MalformedTokenError}, counted. The statement's row count decides; only
 * after a refusal is the row's token read, to fill the error and tell
 * "stale" from "missing" ({@link MissingRecordError}); that read decides
 * nothing. Given the lock handle in place of the token, a refusal while the hold is still live throws
 * {@link StoredTokenAheadError} (the stored token is ahead of the lock service: see `./ahead.ts`), counted in
 * `ahead` too. Table and column names are validated identifiers (double-quoted:
 * case-sensitive); every value is a bound parameter. The statement runs on
 * the caller's client or pool, in the caller's transaction if any.
 *
 * @module
 */

import { InvalidArgument, MissingRecordError, StaleTokenError } from "../errors.js";
import { checkIdentifier } from "../validate.js";
import { StoredTokenAheadError, aheadMessage, isLive, writerToken, type TokenHold } from "./ahead.js";

/** The default token column. */
export const TOKEN_COLUMN = "fencing_token";

/** What the guard needs of a `pg` Client, PoolClient or Pool. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rowCount: number | null; rows: Record<string, unknown>[] }>;
}

/** Options of a {@link PgGuard}. */
export interface PgGuardOptions {
  /** The BIGINT token column; `fencing_token` by default. */
  tokenColumn?: string;
  /** Called with each refusal (for metrics), before it is thrown. */
  onReject?: (err: StaleTokenError) => void;
}

const q = (name: string): string => `"${name}"`;

/** The integer types a token column may have (`pg_typeof`): any other type holds no token. */
const INTEGER_TYPES = ["bigint", "integer", "smallint"];
/** A token's text form: decimal digits, no sign, no leading zero but "0" itself. */
const CANONICAL = /^(0|[1-9][0-9]*)$/;

/**
 * The fencing condition: the stored token `tok` is NULL, or a token (a value >= 0 of an integer
 * column) <= `value`. The Python guard's `allows(..., "postgresql")`.
 */
function allows(tok: string, value: string): string {
  const types = INTEGER_TYPES.map((t) => `'${t}'::regtype`).join(", ");
  return `${tok} IS NULL OR (pg_typeof(${tok}) IN (${types}) AND ${tok} >= 0 AND ${tok} <= ${value})`;
}

/**
 * A guard refused a write because the row's stored token is not a fencing token: a value of a
 * column that is not an integer type (NUMERIC 7.5, DOUBLE PRECISION 7), or a negative one. The row
 * is unchanged; the refusal is counted in `rejected` and passed to `onReject`. A
 * {@link StaleTokenError} (reason `MALFORMED_TOKEN`, `currentToken` undefined), so that code that
 * stops on a refused write stops on this one too. The Python guards' `MalformedTokenError`.
 */
export class MalformedTokenError extends StaleTokenError {
  /** The stored token as text, and its PostgreSQL type: `"7.5 (numeric)"`. */
  readonly stored: string;
  constructor(message: string, fields: { record?: unknown; token?: bigint; stored: string }) {
    super(message, { record: fields.record, token: fields.token, reason: "MALFORMED_TOKEN" });
    this.stored = fields.stored;
  }
}

function checkColumns(table: string, keyColumn: string, tokenColumn: string, columns: string[]): void {
  checkIdentifier(table, "table");
  checkIdentifier(keyColumn, "keyColumn");
  checkIdentifier(tokenColumn, "tokenColumn");
  if (keyColumn.toLowerCase() === tokenColumn.toLowerCase()) {
    throw new InvalidArgument(`tokenColumn must not be the key column, got ${JSON.stringify(tokenColumn)}`, {
      field: "tokenColumn",
    });
  }
  for (const column of columns) {
    checkIdentifier(column, "values");
    if (column.toLowerCase() === tokenColumn.toLowerCase()) {
      throw new InvalidArgument(
        `values must not set the token column ${JSON.stringify(column)}: the guard writes the fencing token itself`,
        { field: "values" },
      );
    }
    if (column.toLowerCase() === keyColumn.toLowerCase()) {
      throw new InvalidArgument(
        `values must not set the key column ${JSON.stringify(column)}: the key picks the row`,
        { field: "values" },
      );
    }
  }
}

/**
 * The conditional UPDATE for `columns` (parameters: values..., token, key, token).
 *
 * @throws {@link InvalidArgument} a name is not an identifier, or `columns` names the key or token column.
 */
export function updateStatement(table: string, keyColumn: string, columns: string[], tokenColumn = TOKEN_COLUMN): string {
  checkColumns(table, keyColumn, tokenColumn, columns);
  let n = 0;
  const p = (): string => `$${++n}`;
  const sets = columns.map((c) => `${q(c)} = ${p()}, `).join("");
  const tok = q(tokenColumn);
  const set = p();
  const key = p();
  return `UPDATE ${q(table)} SET ${sets}${tok} = ${set} WHERE ${q(keyColumn)} = ${key} AND (${allows(tok, p())})`;
}

/**
 * The conditional upsert for `columns` (parameters: key, values..., token).
 *
 * @throws {@link InvalidArgument} a name is not an identifier, or `columns` names the key or token column.
 */
export function upsertStatement(table: string, keyColumn: string, columns: string[], tokenColumn = TOKEN_COLUMN): string {
  checkColumns(table, keyColumn, tokenColumn, columns);
  const names = [keyColumn, ...columns, tokenColumn];
  const tok = q(tokenColumn);
  const sets = [...columns, tokenColumn].map((c) => `${q(c)} = excluded.${q(c)}`).join(", ");
  return (
    `INSERT INTO ${q(table)} (${names.map(q).join(", ")}) VALUES (${names.map((_, i) => `$${i + 1}`).join(", ")}) ` +
    `ON CONFLICT (${q(keyColumn)}) DO UPDATE SET ${sets} ` +
    `WHERE ${allows(`${q(table)}.${tok}`, `excluded.${tok}`)}`
  );
}

/**
 * Fenced writes to the rows of one PostgreSQL table, each one conditional statement.
 *
 * @example
 * ```ts
 * const guard = new PgGuard(pool, "invoices", "id");
 * await client.withLock("inv:42", { ttl: 10 }, async (h) => {
 *   await guard.updateWithFencing(42, { total: 100 }, h.token); // StaleTokenError if a newer holder wrote
 * });
 * ```
 */
export class PgGuard {
  readonly table: string;
  readonly keyColumn: string;
  readonly tokenColumn: string;
  /** How many writes this guard refused. */
  rejected = 0;
  /** How many of those came with a live hold: {@link StoredTokenAheadError}. */
  ahead = 0;
  private readonly db: Queryable;
  private readonly onReject: ((err: StaleTokenError) => void) | undefined;

  /**
   * @param db - A `pg` Client, PoolClient or Pool (anything with `query(text, values)`).
   * @param table - The table name; must match `^[A-Za-z_][A-Za-z0-9_]*$`.
   * @param keyColumn - The key column (unique or primary key), same rule.
   * @throws {@link InvalidArgument} `db` has no `query`, a name is not an
   *   identifier (field `table`, `keyColumn`, `tokenColumn`), or the token column is the key column.
   */
  constructor(db: Queryable, table: string, keyColumn: string, options: PgGuardOptions = {}) {
    if (db === null || typeof db !== "object" || typeof (db as Queryable).query !== "function") {
      throw new InvalidArgument("db must be a pg Client, PoolClient or Pool", { field: "db" });
    }
    const tokenColumn = options.tokenColumn ?? TOKEN_COLUMN;
    checkColumns(table, keyColumn, tokenColumn, []);
    this.db = db;
    this.table = table;
    this.keyColumn = keyColumn;
    this.tokenColumn = tokenColumn;
    this.onReject = options.onReject;
  }

  /**
   * Update an existing row if `token` is not lower than the row's token.
   *
   * @param key - The row's key (bound as a parameter; not null or undefined).
   * @param values - Column name -> new value; neither the key nor the token column. `{}` writes the token alone.
   * @param token - The writer's fencing token (`handle.token`), or the handle itself (then a refusal while it is
   *   live is a {@link StoredTokenAheadError}).
   * @throws {@link StaleTokenError} the row holds a higher token; nothing was written.
   * @throws {@link StoredTokenAheadError} the same while the hold given as `token` is live.
   * @throws {@link MalformedTokenError} the row's token is not a token (a non-integer column's value, a negative); nothing was written.
   * @throws {@link MissingRecordError} no row has that key; nothing was written.
   * @throws {@link InvalidArgument} a bad key, token, values object or column name; nothing was sent.
   * @throws the driver's own errors, unchanged.
   */
  async updateWithFencing(key: unknown, values: Record<string, unknown>, holdOrToken: bigint | TokenHold): Promise<void> {
    const { token, hold } = writerToken(holdOrToken);
    const columns = this.check(key, values);
    const sql = updateStatement(this.table, this.keyColumn, columns, this.tokenColumn);
    const params = [...columns.map((c) => values[c]), token.toString(), key, token.toString()];
    const result = await this.db.query(sql, params);
    if (result.rowCount === 1) return;
    const { current, found } = await this.current(key, token);
    if (!found || current === undefined || current <= token) {
      throw new MissingRecordError(
        `no row of ${JSON.stringify(this.table)} has ${this.keyColumn} = ${JSON.stringify(String(key))}`,
        { record: key },
      );
    }
    throw this.reject(key, token, current, hold);
  }

  /**
   * Insert the row, or update it if `token` (a token, or the handle: as {@link updateWithFencing}) is not lower
   * than its token.
   *
   * @throws {@link StaleTokenError} the row holds a higher token; nothing was written.
   * @throws {@link StoredTokenAheadError} the same while the hold given as `token` is live.
   * @throws {@link MalformedTokenError} the row's token is not a token; nothing was written.
   * @throws {@link InvalidArgument} a bad key, token, values object or column name; nothing was sent.
   */
  async upsertWithFencing(key: unknown, values: Record<string, unknown>, holdOrToken: bigint | TokenHold): Promise<void> {
    const { token, hold } = writerToken(holdOrToken);
    const columns = this.check(key, values);
    const sql = upsertStatement(this.table, this.keyColumn, columns, this.tokenColumn);
    const params = [key, ...columns.map((c) => values[c]), token.toString()];
    const result = await this.db.query(sql, params);
    if (result.rowCount === 1) return;
    const { current } = await this.current(key, token);
    throw this.reject(key, token, current, hold);
  }

  private check(key: unknown, values: Record<string, unknown>): string[] {
    if (key === null || key === undefined) {
      throw new InvalidArgument(`key must not be ${key}: it picks the row of ${JSON.stringify(this.table)}`, {
        field: "key",
      });
    }
    if (values === null || typeof values !== "object" || Array.isArray(values)) {
      throw new InvalidArgument("values must be an object of column name to value", { field: "values" });
    }
    const columns = Object.keys(values);
    checkColumns(this.table, this.keyColumn, this.tokenColumn, columns);
    return columns;
  }

  /** The row's token after a refusal (for the error only); throws MalformedTokenError (counted) for a stored non-token. */
  private async current(key: unknown, token: bigint): Promise<{ current: bigint | undefined; found: boolean }> {
    const tok = q(this.tokenColumn);
    const result = await this.db.query(
      `SELECT ${tok}::text AS token, pg_typeof(${tok})::text AS type FROM ${q(this.table)} WHERE ${q(this.keyColumn)} = $1`,
      [key],
    );
    const row = result.rows[0];
    if (row === undefined) return { current: undefined, found: false };
    const text = row["token"] as string | null;
    if (text === null) return { current: undefined, found: true };
    const type = String(row["type"]);
    if (!INTEGER_TYPES.includes(type) || !CANONICAL.test(text)) {
      throw this.count(
        new MalformedTokenError(
          `write to ${this.table} ${JSON.stringify(String(key))} refused: the stored ${this.tokenColumn} is ` +
            `${text} (${type}), not a fencing token (a value >= 0 of an integer column); it was written outside the guard`,
          { record: key, token, stored: `${text} (${type})` },
        ),
      );
    }
    return { current: BigInt(text), found: true };
  }

  private reject(key: unknown, token: bigint, current: bigint | undefined, hold: TokenHold | undefined): StaleTokenError {
    if (current !== undefined && current > token && isLive(hold)) {
      this.ahead++;
      const what = `write to ${this.table} ${JSON.stringify(String(key))}`;
      return this.count(new StoredTokenAheadError(aheadMessage(what, token, current), { record: key, token, currentToken: current }));
    }
    return this.count(
      new StaleTokenError(
        `write to ${this.table} ${JSON.stringify(String(key))} refused: token ${token} < stored ${current ?? "?"}`,
        { record: key, token, currentToken: current },
      ),
    );
  }

  private count<E extends StaleTokenError>(err: E): E {
    this.rejected++;
    try {
      this.onReject?.(err);
    } catch {
      // a metrics hook must not hide the refusal
    }
    return err;
  }
}

/**
 * Fenced UPDATE of one row: {@link PgGuard.updateWithFencing} without keeping a guard.
 *
 * @throws as {@link PgGuard.updateWithFencing}.
 */
export function updateWithFencing(
  db: Queryable,
  table: string,
  keyColumn: string,
  key: unknown,
  values: Record<string, unknown>,
  token: bigint | TokenHold,
): Promise<void> {
  return new PgGuard(db, table, keyColumn).updateWithFencing(key, values, token);
}
