// An HTTP service that takes a lock and does a fenced write.
//
//   PUT /invoices/ID  {"total": 1234}
//
// takes the lock "invoice:ID" (TTL 10 s, waiting up to 5 s), then writes the
// invoice row through PgGuard with the grant's fencing token: one
// conditional upsert that PostgreSQL refuses if a newer holder of the lock
// has written the row already. Answers 200 {"id", "total", "token"}, 409 when
// the write was refused as stale, 503 when the lock was not granted in time
// or the hold was lost, 400 for bad input.
//
// Run (a coordinator on 127.0.0.1:7420, PostgreSQL from the PG* variables):
//   FENCEPOST_ADDRESS=127.0.0.1:7420 PGHOST=127.0.0.1 PGUSER=postgres PORT=8080 \
//     node dist/examples/invoice-service.js
//   curl -X PUT -d '{"total": 1234}' http://127.0.0.1:8080/invoices/42
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import pg from "pg";
import { FencepostError, InvalidArgument, LeaseLost, LockClient, LockTimeout, StaleTokenError } from "../src/index.js";
import { PgGuard } from "../src/fencing/index.js";

const TABLE = process.env["INVOICE_TABLE"] ?? "fencepost_example_invoices";
const client = new LockClient(process.env["FENCEPOST_ADDRESS"] ?? "127.0.0.1:7420");
const db = new pg.Pool({ max: 8 });
await db.query(
  `CREATE TABLE IF NOT EXISTS "${TABLE}" (id BIGINT PRIMARY KEY, total BIGINT NOT NULL, fencing_token BIGINT)`,
);
const guard = new PgGuard(db, TABLE, "id");

function reply(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body, (_key, value: unknown) => (typeof value === "bigint" ? value.toString() : value)));
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return JSON.parse(Buffer.concat(chunks).toString("utf8") || "null");
}

async function putInvoice(id: string, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const body = (await readJson(req)) as { total?: unknown } | null;
  const total = body?.total;
  if (typeof total !== "number" || !Number.isSafeInteger(total)) {
    throw new InvalidArgument("total must be an integer", { field: "total" });
  }
  const token = await client.withLock(`invoice:${id}`, { ttl: 10, timeout: 5 }, async (handle, signal) => {
    // ... slow work under the lock would go here, passing `signal` along ...
    signal.throwIfAborted();
    await guard.upsertWithFencing(id, { total }, handle.token);
    return handle.token;
  });
  reply(res, 200, { id, total, token });
}

const server = createServer((req, res) => {
  const match = /^\/invoices\/([0-9]{1,18})$/.exec(req.url ?? "");
  if (req.method !== "PUT" || match === null) {
    reply(res, 404, { error: "PUT /invoices/ID" });
    return;
  }
  putInvoice(match[1]!, req, res).catch((err: unknown) => {
    if (err instanceof StaleTokenError) reply(res, 409, { error: err.message, currentToken: err.currentToken });
    else if (err instanceof LockTimeout || err instanceof LeaseLost) reply(res, 503, { error: err.message });
    else if (err instanceof InvalidArgument || err instanceof SyntaxError) reply(res, 400, { error: err.message });
    else if (err instanceof FencepostError) reply(res, 503, { error: err.message });
    else reply(res, 500, { error: String(err) });
  });
});

server.listen(Number(process.env["PORT"] ?? 8080), "127.0.0.1", () => {
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  console.log(`invoice service listening on http://127.0.0.1:${port}`);
});

for (const sig of ["SIGINT", "SIGTERM"] as const) {
  process.once(sig, () => {
    server.close();
    void Promise.all([client.close(), db.end()]).then(() => process.exit(0));
  });
}
