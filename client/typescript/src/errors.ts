/**
 * The errors of Fencepost's TypeScript client: one tree, mapped from the
 * coordinator's gRPC status and its `google.rpc.ErrorInfo` reason exactly as
 * the Python client maps them (`fencepost.client.errors`):
 *
 * ```
 * FencepostError                 base class: .lockName .leaseId .reason .code
 *  ├── InvalidArgument           a bad name, TTL, timeout, token, address or identifier (.field)
 *  ├── LockHeld                  tryAcquire found the lock held (reason LOCK_HELD; .holderLeaseId, .holderToken)
 *  ├── LockTimeout               a blocking acquire ran out of time
 *  ├── LeaseLost                 the lease behind a hold is gone, or its local deadline passed
 *  ├── NotHolder                 the lease does not hold the lock (.token, .currentToken)
 *  ├── StaleTokenError           a token lower than the newest one: the lock is held under a
 *  │                             newer token, or a fencing guard refused a write
 *  │                             (.token, .currentToken, .record)
 *  ├── MissingRecordError        a guard's update found no such record (.record)
 *  ├── Unavailable               no coordinator, or etcd without quorum (.retryDelay); reason
 *  │                             OUTCOME_UNKNOWN: a Release was sent and no answer settled it in time
 *  │   ├── TlsError              the TLS handshake with every coordinator failed (.address, .cause)
 *  │   └── DataLoss              etcd's revisions went back (restored from an older snapshot)
 *  ├── ResourceExhausted         too many waiters, streams or calls
 *  └── PermissionDenied          the coordinator refuses this caller
 *      └── AccessDenied          its access policy does not let the caller's identity take this
 *                                action on this lock name (.action)
 * ```
 *
 * `err.name` is the class name, as for every JavaScript error; the lock name
 * is `err.lockName`.
 *
 * @module
 */

import { Code, ConnectError } from "@connectrpc/connect";
import { BinaryReader } from "@bufbuild/protobuf/wire";

/** The client-local reason of a hold lost because its local deadline passed (no acknowledged keepalive in time). */
export const REASON_DEADLINE = "DEADLINE";
/** The client-local reason of a hold that ended because its client was closed. */
export const REASON_CLOSED = "CLOSED";
/**
 * The client-local reason of an {@link Unavailable} thrown by a call that changes state (Release) when it was
 * sent, retried with its request id, and no answer said whether it was applied before its time ran out.
 */
export const REASON_OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN";

/** ErrorInfo domain of the coordinator's errors. */
export const ERROR_DOMAIN = "fencepost.dev";

/** What every error's constructor takes besides its message. */
export interface ErrorFields {
  /** The lock name concerned, when known. */
  lockName?: string | undefined;
  /** The lease id concerned, when known. */
  leaseId?: bigint | undefined;
  /** An ErrorReason name (`"NOT_HOLDER"`) or a client-local one (`"DEADLINE"`). */
  reason?: string | undefined;
  /** The gRPC status code (Connect's `Code`) when the error came from a server. */
  code?: Code | undefined;
  /** The underlying error. */
  cause?: unknown;
}

/** Base class of every error the client and the guards raise. */
export class FencepostError extends Error {
  /** The reason of this class when none is given. */
  static readonly defaultReason: string | undefined = undefined;
  /** The lock name concerned, when known. */
  readonly lockName: string | undefined;
  /** The lease id concerned, when known. */
  readonly leaseId: bigint | undefined;
  /** An ErrorReason name from the proto, a client-local reason (`DEADLINE`), or undefined. */
  reason: string | undefined;
  /** The gRPC status code when the error came from a server. */
  readonly code: Code | undefined;

  constructor(message: string, fields: ErrorFields = {}) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = new.target.name;
    this.lockName = fields.lockName;
    this.leaseId = fields.leaseId;
    this.reason = fields.reason ?? (new.target as unknown as typeof FencepostError).defaultReason;
    this.code = fields.code;
  }
}

/** An argument or request field is out of range (checked locally before any call, or by the server). */
export class InvalidArgument extends FencepostError {
  static override readonly defaultReason = "INVALID_FIELD";
  /** The argument or wire field at fault (`"name"`, `"ttl"`, `"timeout"`, `"address"`, `"tls.ca"`, `"token"`, `"table"`...). */
  readonly field: string | undefined;
  constructor(message: string, fields: ErrorFields & { field?: string | undefined } = {}) {
    super(message, fields);
    this.field = fields.field;
  }
}

/** `tryAcquire` found the lock held by another grant. */
export class LockHeld extends FencepostError {
  static override readonly defaultReason = "LOCK_HELD";
  /** The holder's lease id (0n when unknown). */
  readonly holderLeaseId: bigint;
  /** The holder's fencing token (0n when unknown). */
  readonly holderToken: bigint;
  constructor(message: string, fields: ErrorFields & { holderLeaseId?: bigint; holderToken?: bigint } = {}) {
    super(message, fields);
    this.holderLeaseId = fields.holderLeaseId ?? 0n;
    this.holderToken = fields.holderToken ?? 0n;
  }
}

/** A blocking acquire did not get the lock within its timeout. */
export class LockTimeout extends FencepostError {
  static override readonly defaultReason = "ACQUIRE_TIMEOUT";
}

/** The lease behind a hold is gone (expired, revoked), or its local deadline passed (reason `DEADLINE`). */
export class LeaseLost extends FencepostError {
  static override readonly defaultReason = "LEASE_EXPIRED";
}

interface TokenFields extends ErrorFields {
  token?: bigint | undefined;
  currentToken?: bigint | undefined;
}

/** The lease does not hold the lock (released, lost, or never held). */
export class NotHolder extends FencepostError {
  static override readonly defaultReason = "NOT_HOLDER";
  /** The fencing token the call carried, when known. */
  readonly token: bigint | undefined;
  /** The token of the lock's current holder, when the server said so. */
  readonly currentToken: bigint | undefined;
  constructor(message: string, fields: TokenFields = {}) {
    super(message, fields);
    this.token = fields.token;
    this.currentToken = fields.currentToken;
  }
}

/**
 * A fencing token lower than the newest one was offered: by the coordinator
 * (the lease holds the lock under a newer token) or by a fencing guard (the
 * record has accepted a higher token; the write was refused and the record
 * left unchanged, and `record` is its key).
 */
export class StaleTokenError extends FencepostError {
  static override readonly defaultReason = "STALE_TOKEN";
  /** The offered (old) fencing token. */
  readonly token: bigint | undefined;
  /** The newer token: the lock's, or the highest the record has accepted. */
  readonly currentToken: bigint | undefined;
  /** The key of the guarded record that refused the write; undefined from the coordinator. */
  readonly record: unknown;
  constructor(message: string, fields: TokenFields & { record?: unknown } = {}) {
    super(message, fields);
    this.token = fields.token;
    this.currentToken = fields.currentToken;
    this.record = fields.record;
  }
}

/** A guard's update found no record with that key (nothing was written). */
export class MissingRecordError extends FencepostError {
  /** The key that matched no record. */
  readonly record: unknown;
  constructor(message: string, fields: ErrorFields & { record?: unknown } = {}) {
    super(message, fields);
    this.record = fields.record;
  }
}

/** No coordinator could be reached, or etcd is unreachable or has no quorum. */
export class Unavailable extends FencepostError {
  /** Seconds the server asked the caller to wait before retrying (its RetryInfo), when it said. */
  readonly retryDelay: number | undefined;
  constructor(message: string, fields: ErrorFields & { retryDelay?: number | undefined } = {}) {
    super(message, fields);
    this.retryDelay = fields.retryDelay;
  }
}

/** The TLS handshake with every coordinator address failed: retrying will not help until certificates change. */
export class TlsError extends Unavailable {
  /** The first address whose handshake failed. */
  readonly address: string | undefined;
  /** Why, in words (Node's TLS error code and message). */
  readonly tlsCause: string | undefined;
  constructor(message: string, fields: ErrorFields & { address?: string; tlsCause?: string } = {}) {
    super(message, fields);
    this.address = fields.address;
    this.tlsCause = fields.tlsCause;
  }
}

/**
 * etcd's revisions went back (restored from an older snapshot), so the
 * coordinator grants no token (reason `DATA_LOSS`, status UNAVAILABLE) until
 * an operator runs `fencepost admin recover-tokens` (docs/deploy.md).
 */
export class DataLoss extends Unavailable {}

/** A coordinator limit was hit (too many waiters, streams or calls). */
export class ResourceExhausted extends FencepostError {}

/** The coordinator refuses this caller (status PERMISSION_DENIED): retrying does not help. */
export class PermissionDenied extends FencepostError {}

/**
 * The coordinator's access policy (`fencepost serve --policy`) does not let
 * the caller's identity (its client certificate's SPIFFE ID, URI SAN, DNS SAN
 * or subject CN) take this action on this lock name (reason `ACCESS_DENIED`).
 */
export class AccessDenied extends PermissionDenied {
  static override readonly defaultReason = "ACCESS_DENIED";
  /** The refused action: `"acquire"`, `"release"`, `"describe"` or `"admin"`; undefined when not sent. */
  readonly action: string | undefined;
  constructor(message: string, fields: ErrorFields & { action?: string | undefined } = {}) {
    super(message, fields);
    this.action = fields.action;
  }
}

/** What a failed call's `google.rpc.Status` details said. */
export interface StatusDetails {
  /** ErrorInfo.reason, undefined without ErrorInfo (the call never reached a coordinator). */
  reason: string | undefined;
  /** ErrorInfo.metadata (keys `field`, `name`, `lease_id`, `token`, `current_token`, `action`). */
  metadata: Record<string, string>;
  /** RetryInfo's delay in seconds, undefined without RetryInfo. */
  retryDelay: number | undefined;
}

const ERROR_INFO = "google.rpc.ErrorInfo";
const RETRY_INFO = "google.rpc.RetryInfo";

/** Decode a `google.rpc.ErrorInfo` (reason = 1, domain = 2, metadata = 3 map<string, string>). */
function decodeErrorInfo(bytes: Uint8Array): { reason: string; metadata: Record<string, string> } {
  const reader = new BinaryReader(bytes);
  let reason = "";
  const metadata: Record<string, string> = {};
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === 1) reason = reader.string();
    else if (field === 3) {
      const entry = new BinaryReader(reader.bytes());
      let key = "";
      let value = "";
      while (entry.pos < entry.len) {
        const [f, wt] = entry.tag();
        if (f === 1) key = entry.string();
        else if (f === 2) value = entry.string();
        else entry.skip(wt);
      }
      metadata[key] = value;
    } else reader.skip(wireType);
  }
  return { reason, metadata };
}

/** Decode a `google.rpc.RetryInfo` (retry_delay = 1, a Duration: seconds = 1, nanos = 2) into seconds. */
function decodeRetryInfo(bytes: Uint8Array): number {
  const reader = new BinaryReader(bytes);
  let seconds = 0;
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === 1) {
      const duration = new BinaryReader(reader.bytes());
      while (duration.pos < duration.len) {
        const [f, wt] = duration.tag();
        if (f === 1) seconds += Number(duration.int64());
        else if (f === 2) seconds += duration.int32() / 1e9;
        else duration.skip(wt);
      }
    } else reader.skip(wireType);
  }
  return seconds;
}

/** Read the ErrorInfo and RetryInfo of a failed call. Never throws: undecodable details count as absent. */
export function statusDetails(err: ConnectError): StatusDetails {
  const out: StatusDetails = { reason: undefined, metadata: {}, retryDelay: undefined };
  for (const detail of err.details) {
    if (!("type" in detail) || !(detail.value instanceof Uint8Array)) continue;
    try {
      if (detail.type === ERROR_INFO && out.reason === undefined) {
        const info = decodeErrorInfo(detail.value);
        out.reason = info.reason || undefined;
        out.metadata = info.metadata;
      } else if (detail.type === RETRY_INFO) {
        out.retryDelay = decodeRetryInfo(detail.value);
      }
    } catch {
      // malformed details: fall back to the code alone
    }
  }
  return out;
}

function bigintOf(value: string | undefined): bigint | undefined {
  if (value === undefined || !/^-?[0-9]+$/.test(value)) return undefined;
  return BigInt(value);
}

/** The lock name, lease id and token of a call, used where the server did not send them. */
export interface CallContext {
  lockName?: string | undefined;
  leaseId?: bigint | undefined;
  token?: bigint | undefined;
}

/**
 * Translate a failed call into a {@link FencepostError} subclass, from its
 * status code and ErrorInfo reason (the table of `fencepost.client.errors`).
 *
 * @param err - What a Connect-ES call threw.
 * @param context - The call's lock name, lease id and token, for the error.
 * @returns The error to throw (not thrown here); its `cause` is `err`.
 */
export function fromConnectError(err: unknown, context: CallContext = {}): FencepostError {
  if (err instanceof FencepostError) return err;
  const connect = ConnectError.from(err);
  const details = statusDetails(connect);
  const md = details.metadata;
  const fields: ErrorFields = {
    lockName: md["name"] ?? context.lockName,
    leaseId: bigintOf(md["lease_id"]) ?? context.leaseId,
    reason: details.reason,
    code: connect.code,
    cause: err,
  };
  const message = connect.rawMessage || Code[connect.code] || "RPC failed";
  const tokens = { token: bigintOf(md["token"]) ?? context.token, currentToken: bigintOf(md["current_token"]) };
  let out: FencepostError;
  switch (connect.code) {
    case Code.InvalidArgument:
      out = new InvalidArgument(message, { ...fields, field: md["field"] });
      break;
    case Code.DeadlineExceeded:
      out = new LockTimeout(message, fields);
      break;
    case Code.FailedPrecondition:
      if (details.reason === "NOT_HOLDER") out = new NotHolder(message, { ...fields, ...tokens });
      else if (details.reason === "STALE_TOKEN") out = new StaleTokenError(message, { ...fields, ...tokens });
      else if (details.reason === "LEASE_EXPIRED") out = new LeaseLost(message, fields);
      else out = new FencepostError(message, fields);
      break;
    case Code.Unavailable:
      out =
        details.reason === "DATA_LOSS"
          ? new DataLoss(message, { ...fields, retryDelay: details.retryDelay })
          : new Unavailable(message, { ...fields, retryDelay: details.retryDelay });
      break;
    case Code.ResourceExhausted:
      out = new ResourceExhausted(message, fields);
      break;
    case Code.PermissionDenied:
      out =
        details.reason === "ACCESS_DENIED"
          ? new AccessDenied(message, { ...fields, action: md["action"] })
          : new PermissionDenied(message, fields);
      break;
    default:
      out = new FencepostError(message, fields);
  }
  out.reason = details.reason; // exactly what the server said: undefined when no coordinator answered
  return out;
}
