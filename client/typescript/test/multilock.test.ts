// Multi-locks (docs/multilocks.md) through the TypeScript client: acquireAll, tryAcquireAll, withLocks.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { InvalidArgument, LeaseLost, LockClient, LockHeld, LockTimeout, MultiLockHandle, NotHolder } from "../src/index.js";
import { LockService } from "../src/gen/fencepost/v1/lock_pb.js";
import { ADDRESS, lockName, settledYet, waitFor, within } from "./helpers.js";

test("acquireAll gives one token per name; release frees every name at once", async () => {
  await using a = new LockClient(ADDRESS);
  const [x, y] = [lockName("multi-x"), lockName("multi-y")];
  const h = await a.acquireAll([x, y], { ttl: 5, timeout: 5 });
  assert.ok(h instanceof MultiLockHandle);
  assert.deepEqual(h.names, [x, y]);
  assert.deepEqual([...h.tokens.keys()], [x, y]);
  assert.equal(typeof h.tokenFor(x), "bigint");
  assert.equal((await a.describe(x)).token, h.tokenFor(x));
  assert.equal((await a.describe(y)).token, h.tokenFor(y));
  assert.equal((await a.describe(x)).holderLeaseId, h.leaseId);
  assert.ok(h.isValid() && h.validFor() > 0);
  assert.throws(() => h.tokenFor("not-mine"), InvalidArgument);
  await h.release();
  assert.equal(h.released, true);
  assert.equal((await a.describe(x)).held, false);
  assert.equal((await a.describe(y)).held, false);
  await assert.rejects(h.release(), NotHolder);
  const next = await a.acquireAll([y, x], { ttl: 5 });
  assert.ok(next.tokenFor(x) > h.tokenFor(x) && next.tokenFor(y) > h.tokenFor(y));
  await next.release();
});

test("two clients asking for two names in opposite orders never deadlock, and are granted in turn", async () => {
  await using a = new LockClient(ADDRESS);
  await using b = new LockClient(ADDRESS);
  await using c = new LockClient(ADDRESS);
  const [x, y] = [lockName("order-x"), lockName("order-y")];
  const blocker = await c.acquire(x, { ttl: 5 }); // both multi-locks queue behind it
  const first = a.acquireAll([x, y], { ttl: 5, timeout: 10 });
  await waitFor(async () => (await c.describe(x)).waiterCount >= 1, "the first multi-lock queued");
  const second = b.acquireAll([y, x], { ttl: 5, timeout: 10 });
  await waitFor(async () => (await c.describe(x)).waiterCount >= 2, "the second multi-lock queued");
  assert.equal((await c.describe(y)).waiterCount, 1, "y: the first caller's key, then the second's");
  await blocker.release();
  const hA = await first;
  assert.equal(await settledYet(second), false, "both multi-locks were granted at once");
  await hA.release();
  const hB = await second;
  for (const name of [x, y]) {
    assert.ok(hB.tokenFor(name) > hA.tokenFor(name), `${name}: ${hB.tokenFor(name)} > ${hA.tokenFor(name)}`);
  }
  assert.ok(hA.tokenFor(x) > blocker.token);
  await hB.release();
  // Many rounds at once in both orders: every one is granted (a deadlock would end in LockTimeout).
  const rounds = await Promise.all(
    Array.from({ length: 6 }, (_, i) => (i % 2 === 0 ? a : b).withLocks(i % 2 === 0 ? [x, y] : [y, x],
      { ttl: 5, timeout: 10 }, (h) => h.tokenFor(x))),
  );
  assert.equal(new Set(rounds).size, 6);
});

test("tryAcquireAll on a held name throws LockHeld naming it and leaves no key of any name", async () => {
  await using a = new LockClient(ADDRESS);
  await using b = new LockClient(ADDRESS);
  const [x, y] = [lockName("try-x"), lockName("try-y")];
  const held = await a.acquire(y, { ttl: 5 });
  const err = await b.tryAcquireAll([x, y], { ttl: 5 }).then(() => assert.fail("granted"), (e: unknown) => e);
  assert.ok(err instanceof LockHeld, String(err));
  assert.equal(err.lockName, y);
  assert.equal(err.holderLeaseId, held.leaseId);
  assert.equal(err.holderToken, held.token);
  const [infoX, infoY] = [await a.describe(x), await a.describe(y)];
  assert.equal(infoX.held, false, "the free name was left taken");
  assert.equal(infoX.waiterCount, 0);
  assert.equal(infoY.holderLeaseId, held.leaseId);
  assert.equal(infoY.waiterCount, 0, "a key was left queued on the held name");
  await assert.rejects(b.acquireAll([x, y], { ttl: 5, timeout: 0.3 }), LockTimeout);
  assert.equal((await a.describe(x)).held, false, "a timed-out acquireAll left a key");
  assert.equal((await a.describe(y)).waiterCount, 0, "a timed-out acquireAll left a key");
  await held.release();
  const h = await b.tryAcquireAll([x, y], { ttl: 5 });
  await h.release();
});

test("one name lost loses the multi-lock: lost settles, signal aborts, the other name is released", async () => {
  await using a = new LockClient(ADDRESS);
  const [x, y] = [lockName("lost-x"), lockName("lost-y")];
  const h = await a.acquireAll([x, y], { ttl: 5 });
  const raw = createClient(LockService, createGrpcTransport({ baseUrl: `http://${ADDRESS}` }));
  const member = await a.describe(x);
  assert.equal(member.holderLeaseId, h.leaseId);
  // Delete x's key alone, as the lease's owner (a raw call stands for an operator or a bug).
  const secret = h.leaseSecret;
  await raw.release({ name: x, leaseId: h.leaseId, token: h.tokenFor(x) }, { headers: { "fencepost-lease-secret": secret } });
  const lost = await within(h.lost, 4000, "the multi-lock's loss reported");
  assert.ok(lost instanceof LeaseLost);
  assert.equal(lost.lockName, x);
  assert.equal(h.signal.aborted, true);
  assert.equal(h.isValid(), false);
  await waitFor(async () => !(await a.describe(y)).held, "the other name released after the loss");
  await assert.rejects(h.release(), LeaseLost);
  await assert.rejects(
    a.withLocks([x, y], { ttl: 5 }, async (held) => {
      await raw.release({ name: y, leaseId: held.leaseId, token: held.tokenFor(y) },
        { headers: { "fencepost-lease-secret": secret } });
      await within(held.lost, 4000, "the second multi-lock's loss reported");
      return "done";
    }),
    LeaseLost,
  );
});

test("bad names are refused before any call with InvalidArgument, field names", async () => {
  const offline = new LockClient("127.0.0.1:1"); // nothing listens: a call would fail with Unavailable
  const x = lockName("bad");
  const cases: [unknown, RegExp][] = [
    [[], /2 to 32/],
    [[x], /2 to 32/],
    [[x, x], /more than once/],
    [x, /array/],
    [[x, ""], /empty/],
    [[x, "a\u0000b"], /control characters/],
    [Array.from({ length: 33 }, (_, i) => `${x}${i}`), /33 names/],
  ];
  for (const [names, message] of cases) {
    for (const call of [
      () => offline.acquireAll(names as string[], { ttl: 5 }),
      () => offline.tryAcquireAll(names as string[]),
      () => offline.withLocks(names as string[], {}, () => 0),
    ]) {
      const err = await call().then(() => assert.fail("accepted"), (e: unknown) => e);
      assert.ok(err instanceof InvalidArgument, `${JSON.stringify(names)}: ${String(err)}`);
      assert.equal(err.field, "names");
      assert.match(err.message, message);
    }
  }
  const ttl = await offline.acquireAll([x, `${x}2`], { ttl: 0 }).catch((e: InvalidArgument) => e.field);
  assert.equal(ttl, "ttl");
  await offline.close();
});
