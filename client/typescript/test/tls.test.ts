// TLS to a coordinator serving TLS (certificates made by tests/test_typescript.py with trustme),
// and client certificate files renewed on disk.
import { test } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, mkdirSync, mkdtempSync, renameSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
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

test("mTLS: client files renewed on disk (a ..data symlink swap) are used after a coordinator restart; the hold survives", async () => {
  const files = mkdtempSync(join(tmpdir(), "fencepost-tls-"));
  const install = (tag: string): void => {
    mkdirSync(join(files, `..${tag}`));
    copyFileSync(join(dir, `client-${tag}.pem`), join(files, `..${tag}`, "cert.pem"));
    copyFileSync(join(dir, `client-${tag}-key.pem`), join(files, `..${tag}`, "key.pem"));
    symlinkSync(`..${tag}`, join(files, "..data_tmp"));
    renameSync(join(files, "..data_tmp"), join(files, "..data"));
  };
  install("a");
  symlinkSync("..data/cert.pem", join(files, "cert.pem"));
  symlinkSync("..data/key.pem", join(files, "key.pem"));
  const serving = (clientCa: string): string[] => [
    "--tls-cert", join(dir, "server.pem"), "--tls-key", join(dir, "server-key.pem"), "--client-ca", join(dir, clientCa)];
  let server = coordinator(0, serving("client-ca-a.pem"));
  const children = [server];
  try {
    const port = Number((await server.line(/listening on \S+:(\d+)/, 30_000))[1]);
    await using client = new LockClient(`127.0.0.1:${port}`, {
      tls: { ca: join(dir, "ca.pem"), cert: join(files, "cert.pem"), key: join(files, "key.pem") }, connectTimeout: 20,
    });
    const name = lockName("tls-rotate");
    const handle = await client.acquire(name, { ttl: 4, timeout: 10 });
    const firstDeadline = handle.deadline;
    install("b"); // renewed, by another CA: only the new files pass the restarted coordinator's --client-ca
    server.signal("SIGKILL");
    await server.kill();
    server = coordinator(port, serving("client-ca-b.pem"));
    children.push(server);
    await server.line(/listening on/, 30_000);
    assert.equal((await client.describe(name)).token, handle.token);
    while (handle.deadline <= firstDeadline + 1) {
      assert.ok(handle.isValid(), `the hold was lost across the restart: ${handle.lostReason}`);
      await Promise.race([handle.lost, new Promise((r) => setTimeout(r, 50))]);
    }
    assert.ok(handle.isValid());
    await handle.release();
  } finally {
    await Promise.all(children.map((c) => c.kill()));
  }
});
