/**
 * Storage fencing guards: `@fencepost/client/fencing`. The guard refuses a
 * write whose fencing token is lower than the highest the record has
 * accepted, in the same statement as the write.
 *
 * @module
 */

export { MalformedTokenError, PgGuard, TOKEN_COLUMN, updateStatement, updateWithFencing, upsertStatement, type PgGuardOptions, type Queryable } from "./pg.js";
export { MissingRecordError, StaleTokenError } from "../errors.js";
export { REASON_TOKEN_AHEAD, StoredTokenAheadError, type TokenHold } from "./ahead.js";
