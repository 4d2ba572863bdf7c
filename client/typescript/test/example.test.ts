// The example service (examples/invoice-service.ts) answers a PUT with a fenced write.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { Child, pool } from "./helpers.js";

const db = pool();
after(() => db.end());

test("examples/invoice-service: PUT /invoices/ID takes the lock and writes the row with its fencing token", async () => {
  const table = `ts_example_${randomUUID().replaceAll("-", "")}`;
  const service = new Child([process.execPath, new URL("../examples/invoice-service.js", import.meta.url).pathname], {
    PORT: "0",
    INVOICE_TABLE: table,
  });
  try {
    const url = (await service.line(/listening on (http:\S+)/))[1]!;
    const first = await fetch(`${url}/invoices/42`, { method: "PUT", body: JSON.stringify({ total: 1234 }) });
    assert.equal(first.status, 200, await first.clone().text());
    const body = (await first.json()) as { token: string };
    const second = await fetch(`${url}/invoices/42`, { method: "PUT", body: JSON.stringify({ total: 99 }) });
    const token2 = ((await second.json()) as { token: string }).token;
    assert.ok(BigInt(token2) > BigInt(body.token));
    const stored = await db.query(`SELECT total::text AS total, fencing_token::text AS token FROM "${table}" WHERE id = 42`);
    assert.deepEqual(stored.rows[0], { total: "99", token: token2 });
    const bad = await fetch(`${url}/invoices/42`, { method: "PUT", body: JSON.stringify({ total: "x" }) });
    assert.equal(bad.status, 400);
  } finally {
    await service.kill();
  }
});
