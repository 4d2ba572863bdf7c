// No state outlives the call that made it: aborted acquires are withdrawn,
// leases granted for aborted callers are revoked, concurrent releases share
// one call; and listLocks.
import { test } from "node:test";
import assert from "node:assert/strict";
import { InvalidArgument, LockClient, LockHandle } from "../src/index.js";
import { ADDRESS, etcdLeaseIds, lockName } from "./helpers.js";

/** The lease ids a client keeps (test-only look inside). */
function knownLeases(client: LockClient): Set<bigint> {
  const pool = (client as unknown as { pool: { leases(): { leaseId: bigint }[] } }).pool;
  return new Set(pool.leases().map((l) => l.leaseId));
}

/** Milliseconds `work` takes. */
async function timed(work: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await work();
  return performance.now() - started;
}

/** Run `acquire` with a signal aborted `delayMs` from now: the handle, or what it rejected with. */
async function abortAfter(
  delayMs: number,
  acquire: (signal: AbortSignal) => Promise<LockHandle>,
): Promise<LockHandle | unknown> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error("caller gave up")), delayMs);
  try {
    return await acquire(controller.signal).then((h) => h, (e: unknown) => e);
  } finally {
    clearTimeout(timer);
  }
}

test("an acquire aborted at random moments around its grant: the caller has the lock, or it is free at once", async (t) => {
  await using caller = new LockClient(ADDRESS);
  await using third = new LockClient(ADDRESS);
  const name = lockName("abort-grant");
  // Warm up (the lease and connections exist) and measure a grant.
  await (await third.acquire(name, { ttl: 5 })).release();
  await (await caller.acquire(name, { ttl: 5 })).release();
  let grantMs = 0;
  for (let i = 0; i < 3; i++) grantMs += await timed(async () => (await caller.acquire(name, { ttl: 5 })).release());
  grantMs = Math.max(2, grantMs / 3 / 2); // a Release takes about as long as the Acquire
  let granted = 0;
  let aborted = 0;
  for (let i = 0; i < 30; i++) {
    const outcome = await abortAfter(Math.random() * grantMs * 1.5, (signal) => caller.acquire(name, { ttl: 5, signal }));
    if (outcome instanceof LockHandle) {
      granted++;
      await outcome.release();
      continue;
    }
    aborted++;
    assert.match(String(outcome), /caller gave up/);
    // Right after the rejection: nothing of the aborted acquire is left (tryAcquire throws LockHeld otherwise).
    const other = await third.tryAcquire(name, { ttl: 5 });
    await other.release();
  }
  t.diagnostic(`grant ~${grantMs.toFixed(1)} ms; ${granted} granted, ${aborted} aborted`);
  assert.ok(aborted > 0, "no acquire was aborted");
  const info = await third.describe(name);
  assert.equal(info.held, false);
  assert.equal(info.waiterCount, 0);
  // The caller's slot of (lease, name) is free again: granted at once.
  await (await caller.acquire(name, { ttl: 5, timeout: 2 })).release();
});

test("an acquire aborted during its lease grant leaves no lease the client does not know", async (t) => {
  const name = lockName("abort-lease");
  await using holder = new LockClient(ADDRESS);
  const held = await holder.acquire(name, { ttl: 5 }); // the others wait, so an abort after the grant finds a queued key
  let firstMs = 0;
  {
    await using probe = new LockClient(ADDRESS);
    firstMs = await timed(() => probe.describe(name).then(() => probe.tryAcquire(lockName("probe"), { ttl: 5 })));
  }
  const before = await etcdLeaseIds();
  let withLease = 0;
  for (let i = 0; i < 15; i++) {
    const client = new LockClient(ADDRESS);
    try {
      await client.describe(name); // connected: the abort falls on the LeaseGrant or just after it
      const outcome = await abortAfter(Math.random() * firstMs, (signal) => client.acquire(name, { ttl: 5, signal }));
      assert.ok(!(outcome instanceof LockHandle), "granted a held lock");
      assert.match(String(outcome), /caller gave up/);
      const known = knownLeases(client);
      if (known.size > 0) withLease++;
      const unknown = [...(await etcdLeaseIds())].filter((id) => !before.has(id) && !known.has(id));
      assert.deepEqual(unknown, [], "a lease the client does not know was left in etcd");
    } finally {
      await client.close();
    }
  }
  t.diagnostic(`${withLease} of 15 aborted after the lease was kept`);
  assert.equal((await holder.describe(name)).waiterCount, 0);
  await held.release();
});

test("a lease granted while the client is closing is revoked", async () => {
  const before = await etcdLeaseIds();
  for (let i = 0; i < 10; i++) {
    const client = new LockClient(ADDRESS);
    await client.describe(lockName("closing")); // connected
    const acquiring = client.acquire(lockName("closing"), { ttl: 5 }).then(
      (h) => h,
      (e: unknown) => e,
    );
    await new Promise((r) => setTimeout(r, Math.random() * 3)); // the LeaseGrant is in flight, or just answered
    await client.close();
    await acquiring;
    const left = [...(await etcdLeaseIds())].filter((id) => !before.has(id));
    assert.deepEqual(left, [], "close() left a lease behind");
  }
});

test("two concurrent release() calls share the one Release: both resolve, the hold is released, never lost", async () => {
  await using client = new LockClient(ADDRESS);
  const name = lockName("release-twice");
  const held = await client.acquire(name, { ttl: 5 });
  const first = held.release();
  const second = held.release();
  await Promise.all([first, second]);
  assert.equal(held.released, true);
  assert.equal(held.lostReason, undefined);
  assert.equal(held.signal.aborted, false);
  assert.equal((await client.describe(name)).held, false);
});

test("listLocks lists every held lock under a prefix, page by page, with bigint tokens and waiter counts", async () => {
  await using a = new LockClient(ADDRESS);
  await using b = new LockClient(ADDRESS);
  await using waiter = new LockClient(ADDRESS);
  const base = lockName("list");
  const first = await a.acquire(`${base}/a`, { ttl: 5 });
  const second = await b.acquire(`${base}/b`, { ttl: 7 });
  const controller = new AbortController();
  const waiting = waiter.acquire(`${base}/a`, { ttl: 5, signal: controller.signal });
  for (let i = 0; (await a.describe(`${base}/a`)).waiterCount < 1; i++) {
    assert.ok(i < 200, "the waiter never queued");
    await new Promise((r) => setTimeout(r, 20));
  }
  const locks = await a.listLocks(base, { pageSize: 1 });
  assert.deepEqual(locks.map((l) => l.name), [`${base}/a`, `${base}/b`]);
  const [la, lb] = locks as [(typeof locks)[0], (typeof locks)[0]];
  assert.equal(la.token, first.token);
  assert.equal(la.holderLeaseId, first.leaseId);
  assert.equal(lb.token, second.token);
  assert.equal(lb.holderLeaseId, second.leaseId);
  assert.equal(typeof la.token, "bigint");
  assert.equal(typeof la.revision, "bigint");
  assert.equal(la.waiterCount, 1);
  assert.equal(lb.waiterCount, 0);
  assert.equal(la.revision, lb.revision, "every page is read at one revision");
  assert.ok(la.revision >= second.token);
  assert.ok(la.ttl >= 5 && lb.ttl >= 7, `${la.ttl} ${lb.ttl}`);
  assert.ok(la.ttlRemaining !== undefined && la.ttlRemaining > 0 && la.ttlRemaining <= la.ttl);
  assert.ok(la.heldFor === undefined || la.heldFor >= 0);
  assert.deepEqual((await a.listLocks(`${base}/b`)).map((l) => l.name), [`${base}/b`]);
  assert.deepEqual(await a.listLocks(`${base}/none`), []);
  assert.ok((await a.listLocks()).length >= 2);
  await assert.rejects(a.listLocks(base, { pageSize: 1001 }), (e: unknown) => e instanceof InvalidArgument && e.field === "pageSize");
  controller.abort(new Error("caller gave up"));
  await assert.rejects(waiting, /caller gave up/);
  assert.equal((await a.listLocks(base))[0]?.waiterCount, 0);
  await first.release();
  await second.release();
  assert.deepEqual(await a.listLocks(base), []);
});
