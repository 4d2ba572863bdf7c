// Read-write locks (docs/rwlocks.md) through the TypeScript client: `read: true` on acquire, tryAcquire and withLock.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { InvalidArgument, LeaseLost, LockClient, LockHeld } from "../src/index.js";
import { LockMode, LockService } from "../src/gen/fencepost/v1/lock_pb.js";
import { ADDRESS, etcdDeletePrefix, lockName, settledYet, waitFor, within } from "./helpers.js";

test("two readers hold together; a writer waits for both and gets a larger token than each", async () => {
  await using a = new LockClient(ADDRESS);
  await using b = new LockClient(ADDRESS);
  await using w = new LockClient(ADDRESS);
  const name = lockName("readers");
  const r1 = await a.acquire(name, { ttl: 5, timeout: 5, read: true });
  const r2 = await b.acquire(name, { ttl: 5, timeout: 5, read: true });
  assert.equal(r1.read, true);
  assert.equal(r2.read, true);
  assert.ok(r1.isValid() && r2.isValid());
  assert.ok(r2.token > r1.token, `each reader has its own token: ${r2.token} > ${r1.token}`);
  assert.deepEqual((await a.describe(name)).readers, [r1.leaseId, r2.leaseId]);
  await assert.rejects(w.tryAcquire(name, { ttl: 5 }), LockHeld);
  const writing = w.acquire(name, { ttl: 5, timeout: 10 });
  const queued = async () => {
    const info = await a.describe(name);
    return info.waiterCount === 1 && info.readers.length === 2; // both readers hold; the writer is the waiter
  };
  await waitFor(queued, "the writer queued behind the readers");
  await r1.release();
  await waitFor(async () => (await a.describe(name)).holderLeaseId === r2.leaseId, "the second reader left holding");
  assert.equal(await settledYet(writing), false, "the writer was granted beside a reader");
  assert.ok(r2.isValid(), "a reader's hold was reported lost");
  await r2.release();
  const writer = await writing;
  assert.equal(writer.read, false);
  assert.ok(writer.token > r1.token && writer.token > r2.token, `${writer.token} > ${r1.token}, ${r2.token}`);
  assert.deepEqual((await a.describe(name)).readers, []);
  await writer.release();
});

test("a reader asked after a waiting writer waits for it (writer preference); tryAcquire read is refused", async () => {
  await using a = new LockClient(ADDRESS);
  await using w = new LockClient(ADDRESS);
  await using c = new LockClient(ADDRESS);
  await using d = new LockClient(ADDRESS);
  const name = lockName("writer-first");
  const first = await a.acquire(name, { ttl: 5, read: true });
  const writing = w.acquire(name, { ttl: 5, timeout: 10 });
  await waitFor(async () => (await a.describe(name)).waiterCount >= 1, "the writer queued");
  const lateReading = c.acquire(name, { ttl: 5, timeout: 10, read: true });
  await waitFor(async () => (await a.describe(name)).waiterCount >= 2, "the late reader queued");
  const refused = await d.tryAcquire(name, { ttl: 5, read: true }).then(() => assert.fail("granted"), (e: unknown) => e);
  assert.ok(refused instanceof LockHeld, String(refused));
  assert.equal(await settledYet(lateReading), false, "a reader was granted past a waiting writer");
  await first.release();
  const writer = await writing;
  assert.equal(await settledYet(lateReading), false, "a reader was granted beside the writer");
  assert.equal((await a.describe(name)).holderLeaseId, writer.leaseId);
  await writer.release();
  const late = await lateReading;
  assert.ok(late.read && late.token > writer.token, `${late.token} > ${writer.token}`);
  await late.release();
});

test("withLock and tryAcquire take read holds; a read and a write hold of one name are apart in one client", async () => {
  await using a = new LockClient(ADDRESS);
  const name = lockName("with-read");
  const got = await a.withLock(name, { ttl: 5, timeout: 5, read: true }, async (handle) => {
    assert.equal(handle.read, true);
    const again = await a.tryAcquire(name, { ttl: 6, read: true }); // another TTL: another lease, another reader
    assert.deepEqual((await a.describe(name)).readers, [handle.leaseId, again.leaseId]);
    await again.release();
    return handle.token;
  });
  assert.ok(got > 0n);
  assert.equal((await a.describe(name)).held, false);
  // A write hold after the read hold, same client and TTL: the read slot is not the write slot.
  const writer = await a.tryAcquire(name, { ttl: 5 });
  assert.equal(writer.read, false);
  await writer.release();
});

test("a read hold is watched as one: its key withdrawn, it is lost with NOT_HOLDER", async () => {
  await using a = new LockClient(ADDRESS);
  const name = lockName("read-lost");
  const reader = await a.acquire(name, { ttl: 5, read: true });
  const raw = createClient(LockService, createGrpcTransport({ baseUrl: `http://${ADDRESS}` }));
  const owner = { headers: { "fencepost-lease-secret": reader.leaseSecret } };
  const resp = await raw.withdraw({ name, leaseId: reader.leaseId, mode: LockMode.READ }, owner);
  assert.equal(resp.found && resp.held, true);
  const lost = await within(reader.lost, 4000, "the read hold's loss reported");
  assert.ok(lost instanceof LeaseLost);
  assert.equal(lost.reason, "NOT_HOLDER");
  assert.equal(reader.signal.aborted, true);
  await assert.rejects(reader.release(), LeaseLost);
});

test("a read hold with a lockDelay, or a bad read or lockDelay, is refused before any call, naming the option", async () => {
  const offline = new LockClient("127.0.0.1:1"); // nothing listens: a call would fail with Unavailable
  const name = lockName("bad-read");
  const field = async (p: Promise<unknown>): Promise<string | undefined> => {
    const err = await p.then(() => assert.fail("accepted"), (e: unknown) => e);
    assert.ok(err instanceof InvalidArgument, String(err));
    return err.field;
  };
  assert.equal(await field(offline.acquire(name, { read: true, lockDelay: 2 })), "lockDelay");
  assert.equal(await field(offline.tryAcquire(name, { read: true, lockDelay: 0.5 })), "lockDelay");
  assert.equal(await field(offline.withLock(name, { read: true, lockDelay: 1 }, () => 0)), "lockDelay");
  assert.equal(await field(offline.acquire(name, { lockDelay: -1 })), "lockDelay");
  assert.equal(await field(offline.acquire(name, { lockDelay: 3601 })), "lockDelay");
  assert.equal(await field(offline.acquire(name, { read: "yes" as unknown as boolean })), "read");
  const message = await offline.acquire(name, { read: true, lockDelay: 2 }).catch((e: Error) => e.message);
  assert.match(String(message), /read hold takes no lockDelay/);
  await offline.close();
});

test("a write hold's lockDelay reaches the coordinator: its lease revoked, the lock is held back that long", async () => {
  await using a = new LockClient(ADDRESS);
  const name = lockName("lock-delay");
  const held = await a.acquire(name, { ttl: 5, lockDelay: 2.5 });
  const raw = createClient(LockService, createGrpcTransport({ baseUrl: `http://${ADDRESS}` }));
  await raw.leaseRevoke({ leaseId: held.leaseId }, { headers: { "fencepost-lease-secret": held.leaseSecret } });
  try {
    await held.lost;
    await waitFor(async () => (await a.listLocks(name)).some((l) => l.lockDelay === 3), "the lock-delay listed");
  } finally {
    await etcdDeletePrefix(`!delay!${encodeURIComponent(name)}`); // a lost hold's record is on no lease
  }
});
