// Paused holders: a lock holder frozen (SIGSTOP) past its TTL wakes up and
// writes with its old token; the guard refuses the write. Across languages:
// a Python holder and a Node holder of one lock, each one's stale write
// refused by the other's guard (Python SqlGuard, TS PgGuard, same table).
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { LockClient } from "../src/index.js";
import { PgGuard } from "../src/fencing/index.js";
import { ADDRESS, freshTable, lockName, nodeWorker, pool, pythonWorker, row, type Child } from "./helpers.js";

const db = pool();
after(() => db.end());

async function stopped<T>(child: Child, fn: () => Promise<T>): Promise<T> {
  child.signal("SIGSTOP");
  try {
    return await fn();
  } finally {
    child.signal("SIGCONT");
  }
}

test("a Node worker frozen past its TTL: its late fenced write is refused by the pg guard", async () => {
  const name = lockName("paused");
  const table = await freshTable(db);
  const worker = nodeWorker(name, table, 2);
  await using client = new LockClient(ADDRESS);
  try {
    const old = BigInt((await worker.line(/^acquired (\d+)$/))[1]!);
    const handle = await stopped(worker, async () => {
      // Granted only once the frozen worker's lease has expired in etcd.
      const h = await client.acquire(name, { ttl: 2, timeout: 20 });
      assert.ok(h.token > old, `${h.token} > ${old}`);
      await new PgGuard(db, table, "id").updateWithFencing(1, { val: "new holder" }, h.token);
      return h;
    });
    worker.send("write stale");
    const refused = BigInt((await worker.line(/^(?:refused|accepted) ?(\d*)$/))[1] || "0");
    assert.equal(refused, handle.token, "the stale write was not refused with the new holder's token");
    assert.deepEqual(await row(db, table), { val: "new holder", token: handle.token });
    await handle.release();
  } finally {
    await worker.kill();
  }
});

test("Python and Node holders of one lock: increasing tokens, each one's stale write refused by the other's guard", async () => {
  const name = lockName("cross");
  const table = await freshTable(db);
  const guard = new PgGuard(db, table, "id");
  await using client = new LockClient(ADDRESS);
  const children: Child[] = [];
  try {
    // 1. Python holds, freezes; the Node client takes over and writes with the TS guard.
    const py = pythonWorker(name, table, 2);
    children.push(py);
    const pyToken = BigInt((await py.line(/^acquired (\d+)$/, 30_000))[1]!);
    const nodeHandle = await stopped(py, async () => {
      const h = await client.acquire(name, { ttl: 2, timeout: 20 });
      await guard.updateWithFencing(1, { val: "node" }, h.token);
      return h;
    });
    assert.ok(nodeHandle.token > pyToken, `node ${nodeHandle.token} > python ${pyToken}`);
    py.send("write python-stale");
    const pyRefused = (await py.line(/^(refused|accepted) ?(\d*)$/))
    assert.equal(pyRefused[1], "refused", "Python's SqlGuard accepted a stale write");
    assert.equal(BigInt(pyRefused[2]!), nodeHandle.token);
    assert.deepEqual(await row(db, table), { val: "node", token: nodeHandle.token });
    await nodeHandle.release();

    // 2. A Node worker holds, freezes; a Python holder takes over and writes with SqlGuard.
    const worker = nodeWorker(name, table, 2);
    children.push(worker);
    const workerToken = BigInt((await worker.line(/^acquired (\d+)$/))[1]!);
    assert.ok(workerToken > nodeHandle.token);
    const py2Token = await stopped(worker, async () => {
      const py2 = pythonWorker(name, table, 2);
      children.push(py2);
      const token = BigInt((await py2.line(/^acquired (\d+)$/, 30_000))[1]!);
      py2.send("write python");
      await py2.line(/^accepted$/);
      return token;
    });
    assert.ok(py2Token > workerToken, `python ${py2Token} > node ${workerToken}`);
    worker.send("write node-stale");
    const nodeRefused = await worker.line(/^(refused|accepted) ?(\d*)$/);
    assert.equal(nodeRefused[1], "refused", "the TS guard accepted a stale write");
    assert.equal(BigInt(nodeRefused[2]!), py2Token);
    assert.deepEqual(await row(db, table), { val: "python", token: py2Token });
  } finally {
    await Promise.all(children.map((c) => c.kill()));
  }
});
