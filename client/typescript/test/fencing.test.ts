// PgGuard against a real PostgreSQL (and a real coordinator for the handles): the contract of the Python SqlGuard.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { InvalidArgument, LockClient, MissingRecordError, StaleTokenError } from "../src/index.js";
import { MalformedTokenError, PgGuard, StoredTokenAheadError, updateStatement, updateWithFencing } from "../src/fencing/index.js";
import { ADDRESS, freshTable, lockName, pool, row } from "./helpers.js";

const db = pool();
after(() => db.end());

test("updateWithFencing accepts t >= stored, refuses t < stored with StaleTokenError, leaves the row unchanged", async () => {
  const table = await freshTable(db);
  const rejected: StaleTokenError[] = [];
  const guard = new PgGuard(db, table, "id", { onReject: (err) => rejected.push(err) });
  await guard.updateWithFencing(1, { val: "a" }, 5n); // NULL token: accepted
  await guard.updateWithFencing(1, { val: "b" }, 5n); // same holder again
  await guard.updateWithFencing(1, { val: "c" }, 7n);
  const err = await guard.updateWithFencing(1, { val: "stale" }, 6n).then(() => assert.fail("accepted"), (e: unknown) => e);
  assert.ok(err instanceof StaleTokenError, String(err));
  assert.equal(err.record, 1);
  assert.equal(err.token, 6n);
  assert.equal(err.currentToken, 7n);
  assert.deepEqual(await row(db, table), { val: "c", token: 7n });
  assert.equal(guard.rejected, 1);
  assert.deepEqual(rejected, [err]);
  // 64-bit tokens survive the round trip.
  await guard.updateWithFencing(1, { val: "big" }, 2n ** 62n + 1n);
  assert.deepEqual(await row(db, table), { val: "big", token: 2n ** 62n + 1n });
});

test("updateWithFencing of a missing row: MissingRecordError; upsertWithFencing inserts, then fences", async () => {
  const table = await freshTable(db);
  const guard = new PgGuard(db, table, "id");
  await assert.rejects(guard.updateWithFencing(99, { val: "x" }, 3n), (e) => e instanceof MissingRecordError && e.record === 99);
  await guard.upsertWithFencing(99, { val: "x" }, 3n);
  await guard.upsertWithFencing(99, { val: "y" }, 4n);
  await assert.rejects(guard.upsertWithFencing(99, { val: "z" }, 2n), (e) => e instanceof StaleTokenError && e.currentToken === 4n);
  const result = await db.query(`SELECT val, fencing_token::text AS t FROM "${table}" WHERE id = 99`);
  assert.deepEqual(result.rows[0], { val: "y", t: "4" });
  await updateWithFencing(db, table, "id", 1, { val: "fn" }, 1n);
  assert.equal((await row(db, table)).val, "fn");
});

test("the statement is one conditional UPDATE; bad names and arguments are InvalidArgument before any statement", async () => {
  assert.equal(
    updateStatement("invoices", "id", ["total"]),
    'UPDATE "invoices" SET "total" = $1, "fencing_token" = $2 WHERE "id" = $3 AND ("fencing_token" IS NULL OR ' +
      `(pg_typeof("fencing_token") IN ('bigint'::regtype, 'integer'::regtype, 'smallint'::regtype) AND ` +
      `"fencing_token" >= 0 AND "fencing_token" <= $4))`,
  );
  const field = (f: string) => (err: unknown) => err instanceof InvalidArgument && err.field === f;
  assert.throws(() => new PgGuard(db, "x; DROP TABLE y", "id"), field("table"));
  assert.throws(() => new PgGuard(db, "t", "id", { tokenColumn: "id" }), field("tokenColumn"));
  assert.throws(() => new PgGuard({} as never, "t", "id"), field("db"));
  const table = await freshTable(db);
  const guard = new PgGuard(db, table, "id");
  await assert.rejects(guard.updateWithFencing(1, { fencing_token: 1 }, 9n), field("values"));
  await assert.rejects(guard.updateWithFencing(1, { ID: 2 }, 9n), field("values"));
  await assert.rejects(guard.updateWithFencing(1, { "val = 1; --": 2 }, 9n), field("values"));
  await assert.rejects(guard.updateWithFencing(1, { val: "x" }, 0n), field("token"));
  await assert.rejects(guard.updateWithFencing(1, { val: "x" }, 5 as unknown as bigint), field("token"));
  await assert.rejects(guard.updateWithFencing(null, { val: "x" }, 5n), field("key"));
  assert.deepEqual(await row(db, table), { val: "initial", token: null });
});

test("a stored token that is not a token (negative; a NUMERIC or DOUBLE column's value) refuses both writes: MalformedTokenError, counted, row unchanged", async () => {
  for (const [column, stored] of [["BIGINT", "-5"], ["NUMERIC", "7.5"], ["NUMERIC", "7.0"], ["DOUBLE PRECISION", "7"]]) {
    const table = await freshTable(db);
    await db.query(`ALTER TABLE "${table}" ALTER COLUMN fencing_token TYPE ${column}`);
    await db.query(`UPDATE "${table}" SET fencing_token = ${stored} WHERE id = 1`);
    const before = (await db.query(`SELECT val, fencing_token::text AS t FROM "${table}"`)).rows;
    const seen: StaleTokenError[] = [];
    const guard = new PgGuard(db, table, "id", { onReject: (err) => seen.push(err) });
    for (const write of [guard.updateWithFencing.bind(guard), guard.upsertWithFencing.bind(guard)]) {
      const err = await write(1, { val: "new" }, 8n).then(() => assert.fail(`accepted over ${stored}`), (e: unknown) => e);
      assert.ok(err instanceof MalformedTokenError, String(err));
      assert.ok(err instanceof StaleTokenError);
      assert.equal(err.reason, "MALFORMED_TOKEN");
      assert.equal(err.currentToken, undefined);
      assert.equal(err.record, 1);
    }
    assert.equal(guard.rejected, 2);
    assert.equal(seen.length, 2);
    assert.deepEqual((await db.query(`SELECT val, fencing_token::text AS t FROM "${table}"`)).rows, before);
  }
});

test("a refusal while the writer's handle is live is StoredTokenAheadError (counted in ahead); released, or a bare token: a plain StaleTokenError", async () => {
  await using client = new LockClient(ADDRESS);
  const table = await freshTable(db);
  const rejected: StaleTokenError[] = [];
  const guard = new PgGuard(db, table, "id", { onReject: (err) => rejected.push(err) });
  const handle = await client.acquire(lockName("ahead"), { ttl: 10, timeout: 5 });
  await guard.updateWithFencing(1, { val: "mine" }, handle); // a handle's token is written as a token
  assert.deepEqual(await row(db, table), { val: "mine", token: handle.token });
  // A token the lock service has not reached yet, as a record written before etcd was restored holds one.
  const ahead = handle.token + 100n;
  await db.query(`UPDATE "${table}" SET fencing_token = $1 WHERE id = 1`, [ahead.toString()]);
  for (const write of [guard.updateWithFencing.bind(guard), guard.upsertWithFencing.bind(guard)]) {
    const err = await write(1, { val: "x" }, handle).then(() => assert.fail("accepted"), (e: unknown) => e);
    assert.ok(err instanceof StoredTokenAheadError, String(err));
    assert.ok(err instanceof StaleTokenError);
    assert.equal(err.reason, "TOKEN_AHEAD");
    assert.equal(err.token, handle.token);
    assert.equal(err.currentToken, ahead);
    assert.match(err.message, /ahead of the lock service.*recover-tokens/);
  }
  const bare = await guard.updateWithFencing(1, { val: "x" }, handle.token).then(() => assert.fail("accepted"), (e: unknown) => e);
  assert.ok(bare instanceof StaleTokenError && !(bare instanceof StoredTokenAheadError), String(bare));
  await handle.release();
  const late = await guard.updateWithFencing(1, { val: "x" }, handle).then(() => assert.fail("accepted"), (e: unknown) => e);
  assert.ok(late instanceof StaleTokenError && !(late instanceof StoredTokenAheadError), String(late));
  assert.equal(guard.rejected, 4);
  assert.equal(guard.ahead, 2);
  assert.equal(rejected.length, 4);
  assert.deepEqual(await row(db, table), { val: "mine", token: ahead });
  await assert.rejects(guard.updateWithFencing(1, { val: "x" }, { token: 5n } as never), (e) => e instanceof InvalidArgument && e.field === "token");
});
