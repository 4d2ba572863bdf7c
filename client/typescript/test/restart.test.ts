// A coordinator restart: the client's KeepAlive stream reconnects and the
// hold survives, with its lease and fencing token unchanged (both live in etcd).
import { test } from "node:test";
import assert from "node:assert/strict";
import { LockClient } from "../src/index.js";
import { coordinator, lockName } from "./helpers.js";


test("a coordinator killed and restarted on its port: the hold keeps its lease and token, and stays valid past its TTL", async () => {
  let server = coordinator(0);
  const children = [server];
  try {
    const port = Number((await server.line(/listening on \S+:(\d+)/, 30_000))[1]);
    await using client = new LockClient(`127.0.0.1:${port}`, { connectTimeout: 20 });
    const name = lockName("restart");
    const handle = await client.acquire(name, { ttl: 4, timeout: 10 });
    const firstDeadline = handle.deadline;
    server.signal("SIGKILL");
    await server.kill();
    server = coordinator(port);
    children.push(server);
    await server.line(/listening on/, 30_000);
    // Describe retries until the new coordinator answers; then wait for an
    // acknowledged keepalive on the new stream to move the deadline on.
    assert.equal((await client.describe(name)).token, handle.token);
    while (handle.deadline <= firstDeadline + 1) {
      assert.ok(handle.isValid(), `the hold was lost across the restart: ${handle.lostReason}`);
      await Promise.race([handle.lost, new Promise((r) => setTimeout(r, 50))]);
    }
    assert.ok(handle.isValid());
    const info = await client.describe(name);
    assert.equal(info.holderLeaseId, handle.leaseId);
    assert.equal(info.token, handle.token);
    await handle.release();
  } finally {
    await Promise.all(children.map((c) => c.kill()));
  }
});
