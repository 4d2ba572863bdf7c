// Shared helpers of the Node tests: the servers the pytest harness started
// (tests/test_typescript.py passes them in FENCEPOST_* and PG* variables),
// child processes driven line by line, and PostgreSQL tables.
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { randomUUID } from "node:crypto";
import pg from "pg";

function required(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these tests through tests/test_typescript.py`);
  return value;
}

/** The coordinator's address. */
export const ADDRESS = required("FENCEPOST_ADDRESS");

/** A fresh lock name. */
export function lockName(what: string): string {
  return `ts:${what}:${randomUUID()}`;
}

/** A child process whose stdout is read line by line; lines are awaited, never slept for. */
export class Child {
  readonly proc: ChildProcess;
  private readonly lines: string[] = [];
  private readonly waiters: (() => void)[] = [];
  readonly output: string[] = [];
  exited = false;

  constructor(argv: string[], env: Record<string, string> = {}) {
    this.proc = spawn(argv[0]!, argv.slice(1), { env: { ...process.env, ...env }, stdio: ["pipe", "pipe", "pipe"] });
    createInterface({ input: this.proc.stdout! }).on("line", (line) => {
      this.output.push(line);
      this.lines.push(line);
      for (const wake of this.waiters.splice(0)) wake();
    });
    this.proc.stderr!.on("data", (chunk: Buffer) => this.output.push(`stderr: ${chunk.toString().trimEnd()}`));
    this.proc.on("exit", () => {
      this.exited = true;
      for (const wake of this.waiters.splice(0)) wake();
    });
  }

  /** The next line matching `pattern` (earlier unmatched lines are skipped), within `timeoutMs`. */
  async line(pattern: RegExp, timeoutMs = 20_000): Promise<RegExpMatchArray> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      while (this.lines.length > 0) {
        const match = this.lines.shift()!.match(pattern);
        if (match) return match;
      }
      if (this.exited) throw new Error(`child exited before ${pattern}:\n${this.output.join("\n")}`);
      const left = until - Date.now();
      if (left <= 0) throw new Error(`no line ${pattern} within ${timeoutMs} ms:\n${this.output.join("\n")}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  send(line: string): void {
    this.proc.stdin!.write(`${line}\n`);
  }

  signal(sig: NodeJS.Signals): void {
    this.proc.kill(sig);
  }

  /** SIGCONT then SIGKILL, and wait for the exit. */
  async kill(): Promise<void> {
    if (this.exited) return;
    const gone = new Promise((resolve) => this.proc.once("exit", resolve));
    this.proc.kill("SIGCONT");
    this.proc.kill("SIGKILL");
    await gone;
  }
}

/** A pg pool on the test's PostgreSQL (PGHOST, PGPORT, PGUSER, PGDATABASE). */
export function pool(): pg.Pool {
  return new pg.Pool({ max: 4 });
}

/** A fresh table `(id BIGINT PRIMARY KEY, val TEXT, fencing_token BIGINT)` with one row id 1 and no token. */
export async function freshTable(db: pg.Pool): Promise<string> {
  const table = `ts_${randomUUID().replaceAll("-", "")}`;
  await db.query(`CREATE TABLE "${table}" (id BIGINT PRIMARY KEY, val TEXT, fencing_token BIGINT)`);
  await db.query(`INSERT INTO "${table}" (id, val) VALUES (1, 'initial')`);
  return table;
}

/** The row id 1 of a table: its value and token. */
export async function row(db: pg.Pool, table: string): Promise<{ val: string; token: bigint | null }> {
  const result = await db.query(`SELECT val, fencing_token::text AS token FROM "${table}" WHERE id = 1`);
  const r = result.rows[0] as { val: string; token: string | null };
  return { val: r.val, token: r.token === null ? null : BigInt(r.token) };
}

/** A Node worker holding a lock (test/worker.ts), driven by lines. */
export function nodeWorker(name: string, table: string, ttl = 2): Child {
  return new Child([process.execPath, new URL("./worker.js", import.meta.url).pathname, ADDRESS, name, String(ttl), table]);
}

/** A Python worker holding a lock with the Python client and SqlGuard (tests/ts_peer.py), driven by lines. */
export function pythonWorker(name: string, table: string, ttl = 2): Child {
  return new Child([required("FENCEPOST_PYTHON"), required("FENCEPOST_PY_PEER"), ADDRESS, name, String(ttl), table]);
}

/** A coordinator process of the test's etcd and prefix, on `port` (0: any). */
export function coordinator(port: number, extra: string[] = []): Child {
  const python = process.env["FENCEPOST_PYTHON"]!;
  return new Child([
    python, "-m", "fencepost.client.cli", "serve",
    "--listen", `127.0.0.1:${port}`,
    "--etcd-endpoints", process.env["FENCEPOST_ETCD_ENDPOINT"]!,
    "--prefix", process.env["FENCEPOST_PREFIX"]!,
    "--grace-seconds", "0.2",
    ...extra,
  ]);
}

/** The ids of every lease in the test's etcd (its JSON gateway, POST /v3/lease/leases). */
export async function etcdLeaseIds(): Promise<Set<bigint>> {
  const endpoint = required("FENCEPOST_ETCD_ENDPOINT");
  const resp = await fetch(`http://${endpoint}/v3/lease/leases`, { method: "POST", body: "{}" });
  if (!resp.ok) throw new Error(`etcd lease list: HTTP ${resp.status} ${await resp.text()}`);
  const body = (await resp.json()) as { leases?: { ID: string }[] };
  return new Set((body.leases ?? []).map((l) => BigInt(l.ID)));
}

/** Wait until `check()` holds, asking again every 20 ms (a coordinator state seen through Describe), 4 s at most. */
export async function waitFor(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; !(await check()); i++) {
    if (i >= 200) throw new Error(`${what}: not seen within 4 s`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Whether `promise` has settled (looked at after the pending callbacks ran). */
export async function settledYet(promise: Promise<unknown>): Promise<boolean> {
  let done = false;
  promise.then(() => { done = true; }, () => { done = true; });
  await new Promise((r) => setImmediate(r));
  return done;
}

/** POST to etcd's JSON gateway `/v3/kv/<op>` for every key under `FENCEPOST_PREFIX + suffix`; its JSON answer. */
async function etcdPrefixCall(op: "range" | "deleterange", suffix: string): Promise<unknown> {
  const key = Buffer.from(required("FENCEPOST_PREFIX") + suffix);
  const end = Buffer.from(key);
  end[end.length - 1]! += 1; // the range end of a prefix (its last byte is never 0xff here: ASCII keys)
  const endpoint = required("FENCEPOST_ETCD_ENDPOINT");
  const body = JSON.stringify({ key: key.toString("base64"), range_end: end.toString("base64") });
  const resp = await fetch(`http://${endpoint}/v3/kv/${op}`, { method: "POST", body });
  if (!resp.ok) throw new Error(`etcd ${op}: HTTP ${resp.status} ${await resp.text()}`);
  return resp.json();
}

/** Delete every etcd key under `FENCEPOST_PREFIX + suffix` (its JSON gateway, POST /v3/kv/deleterange). */
export async function etcdDeletePrefix(suffix: string): Promise<void> {
  await etcdPrefixCall("deleterange", suffix);
}

/** Every etcd key under `FENCEPOST_PREFIX + suffix` with its value, as text (its JSON gateway, POST /v3/kv/range). */
export async function etcdRange(suffix: string): Promise<{ key: string; value: string }[]> {
  const body = (await etcdPrefixCall("range", suffix)) as { kvs?: { key: string; value?: string }[] };
  const text = (b64: string | undefined): string => Buffer.from(b64 ?? "", "base64").toString();
  return (body.kvs ?? []).map((kv) => ({ key: text(kv.key), value: text(kv.value) }));
}

/** `promise`, or an Error naming `what` after `ms` milliseconds (a test fails rather than hangs). */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}
