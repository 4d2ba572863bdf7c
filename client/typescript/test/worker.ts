// A lock holder in its own process, for the paused-holder tests: takes the
// lock given on the command line, prints "acquired TOKEN", then on each
// "write VALUE" line does a fenced write of row 1 with its token through
// PgGuard and prints "accepted" or "refused CURRENT_TOKEN". It never checks
// its hold before writing: it plays a holder that was frozen past its TTL
// and does not know it.
import { createInterface } from "node:readline";
import pg from "pg";
import { LockClient, StaleTokenError } from "../src/index.js";
import { PgGuard } from "../src/fencing/index.js";

const [address, name, ttl, table] = process.argv.slice(2) as [string, string, string, string];
const client = new LockClient(address);
const db = new pg.Pool({ max: 1 });
const guard = new PgGuard(db, table, "id");
const handle = await client.acquire(name, { ttl: Number(ttl), timeout: 30 });
console.log(`acquired ${handle.token}`);
for await (const line of createInterface({ input: process.stdin })) {
  const [command, value] = line.split(" ");
  if (command === "write") {
    try {
      await guard.updateWithFencing(1, { val: value }, handle.token);
      console.log("accepted");
    } catch (err) {
      if (!(err instanceof StaleTokenError)) throw err;
      console.log(`refused ${err.currentToken}`);
    }
  } else if (command === "exit") {
    break;
  }
}
await db.end();
await client.close();
