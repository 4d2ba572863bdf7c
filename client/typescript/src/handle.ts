/**
 * Lock handles: one grant of one lock under a lease, with its fencing token.
 *
 * A handle is lost exactly once, whichever detection path fires first (the
 * local deadline, an acknowledgement saying the lease is gone, a HoldEnded
 * event), and never after it was released.
 *
 * @module
 */

import { randomUUID } from "node:crypto";
import { LeaseLost } from "./errors.js";
import type { Lease } from "./lease.js";

/**
 * The client's own key of a read hold of lock `name` (a read-write lock's
 * reader): a control character starts it, so no lock name is one. A lease's
 * holds and local slots are kept by this key, so that a read and a write hold
 * of one name are apart (the Python client's `kinds.read_lock`).
 */
export function holdKey(name: string, read: boolean): string {
  return read ? `\u0001r/${name}` : name;
}

/** One grant of a lock, held under a lease, with its fencing token. Made by {@link LockClient.acquire}. */
export class LockHandle {
  /** The lock name. */
  readonly name: string;
  /** Whether this is a read hold (`read: true`: shared with other readers; docs/rwlocks.md), not a write hold. */
  readonly read: boolean;
  /** The fencing token of this grant (an etcd revision): send it with every write the lock protects. */
  readonly token: bigint;
  /** The lease holding the lock. */
  readonly leaseId: bigint;
  /** The secret of the lease holding the lock: whoever presents it may act on the lease. Never log it. */
  readonly leaseSecret: string;
  /** The lease's granted TTL, in seconds. */
  readonly ttl: number;
  /**
   * Settles (resolves with a {@link LeaseLost}) when the hold is lost: its
   * lease expired or was revoked, its key was deleted, or its local deadline
   * passed. Never settles for a hold that is released first.
   */
  readonly lost: Promise<LeaseLost>;
  /** Aborted, with the {@link LeaseLost} as its reason, when the hold is lost. Pass it to the work done under the lock. */
  readonly signal: AbortSignal;
  /** Why the hold was lost (`LEASE_EXPIRED`, `NOT_HOLDER`, `DEADLINE`...); undefined while it is not. */
  lostReason: string | undefined;
  /** Whether the hold was released. */
  released = false;

  /** @internal */
  readonly _lease: Lease;
  /** The Release in flight, shared by concurrent release() calls. */
  private releaseTask: Promise<void> | undefined;
  /** The reason of a HoldEnded that arrived while the Release was in flight. */
  private endedDuringRelease: string | undefined;
  /** The request id of this hold's Release, made at its first use. */
  private releaseRequestId: string | undefined;
  private readonly abort = new AbortController();
  private resolveLost!: (err: LeaseLost) => void;
  private readonly releaseFn: (handle: LockHandle) => Promise<void>;

  /** @internal */
  constructor(
    name: string,
    lease: Lease,
    token: bigint,
    release: (handle: LockHandle) => Promise<void>,
    read = false,
  ) {
    this.name = name;
    this.read = read;
    this._lease = lease;
    this.leaseId = lease.leaseId;
    this.leaseSecret = lease.secret;
    this.ttl = lease.ttl;
    this.token = token;
    this.releaseFn = release;
    this.signal = this.abort.signal;
    this.lost = new Promise((resolve) => {
      this.resolveLost = resolve;
    });
  }

  /** Whether the hold is still live: not released, not lost, and its local deadline not passed. */
  isValid(): boolean {
    return !this.released && this.lostReason === undefined && this._lease.remaining() > 0;
  }

  /** Seconds left before the local deadline (send time of the last acknowledged keepalive + TTL - margin); 0 once lost or released. */
  validFor(): number {
    return this.isValid() ? this._lease.remaining() : 0;
  }

  /** The local deadline, in seconds on `performance.now() / 1000`. */
  get deadline(): number {
    return this._lease.deadline;
  }

  /**
   * Throw if the hold is no longer valid.
   *
   * @throws {@link LeaseLost} with the loss's reason (`DEADLINE` once the local deadline passed).
   */
  check(): void {
    if (this.isValid()) return;
    throw new LeaseLost("lock hold is not valid", {
      lockName: this.name,
      leaseId: this.leaseId,
      reason: this.lostReason ?? (this.released ? "RELEASED" : "DEADLINE"),
    });
  }

  /**
   * Release the lock. The lease stays alive for the client's other locks.
   * The hold stays valid until the coordinator answers; calls made while a
   * Release is in flight share it and its outcome.
   *
   * @throws {@link NotHolder} already released, or the lease no longer holds the lock.
   * @throws {@link StaleTokenError} the lease holds the lock under a newer token.
   * @throws {@link LeaseLost} the hold was lost before the release (it is then forgotten).
   * @throws {@link Unavailable} no coordinator answered within `connectTimeout`; reason `OUTCOME_UNKNOWN`:
   *   the Release was sent (and sent again, with its request id, after each lost answer) and no answer
   *   said whether it was applied. The hold is then kept as held; calling `release()` again settles it
   *   (the same request id: a Release that was applied answers OK).
   */
  release(): Promise<void> {
    return this.releaseFn(this);
  }

  /** Release on `await using`; errors are ignored. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.released) return;
    try {
      await this.release();
    } catch {
      // released or lost either way
    }
  }

  /** @internal the key of this hold among its lease's holds and slots ({@link holdKey}) */
  get _key(): string {
    return holdKey(this.name, this.read);
  }

  /** @internal */
  _markLost(reason: string): boolean {
    if (this.released || this.lostReason !== undefined) return false;
    this.lostReason = reason;
    const err = new LeaseLost(`lock hold was lost (${reason})`, {
      lockName: this.name,
      leaseId: this.leaseId,
      reason,
    });
    this.resolveLost(err);
    this.abort.abort(err);
    return true;
  }

  /** @internal */
  _markReleased(): void {
    this.released = true;
  }

  /**
   * @internal the request id of this hold's Release: made at first use, the same on every attempt and on a
   * release called again after one that failed, so that a retry of a Release that was applied answers OK
   */
  _releaseRequestId(): string {
    this.releaseRequestId ??= randomUUID().replaceAll("-", "");
    return this.releaseRequestId;
  }

  /** @internal the Release in flight, if any (concurrent release() calls share it) */
  get _releaseInFlight(): Promise<void> | undefined {
    return this.releaseTask;
  }

  /** @internal a Release of this hold was sent: `task` settles with its outcome */
  _beginRelease(task: Promise<void>): void {
    this.releaseTask = task;
    this.endedDuringRelease = undefined;
  }

  /** @internal the Release settled: the reason of a HoldEnded that arrived meanwhile, if any */
  _endRelease(): string | undefined {
    const ended = this.endedDuringRelease;
    this.releaseTask = undefined;
    this.endedDuringRelease = undefined;
    return ended;
  }

  /**
   * @internal a HoldEnded with `reason` arrived: true if a Release is in flight
   * (the reason is kept for its outcome), false if the caller must act on it
   */
  _holdEndedDuringRelease(reason: string): boolean {
    if (this.releaseTask === undefined) return false;
    this.endedDuringRelease = reason;
    return true;
  }
}
