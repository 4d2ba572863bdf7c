/**
 * Leases as the client sees them: the conservative local deadline, and the
 * pool of leases by TTL (the Python client's `_leases/lease.py`).
 *
 * A {@link Lease} is one etcd lease the client keeps alive. Its local
 * deadline is `send time of the last acknowledged keepalive + granted TTL -
 * margin` on a monotonic clock; it only moves forward, and a lease is lost
 * exactly once. The {@link LeasePool} holds one live lease per requested TTL,
 * the holds under each, and the local exclusion of one (lease, lock name).
 *
 * @module
 */

import { REASON_CLOSED, REASON_DEADLINE } from "./errors.js";
import { now } from "./backoff.js";
import type { LockHandle } from "./handle.js";

/** Safety margin taken off the local deadline, in seconds: `min(1, max(0.1, 0.1 * ttl))`. */
export function marginFor(ttl: number): number {
  return Math.min(1.0, Math.max(0.1, 0.1 * ttl));
}

/** One lease's liveness as seen by the client. */
export class Lease {
  readonly leaseId: bigint;
  /** The lease's secret (LeaseGrantResponse.leaseSecret), sent with every call naming the lease; never log it. */
  readonly secret: string;
  /** Granted TTL, whole seconds. */
  readonly ttl: number;
  readonly margin: number;
  /** Clock reading (seconds) after which the lease must be assumed gone. */
  deadline: number;
  /** Why the lease was lost; undefined while live. */
  lostReason: string | undefined;
  /** Hold key (the lock name, or a read hold's {@link holdKey}) -> the live handle of that hold under this lease. */
  readonly holds = new Map<string, LockHandle>();
  /** The keepalive timer, once started. */
  timer: NodeJS.Timeout | undefined;

  /**
   * @param grantedAt - Clock reading taken just before LeaseGrant was sent.
   */
  constructor(leaseId: bigint, ttl: number, grantedAt: number, secret = "") {
    this.leaseId = leaseId;
    this.secret = secret;
    this.ttl = ttl;
    this.margin = marginFor(ttl);
    this.deadline = grantedAt + ttl - this.margin;
  }

  get lost(): boolean {
    return this.lostReason !== undefined;
  }

  /**
   * Apply a keepalive acknowledgement of a keepalive sent at `sendTime`.
   *
   * @returns False when the acknowledgement says the lease is gone (TTL <= 0) or it was already lost.
   */
  onAck(sendTime: number, ttlSeconds: bigint): boolean {
    if (this.lost || ttlSeconds <= 0n) return false;
    this.deadline = Math.max(this.deadline, sendTime + this.ttl - this.margin);
    return true;
  }

  /** Seconds left before the local deadline (0 once lost or past it). */
  remaining(): number {
    return this.lost ? 0 : Math.max(0, this.deadline - now());
  }

  /** Declare the lease lost; true the first time only. */
  markLost(reason: string): boolean {
    if (this.lost) return false;
    this.lostReason = reason;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    return true;
  }
}

/** A FIFO mutex, for the local exclusion of one (lease, lock name): one local holder at a time. */
export class Slot {
  locked = false;
  users = 0;
  holder: LockHandle | undefined;
  private readonly waiters: (() => void)[] = [];

  /** Take the slot, waiting until `until` (clock seconds) at most; false on timeout. Rejects with the signal's reason. */
  take(until: number | undefined, signal: AbortSignal | undefined): Promise<boolean> {
    if (!this.locked) {
      this.locked = true;
      return Promise.resolve(true);
    }
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const wake = (): void => {
        cleanup();
        resolve(true); // ownership passed to us by release()
      };
      const cleanup = (): void => {
        if (timer !== undefined) clearTimeout(timer);
        signal?.removeEventListener("abort", aborted);
        const i = this.waiters.indexOf(wake);
        if (i >= 0) this.waiters.splice(i, 1);
      };
      const aborted = (): void => {
        cleanup();
        reject(signal?.reason);
      };
      this.waiters.push(wake);
      if (until !== undefined) {
        timer = setTimeout(() => {
          cleanup();
          resolve(false);
        }, Math.max(0, until - now()) * 1000);
      }
      if (signal?.aborted) aborted();
      else signal?.addEventListener("abort", aborted, { once: true });
    });
  }

  /** Hand the slot to the next waiter, or free it. */
  release(): void {
    const next = this.waiters.shift();
    if (next !== undefined) next();
    else this.locked = false;
  }

  get waiting(): number {
    return this.waiters.length;
  }
}

/**
 * A LeaseGrant in flight for one requested TTL, shared by the acquires that
 * wait for it. It is never cancelled: a lease granted when nobody waits for
 * it any more (they all aborted) or once the client is closing is revoked.
 */
export interface Grant {
  /** The lease once granted and kept; rejects when the grant failed or its lease was revoked. */
  readonly promise: Promise<Lease>;
  /** How many acquires still wait for it (an aborted one stops waiting). */
  waiters: number;
}

/** The client's live leases (one per requested TTL), their holds and their slots. */
export class LeasePool {
  private readonly byTtl = new Map<number, Lease>();
  private readonly byId = new Map<bigint, Lease>();
  private readonly granting = new Map<number, Grant>();
  private readonly slots = new Map<string, Slot>();
  /** Called with each lease lost (to wake the deadline watcher, log...). */
  onLeaseLost: (lease: Lease) => void = () => {};

  /** The live lease granted for a requested TTL, if any. */
  live(ttl: number): Lease | undefined {
    const lease = this.byTtl.get(ttl);
    return lease === undefined || lease.lost ? undefined : lease;
  }

  /** One grant at a time per TTL: the grant in flight, if any. */
  inFlight(ttl: number): Grant | undefined {
    return this.granting.get(ttl);
  }

  /** Every grant in flight. */
  grants(): Grant[] {
    return [...this.granting.values()];
  }

  setInFlight(ttl: number, grant: Grant | undefined): void {
    if (grant === undefined) this.granting.delete(ttl);
    else this.granting.set(ttl, grant);
  }

  add(ttl: number, lease: Lease): void {
    this.byTtl.set(ttl, lease);
    this.byId.set(lease.leaseId, lease);
  }

  get(leaseId: bigint): Lease | undefined {
    return this.byId.get(leaseId);
  }

  leases(): Lease[] {
    return [...this.byId.values()];
  }

  holds(): LockHandle[] {
    return this.leases().flatMap((lease) => [...lease.holds.values()]);
  }

  /** The live hold of `key` (a lock name, or a read hold's {@link holdKey}) by `leaseId` under `token`, if any. */
  findHold(leaseId: bigint, key: string, token: bigint): LockHandle | undefined {
    const handle = this.byId.get(leaseId)?.holds.get(key);
    return handle !== undefined && handle.token === token ? handle : undefined;
  }

  /** Declare `lease` lost (once): drop it, stop its keepalives, lose its holds with `reason`. */
  lose(lease: Lease, reason: string): boolean {
    if (!lease.markLost(reason)) return false;
    this.byId.delete(lease.leaseId);
    for (const [ttl, current] of this.byTtl) if (current === lease) this.byTtl.delete(ttl);
    for (const handle of [...lease.holds.values()]) this.loseHold(handle, reason);
    this.onLeaseLost(lease);
    return true;
  }

  /** Declare one hold lost (its `lost` settles once) and free its slot. */
  loseHold(handle: LockHandle, reason: string): void {
    this.dropHold(handle);
    handle._markLost(reason);
    this.freeSlot(handle);
  }

  /** Forget a hold that is released: free its slot, mark it released. */
  finishRelease(handle: LockHandle): void {
    this.dropHold(handle);
    this.freeSlot(handle);
    handle._markReleased();
  }

  /** Lose every lease past its local deadline (reason `DEADLINE`); seconds to the nearest deadline left, if any. */
  expire(): number | undefined {
    const t = now();
    let nearest: number | undefined;
    for (const lease of this.leases()) {
      if (lease.deadline <= t) this.lose(lease, REASON_DEADLINE);
      else if (nearest === undefined || lease.deadline < nearest) nearest = lease.deadline;
    }
    return nearest === undefined ? undefined : nearest - t;
  }

  /** Forget every lease (lost with reason `CLOSED`); every hold becomes released. */
  close(): void {
    for (const lease of this.leases()) {
      lease.markLost(REASON_CLOSED);
      for (const handle of lease.holds.values()) handle._markReleased();
    }
    this.byId.clear();
    this.byTtl.clear();
  }

  private dropHold(handle: LockHandle): void {
    const lease = handle._lease;
    if (lease.holds.get(handle._key) === handle) lease.holds.delete(handle._key);
  }

  private key(leaseId: bigint, name: string): string {
    return `${leaseId}\u0000${name}`;
  }

  /** The slot of (`leaseId`, `hold`: a lock name or a read hold's {@link holdKey}), made on first use. */
  slot(leaseId: bigint, hold: string): Slot {
    const key = this.key(leaseId, hold);
    let slot = this.slots.get(key);
    if (slot === undefined) {
      slot = new Slot();
      this.slots.set(key, slot);
    }
    return slot;
  }

  dropSlotIfIdle(leaseId: bigint, name: string): void {
    const key = this.key(leaseId, name);
    const slot = this.slots.get(key);
    if (slot !== undefined && slot.users === 0 && !slot.locked) this.slots.delete(key);
  }

  /** Let the next local contender of the handle's (lease, name) go, if the handle held it. */
  freeSlot(handle: LockHandle): void {
    const slot = this.slots.get(this.key(handle.leaseId, handle._key));
    if (slot !== undefined && slot.holder === handle) {
      slot.holder = undefined;
      slot.release();
      this.dropSlotIfIdle(handle.leaseId, handle._key);
    }
  }
}
