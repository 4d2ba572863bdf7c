/**
 * `@fencepost/client`: the TypeScript client of Fencepost, a lock service
 * whose every grant carries a fencing token.
 *
 * @module
 */

export {
  LockClient,
  type AcquireAllOptions,
  type AcquireOptions,
  type ClientOptions,
  type TryAcquireOptions,
} from "./client.js";
export type { EtcdInfo, HeldLock, LockInfo, ServerInfo } from "./info.js";
export { LockHandle } from "./handle.js";
export { MultiLockHandle } from "./multihandle.js";
export type { TlsOptions } from "./tls.js";
export {
  AccessDenied,
  DataLoss,
  FencepostError,
  InvalidArgument,
  LeaseLost,
  LockHeld,
  LockTimeout,
  MissingRecordError,
  NotHolder,
  PermissionDenied,
  REASON_CLOSED,
  REASON_DEADLINE,
  REASON_OUTCOME_UNKNOWN,
  ResourceExhausted,
  StaleTokenError,
  TlsError,
  Unavailable,
} from "./errors.js";
export { DEFAULT_ADDRESS } from "./validate.js";
export { marginFor } from "./lease.js";
