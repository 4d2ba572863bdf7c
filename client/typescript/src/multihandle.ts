/**
 * Multi-lock handles: one grant of several locks together under one lease,
 * a fencing token per name (the Python client's `AsyncMultiLockHandle`).
 *
 * Each name is a {@link LockHandle} of its own (a member), kept under the
 * lease and watched on the KeepAlive stream as a single lock's hold is, so
 * that each name's loss arrives as a lock's would. The multi-lock is lost
 * as soon as any member is: `lost` settles, `signal` aborts, and the names
 * still held are released in the background, each by its own token.
 *
 * @module
 */

import { FencepostError, InvalidArgument, LeaseLost, NotHolder } from "./errors.js";
import { LockHandle } from "./handle.js";
import type { Lease } from "./lease.js";

/** What a multi-lock handle asks of the client that made it (`multilock.ts`). */
export interface MultiLockCalls {
  /** Whether the client is open (a release of a closed client's handle is refused). */
  readonly open: boolean;
  /** ReleaseAll of every name, settling each member; rejects with the call's error. */
  releaseAll(handle: MultiLockHandle): Promise<void>;
  /** Release one member still held after another was lost (a Release by its own token); errors are ignored. */
  releaseMember(member: LockHandle): Promise<void>;
}

/**
 * One grant of several locks together, each with its fencing token. Made by
 * {@link LockClient.acquireAll}, {@link LockClient.tryAcquireAll} and
 * {@link LockClient.withLocks}.
 *
 * Write each resource with the token of its own name ({@link tokenFor}):
 * tokens are ordered per name (all of one grant are equal, each strictly
 * larger than that name's earlier tokens).
 */
export class MultiLockHandle {
  /** The lock names, in the order given. */
  readonly names: readonly string[];
  /** Name -> the fencing token of that name (bigint). */
  readonly tokens: ReadonlyMap<string, bigint>;
  /** The lease holding every name. */
  readonly leaseId: bigint;
  /** The secret of the lease holding every name: whoever presents it may act on the lease. Never log it. */
  readonly leaseSecret: string;
  /** The lease's granted TTL, in seconds. */
  readonly ttl: number;
  /**
   * Settles (resolves with a {@link LeaseLost} naming the first name lost)
   * when any name's hold is lost: its key deleted, the lease gone, or the
   * local deadline passed. Never settles for a multi-lock released first.
   */
  readonly lost: Promise<LeaseLost>;
  /** Aborted, with that {@link LeaseLost} as its reason, when the multi-lock is lost. */
  readonly signal: AbortSignal;
  /** Why the multi-lock was lost (the first lost name's reason); undefined while it is not. */
  lostReason: string | undefined;

  /** @internal name -> the member hold of that name */
  readonly _members: ReadonlyMap<string, LockHandle>;
  private readonly calls: MultiLockCalls;
  private readonly abort = new AbortController();
  private resolveLost!: (err: LeaseLost) => void;
  private releaseTask: Promise<void> | undefined;
  private releasedByCaller = false;

  /** @internal */
  constructor(names: readonly string[], lease: Lease, tokens: readonly bigint[], calls: MultiLockCalls) {
    this.names = Object.freeze([...names]);
    this.leaseId = lease.leaseId;
    this.leaseSecret = lease.secret;
    this.ttl = lease.ttl;
    this.calls = calls;
    this.signal = this.abort.signal;
    this.lost = new Promise((resolve) => {
      this.resolveLost = resolve;
    });
    const members = new Map<string, LockHandle>();
    names.forEach((name, i) => {
      const member = new LockHandle(name, lease, tokens[i]!, () => this.release());
      member.signal.addEventListener("abort", () => this.memberLost(member), { once: true });
      members.set(name, member);
    });
    this._members = members;
    this.tokens = new Map([...members].map(([name, member]) => [name, member.token]));
  }

  /**
   * The fencing token of lock `name` of this multi-lock.
   *
   * @throws {@link InvalidArgument} (field `name`) `name` is not one of {@link names}.
   */
  tokenFor(name: string): bigint {
    const token = this.tokens.get(name);
    if (token === undefined) {
      throw new InvalidArgument(`${JSON.stringify(name)} is not a name of this multi-lock`, { field: "name" });
    }
    return token;
  }

  /** Whether it was released (or its client closed). */
  get released(): boolean {
    return this.releasedByCaller || [...this._members.values()].every((m) => m.released);
  }

  /** Whether every name is believed held now (an early warning only: fence every write). */
  isValid(): boolean {
    return this.lostReason === undefined && [...this._members.values()].every((m) => m.isValid());
  }

  /** Seconds before the lease's local deadline (one lease for every name); 0 once lost or released. */
  validFor(): number {
    return this.isValid() ? Math.min(...[...this._members.values()].map((m) => m.validFor())) : 0;
  }

  /**
   * Throw unless every name is believed held.
   *
   * @throws {@link LeaseLost} a name's hold was lost (or the local deadline passed).
   */
  check(): void {
    for (const member of this._members.values()) member.check();
  }

  /**
   * Release every name: one ReleaseAll call, one etcd transaction (all or
   * nothing). Every name stays held until the coordinator answers; calls made
   * while it is in flight share it and its outcome.
   *
   * @throws {@link NotHolder} already released, or a name is no longer held (nothing was released by the call).
   * @throws {@link StaleTokenError} a name is held under a newer token.
   * @throws {@link LeaseLost} the lease is gone, or a name was lost before the release (the
   *   names still held are released in the background).
   * @throws {@link Unavailable} no coordinator answered within `connectTimeout` (every name is kept).
   */
  release(): Promise<void> {
    if (this.releaseTask !== undefined) return this.releaseTask;
    const fields = { lockName: this.names[0], leaseId: this.leaseId };
    if (this.released) return Promise.reject(new NotHolder("multi-lock was already released", fields));
    if (this.lostReason !== undefined) {
      this.releasedByCaller = true;
      const reason = this.lostReason;
      return Promise.reject(new LeaseLost("multi-lock hold was lost before release", { ...fields, reason }));
    }
    if (!this.calls.open) return Promise.reject(new FencepostError("client is closed", fields));
    const task = this.calls.releaseAll(this).then(
      () => {
        this.releaseTask = undefined;
        this.releasedByCaller = true;
      },
      (err: unknown) => {
        this.releaseTask = undefined;
        throw err;
      },
    );
    this.releaseTask = task;
    return task;
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

  /** A member's hold was lost: the whole multi-lock is; the names still held are released. */
  private memberLost(member: LockHandle): void {
    if (this.lostReason !== undefined || this.releasedByCaller) return;
    const reason = member.lostReason ?? "LEASE_EXPIRED";
    this.lostReason = reason;
    const err = new LeaseLost(`multi-lock hold was lost: ${JSON.stringify(member.name)} (${reason})`, {
      lockName: member.name,
      leaseId: this.leaseId,
      reason,
    });
    this.resolveLost(err);
    this.abort.abort(err);
    void this.releaseRest();
  }

  /**
   * Release each name still held once one is lost, by its own token (a Release
   * each: nothing newer of the lease in those locks can be deleted). Runs after
   * the loss that started it has marked every member it concerns.
   */
  private async releaseRest(): Promise<void> {
    await Promise.resolve();
    for (const member of this._members.values()) {
      if (member.lostReason === undefined && !member.released) await this.calls.releaseMember(member);
    }
  }
}
