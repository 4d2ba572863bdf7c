// TLS to a coordinator serving TLS (certificates made by tests/test_typescript.py with trustme).
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { LockClient, TlsError } from "../src/index.js";
import { coordinator, lockName } from "./helpers.js";

const dir = process.env["FENCEPOST_TLS_DIR"]!;

test("TLS: a client trusting the coordinator's CA takes a lock; one trusting another CA gets TlsError at once", async () => {
  const server = coordinator(0, ["--tls-cert", join(dir, "server.pem"), "--tls-key", join(dir, "server-key.pem")]);
  try {
    const port = Number((await server.line(/listening on \S+:(\d+)/, 30_000))[1]);
    await using client = new LockClient(`127.0.0.1:${port}`, { tls: { ca: join(dir, "ca.pem") } });
    const handle = await client.acquire(lockName("tls"), { ttl: 2, timeout: 5 });
    assert.ok(handle.token > 0n);
    await handle.release();
    await using named = new LockClient(`127.0.0.1:${port}`, { tls: { ca: join(dir, "ca.pem"), serverName: "localhost" } });
    await (await named.acquire(lockName("tls-name"), { ttl: 2 })).release();
    await using stranger = new LockClient(`127.0.0.1:${port}`, { tls: { ca: join(dir, "other-ca.pem") }, connectTimeout: 30 });
    const started = performance.now();
    const err = await stranger.acquire(lockName("tls-bad"), { ttl: 2 }).then(() => assert.fail("granted"), (e: unknown) => e);
    assert.ok(err instanceof TlsError, String(err));
    assert.ok(performance.now() - started < 10_000, "TlsError waited for connectTimeout");
  } finally {
    await server.kill();
  }
});
