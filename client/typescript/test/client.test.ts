// The lock client against a real coordinator (on a real etcd).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  InvalidArgument,
  LeaseLost,
  LockClient,
  LockHeld,
  LockTimeout,
  NotHolder,
  PermissionDenied,
  StaleTokenError,
  Unavailable,
} from "../src/index.js";
import { fromConnectError } from "../src/errors.js";
import { LockService } from "../src/gen/fencepost/v1/lock_pb.js";
import { ADDRESS, lockName } from "./helpers.js";

test("acquire gives a bigint token and lease id; release frees the lock; the next holder's token is larger", async () => {
  await using client = new LockClient(ADDRESS);
  const name = lockName("acquire");
  const first = await client.acquire(name, { ttl: 5, timeout: 5 });
  assert.equal(typeof first.token, "bigint");
  assert.equal(typeof first.leaseId, "bigint");
  assert.ok(first.token > 0n && first.leaseId > 0n);
  assert.ok(first.ttl >= 5);
  assert.ok(first.isValid());
  assert.ok(first.validFor() > 3 && first.validFor() <= 5, `validFor ${first.validFor()}`);
  assert.equal((await client.describe(name)).token, first.token);
  await first.release();
  assert.equal(first.isValid(), false);
  assert.equal(first.validFor(), 0);
  assert.equal((await client.describe(name)).held, false);
  const second = await client.acquire(name, { ttl: 5 });
  assert.ok(second.token > first.token, `${second.token} > ${first.token}`);
  await assert.rejects(first.release(), NotHolder);
  await second.release();
});

test("tryAcquire throws LockHeld naming the holder; a blocking acquire times out with LockTimeout", async () => {
  await using a = new LockClient(ADDRESS);
  await using b = new LockClient([ADDRESS]);
  const name = lockName("held");
  const held = await a.acquire(name, { ttl: 5 });
  const err = await b.tryAcquire(name, { ttl: 5 }).then(
    () => assert.fail("tryAcquire got a held lock"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof LockHeld, String(err));
  assert.equal(err.holderToken, held.token);
  assert.equal(err.holderLeaseId, held.leaseId);
  assert.equal(err.lockName, name);
  assert.equal(err.reason, "LOCK_HELD");
  const started = performance.now();
  await assert.rejects(b.acquire(name, { ttl: 5, timeout: 0.3 }), LockTimeout);
  assert.ok(performance.now() - started < 3000);
  // The same client under the same TTL: held locally.
  await assert.rejects(a.tryAcquire(name, { ttl: 5 }), LockHeld);
  await held.release();
  const mine = await b.tryAcquire(name, { ttl: 5 });
  assert.ok(mine.token > held.token);
});

test("a waiter is granted when the holder releases, and an aborted waiter leaves no place in the queue", async () => {
  await using a = new LockClient(ADDRESS);
  await using b = new LockClient(ADDRESS);
  await using c = new LockClient(ADDRESS);
  const name = lockName("wait");
  const held = await a.acquire(name, { ttl: 5 });
  const controller = new AbortController();
  const aborted = c.acquire(name, { ttl: 5, signal: controller.signal });
  const waiting = b.acquire(name, { ttl: 5, timeout: 10 });
  for (let i = 0; (await a.describe(name)).waiterCount < 2; i++) {
    assert.ok(i < 200, "the waiters never queued");
    await new Promise((r) => setTimeout(r, 20));
  }
  controller.abort(new Error("caller gave up"));
  await assert.rejects(aborted, /caller gave up/);
  // Withdrawn before the rejection settled (the coordinator alone would keep the key 2 s).
  assert.equal((await a.describe(name)).waiterCount, 1, "the aborted waiter is still queued");
  await held.release();
  const granted = await waiting;
  assert.ok(granted.token > held.token);
});

test("withLock runs fn under the lock, returns its value and releases", async () => {
  await using client = new LockClient(ADDRESS);
  const name = lockName("with");
  let seen = 0n;
  const value = await client.withLock(name, { ttl: 5, timeout: 5 }, async (handle, signal) => {
    assert.equal(signal, handle.signal);
    assert.equal(signal.aborted, false);
    seen = handle.token;
    assert.equal((await client.describe(name)).token, handle.token);
    return 42;
  });
  assert.equal(value, 42);
  assert.ok(seen > 0n);
  assert.equal((await client.describe(name)).held, false);
  await assert.rejects(
    client.withLock(name, { ttl: 5 }, () => {
      throw new RangeError("from fn");
    }),
    RangeError,
  );
  assert.equal((await client.describe(name)).held, false);
});

test("serverInfo reports the coordinator's version, prefix, etcd and counts", async () => {
  await using client = new LockClient(ADDRESS);
  const handle = await client.acquire(lockName("info"), { ttl: 10, timeout: 5 });
  let info = await client.serverInfo();
  for (let i = 0; info.keepaliveLeases < 1 || info.watchedHolds < 1; i++) {
    assert.ok(i < 200, "the stream's keepalive and watch never reached the coordinator");
    await new Promise((r) => setTimeout(r, 20));
    info = await client.serverInfo();
  }
  await handle.release();
  assert.match(info.version, /^\d+\.\d+/);
  assert.match(info.instanceId, /^[0-9a-f]{16}$/);
  assert.ok(info.uptime > 0);
  assert.equal(info.listenAddress, ADDRESS);
  assert.equal(info.keyPrefix, process.env["FENCEPOST_PREFIX"]);
  assert.deepEqual(info.etcd.endpoints, [process.env["FENCEPOST_ETCD_ENDPOINT"]]);
  assert.equal(info.etcd.available, true, info.etcd.error);
  assert.match(info.etcd.serverVersion ?? "", /^3\./);
  assert.equal(typeof info.etcd.clusterId, "bigint");
  assert.equal(info.etcd.leader, info.etcd.memberId);
  assert.ok((info.etcd.revision ?? 0n) >= handle.token);
  assert.ok(info.keepaliveStreams >= 1);
  assert.ok((info.heldLocks ?? 0) >= 1 && (info.contenderKeys ?? 0) >= (info.heldLocks ?? 0));
  const again = await client.serverInfo();
  assert.equal(again.instanceId, info.instanceId);
});

test("bad arguments throw InvalidArgument naming the field, before any call", async () => {
  const field = (f: string) => (err: unknown) => err instanceof InvalidArgument && err.field === f;
  assert.throws(() => new LockClient("nope"), field("address"));
  assert.throws(() => new LockClient("http://127.0.0.1:7420"), field("address"));
  assert.throws(() => new LockClient("127.0.0.1:0"), field("address"));
  assert.throws(() => new LockClient([]), field("address"));
  assert.throws(() => new LockClient("unix:relative.sock"), field("address"));
  assert.throws(() => new LockClient(ADDRESS, { connectTimeout: 0 }), field("connectTimeout"));
  assert.throws(() => new LockClient(ADDRESS, { keepaliveFraction: 0.9 }), field("keepaliveFraction"));
  assert.throws(() => new LockClient(ADDRESS, { tls: { ca: "/nonexistent/ca.pem" } }), field("tls.ca"));
  assert.throws(() => new LockClient(ADDRESS, { tls: { cert: "/nonexistent/c.pem" } }), field("tls.key"));
  // An unreachable port: nothing is contacted by bad input, so these must not wait.
  await using client = new LockClient("127.0.0.1:1", { connectTimeout: 30 });
  const started = performance.now();
  await assert.rejects(client.acquire(""), field("name"));
  await assert.rejects(client.acquire("a\nb"), field("name"));
  await assert.rejects(client.acquire("x".repeat(257)), field("name"));
  await assert.rejects(client.acquire("\ud800"), field("name"));
  // Unicode Cc, Cf, Zl and Zp: C1 controls, zero-width and bidirectional formatting, line and paragraph separators.
  for (const bad of ["a\u0085b", "a\u200bb", "a\u202eb", "a\u2028b", "a\u2029b", "a\ufeffb", "a\u{e0001}b"]) {
    await assert.rejects(client.acquire(bad), (err: unknown) => field("name")(err) && String(err).includes("U+"));
    await assert.rejects(client.listLocks(bad), field("prefix"));
  }
  await assert.rejects(client.acquire("\u{1f600}\u200b"), (err: unknown) => String(err).includes("character 1 is U+200B (Cf)"));
  await assert.rejects(client.acquire(42 as unknown as string), field("name"));
  await assert.rejects(client.acquire("n", { ttl: 0 }), field("ttl"));
  await assert.rejects(client.acquire("n", { ttl: Number.NaN }), field("ttl"));
  await assert.rejects(client.acquire("n", { ttl: 86_401 }), field("ttl"));
  await assert.rejects(client.acquire("n", { timeout: -1 }), field("timeout"));
  await assert.rejects(client.acquire("n", { timeout: Infinity }), field("timeout"));
  await assert.rejects(client.acquire("n", { signal: {} as AbortSignal }), field("signal"));
  await assert.rejects(client.withLock("n", {}, undefined as never), field("fn"));
  assert.ok(performance.now() - started < 1000);
});

test("no coordinator reachable: Unavailable after connectTimeout", async () => {
  await using client = new LockClient("127.0.0.1:1", { connectTimeout: 0.5 });
  const started = performance.now();
  await assert.rejects(client.acquire(lockName("down"), { ttl: 2 }), Unavailable);
  assert.ok(performance.now() - started < 5000);
});

test("the coordinator's ErrorInfo maps to typed errors: STALE_TOKEN, NOT_HOLDER, LEASE_EXPIRED, INVALID_FIELD, NOT_LEASE_OWNER", async () => {
  await using client = new LockClient(ADDRESS);
  const name = lockName("errors");
  const held = await client.acquire(name, { ttl: 5 });
  const raw = createClient(LockService, createGrpcTransport({ baseUrl: `http://${ADDRESS}` }));
  const failure = async (call: Promise<unknown>) => fromConnectError(await call.then(() => assert.fail("call succeeded"), (e: unknown) => e));
  const owner = { headers: { "fencepost-lease-secret": held.leaseSecret } }; // the raw calls act as the lease's owner
  const stale = await failure(raw.release({ name, leaseId: held.leaseId, token: held.token - 1n }, owner));
  assert.ok(stale instanceof StaleTokenError, String(stale));
  assert.equal(stale.currentToken, held.token);
  assert.equal(stale.lockName, name);
  assert.equal(stale.reason, "STALE_TOKEN");
  const notHolder = await failure(raw.release({ name: `${name}-other`, leaseId: held.leaseId, token: held.token }, owner));
  assert.ok(notHolder instanceof NotHolder, String(notHolder));
  const expired = await failure(raw.acquire({ name: `${name}-free`, leaseId: 12345n, waitMs: 0n }));
  assert.ok(expired instanceof LeaseLost, String(expired));
  const invalid = await failure(raw.leaseGrant({ ttlSeconds: 0n }));
  assert.ok(invalid instanceof InvalidArgument, String(invalid));
  assert.equal(invalid.field, "ttl_seconds");
  // Without the lease's secret, the lease is not the caller's: refused, nothing changes.
  const denied = await failure(raw.release({ name, leaseId: held.leaseId, token: held.token }));
  assert.ok(denied instanceof PermissionDenied, String(denied));
  assert.equal(denied.reason, "NOT_LEASE_OWNER");
  assert.equal(denied.leaseId, held.leaseId);
  assert.ok(!String(denied).includes(held.leaseSecret) && held.leaseSecret.length === 43);
  assert.ok(held.isValid());
  await held.release();
});

test("a frozen coordinator: the hold is lost at the local deadline (DEADLINE), withLock's signal aborts and it rejects with LeaseLost", async () => {
  const pid = Number(process.env["FENCEPOST_COORDINATOR_PID"]);
  assert.ok(pid > 0, "FENCEPOST_COORDINATOR_PID is not set");
  await using client = new LockClient(ADDRESS, { connectTimeout: 2 });
  const name = lockName("frozen");
  let frozenAt = 0;
  try {
    const outcome = client.withLock(name, { ttl: 2, timeout: 5 }, async (handle, signal) => {
      frozenAt = performance.now() / 1000;
      process.kill(pid, "SIGSTOP"); // no keepalive is acknowledged from now on
      const lost = await handle.lost;
      assert.equal(lost.reason, "DEADLINE");
      assert.ok(signal.aborted);
      assert.equal(signal.reason, lost);
      assert.equal(handle.isValid(), false);
      // The deadline is the send time of the last acknowledged keepalive + TTL - margin: within one TTL of the freeze.
      assert.ok(performance.now() / 1000 <= frozenAt + handle.ttl + 0.5);
      return "fn finished";
    });
    const err = await outcome.then(() => assert.fail("withLock resolved after a loss"), (e: unknown) => e);
    assert.ok(err instanceof LeaseLost, String(err));
    assert.equal(err.reason, "DEADLINE");
  } finally {
    process.kill(pid, "SIGCONT");
  }
  // The client reconnects and works again.
  const again = await client.acquire(lockName("after-freeze"), { ttl: 2, timeout: 10 });
  assert.ok(again.isValid());
  await again.release();
});
