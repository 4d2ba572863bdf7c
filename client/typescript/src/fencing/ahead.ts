/**
 * Tokens ahead of the lock service: a write refused although its writer still holds its lock (the Python
 * guards' `fencepost.client.fencing._ahead`).
 *
 * A guard refuses a write with token `t` when the row has accepted a higher token `s`. Normally `s` came from a
 * later holder: the writer lost the lock (a pause past its TTL). But while the writer's hold is live no later
 * holder of that lock exists, and every earlier one had a lower token; so `s > t` under a live hold means the row
 * holds a token the lock service has not reached yet. Most likely etcd was restored from an older snapshot
 * without `fencepost admin recover-tokens`, and every new holder is refused until the tokens pass `s` again;
 * else the row is written under another lock name. The guard then throws {@link StoredTokenAheadError} and
 * counts it in `ahead` besides `rejected`, so that an alert can fire.
 *
 * The guard knows the hold is live when it is given the lock handle (anything with `token` and `isValid()`, a
 * {@link TokenHold}) in place of the token: after a refusal it asks `isValid()` (the handle's conservative local
 * deadline has not passed, so the lease lived from the grant to the refusal). A bare `bigint` token carries no
 * such knowledge: its refusal is always a plain {@link StaleTokenError}.
 *
 * @module
 */

import { InvalidArgument, StaleTokenError } from "../errors.js";
import { checkToken } from "../validate.js";

/** The client-local reason of {@link StoredTokenAheadError}. */
export const REASON_TOKEN_AHEAD = "TOKEN_AHEAD";

/** What a guard takes in place of a token to tell a rewind from a stale writer: a {@link LockHandle}, or any object with these. */
export interface TokenHold {
  /** The hold's fencing token. */
  readonly token: bigint;
  /** Whether the hold is still believed live (its local deadline has not passed). */
  isValid(): boolean;
}

/**
 * A guard refused a write whose writer still held its lock: the row's token is ahead of the lock service.
 * Thrown instead of a plain {@link StaleTokenError} (which it extends) when the write came with a live hold.
 * Most likely etcd's revisions went back (a restore from an older snapshot) without
 * `fencepost admin recover-tokens --above T`, T at least `currentToken`. Counted in `rejected` and `ahead`.
 */
export class StoredTokenAheadError extends StaleTokenError {
  constructor(message: string, fields: { record?: unknown; token: bigint; currentToken: bigint }) {
    super(message, { ...fields, reason: REASON_TOKEN_AHEAD });
  }
}

/**
 * The token a write carries, and the hold it came with.
 *
 * @throws {@link InvalidArgument} neither a bigint token nor a hold, or the token is not 1 to 2**63-1 (field `token`).
 */
export function writerToken(token: bigint | TokenHold): { token: bigint; hold: TokenHold | undefined } {
  if (typeof token === "bigint") return { token: checkToken(token), hold: undefined };
  if (token === null || typeof token !== "object" || typeof (token as TokenHold).isValid !== "function") {
    throw new InvalidArgument(`token must be a bigint fencing token or a lock handle, not ${typeof token}`, {
      field: "token",
    });
  }
  return { token: checkToken((token as TokenHold).token), hold: token };
}

/** Whether `hold` says it is still live (false for undefined, and when `isValid()` throws). */
export function isLive(hold: TokenHold | undefined): boolean {
  if (hold === undefined) return false;
  try {
    return hold.isValid() === true;
  } catch {
    return false;
  }
}

/** The message of a {@link StoredTokenAheadError}: both tokens, the likely causes and the fix. */
export function aheadMessage(what: string, token: bigint, currentToken: bigint): string {
  return (
    `${what} refused: token ${token} < stored ${currentToken}, although this writer still holds its lock: the ` +
    `stored token is ahead of the lock service. etcd was probably restored from an older snapshot without ` +
    `'fencepost admin recover-tokens --above T' (T at least ${currentToken}; docs/deploy.md, 'Restoring etcd ` +
    `from a snapshot'), or the row is also written under another lock name`
  );
}
