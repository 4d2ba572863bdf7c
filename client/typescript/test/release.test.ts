// Release with a request id: each hold's Release carries one, and an attempt whose answer was lost (the
// connection cut after the coordinator applied it, or no answer at all) is sent again with the same id,
// which the coordinator answers as it answered the first (see "Retries" in proto/fencepost/v1/lock.proto).
import { test } from "node:test";
import assert from "node:assert/strict";
import { LockClient, REASON_OUTCOME_UNKNOWN, Unavailable, type LockHandle } from "../src/index.js";
import { ADDRESS, etcdRange, lockName, within } from "./helpers.js";
import { Proxy } from "./proxy.js";

/** The ids of the coordinator's request records (`<prefix>.request.<id>`) of a Release of `handle`. */
async function releaseRecords(handle: LockHandle): Promise<string[]> {
  const ids: string[] = [];
  for (const { key, value } of await etcdRange(".request.")) {
    if (!value.startsWith("{")) continue; // not a call's record
    const call = JSON.parse(value) as { method: string; name: string };
    const leaseId = /"lease_id":(\d+)/.exec(value)?.[1]; // as text: a lease id may not fit a double
    if (call.method === "Release" && call.name === handle.name && leaseId === String(handle.leaseId)) {
      ids.push(key.slice(key.indexOf(".request.") + ".request.".length));
    }
  }
  return ids;
}

test("a release carries a request id: the coordinator records the Release of a write hold and of a read hold", async () => {
  await using client = new LockClient(ADDRESS);
  for (const read of [false, true]) {
    const held = await client.acquire(lockName(`release-id-${read ? "read" : "write"}`), { ttl: 10, read });
    await held.release();
    const ids = await releaseRecords(held);
    assert.equal(ids.length, 1, `read ${read}: no request record of the Release (sent without a request id?)`);
    assert.match(ids[0]!, /^[0-9a-f]{32}$/);
  }
});

test("a Release whose answer is lost (the connection cut after the coordinator applied it) is sent again: it resolves, never NOT_HOLDER", async () => {
  const proxy = await Proxy.start(ADDRESS);
  try {
    await using client = new LockClient(proxy.address);
    await using other = new LockClient(ADDRESS);
    const name = lockName("release-lost");
    const held = await client.acquire(name, { ttl: 10 });
    const waiting = other.acquire(name, { ttl: 10, timeout: 30 });
    proxy.dropDown();
    const releasing = held.release();
    // The other client's grant: the Release was applied, and its answer dropped.
    const next = await within(waiting, 20_000, "the waiter's grant after the Release");
    assert.equal(held.released, false, "the Release's answer reached the client through the proxy");
    proxy.cut();
    await within(releasing, 20_000, "the retried Release");
    assert.equal(held.released, true);
    assert.equal(held.lostReason, undefined);
    assert.ok(next.token > held.token);
    await next.release();
  } finally {
    await proxy.close();
  }
});

test("a Release never answered in time throws Unavailable with reason OUTCOME_UNKNOWN; a release called again settles it", async () => {
  const proxy = await Proxy.start(ADDRESS);
  try {
    await using client = new LockClient(proxy.address, { connectTimeout: 3 });
    const name = lockName("release-unknown");
    const held = await client.acquire(name, { ttl: 30 });
    proxy.dropDown();
    const started = performance.now();
    const err = await held.release().then(() => assert.fail("a Release resolved with no answer"), (e: unknown) => e);
    assert.ok(err instanceof Unavailable, String(err));
    assert.equal(err.reason, REASON_OUTCOME_UNKNOWN, err.message);
    assert.match(err.message, /Release was sent but no answer said whether it was applied/);
    assert.equal(err.lockName, name);
    assert.ok(performance.now() - started < 10_000, `${performance.now() - started} ms`);
    assert.equal(held.released, false); // kept as held: the outcome is not known
    proxy.cut(); // new connections forward both ways
    await within(held.release(), 20_000, "the second release"); // the same request id: answered OK
    assert.equal(held.released, true);
    assert.equal((await client.describe(name)).held, false);
  } finally {
    await proxy.close();
  }
});
