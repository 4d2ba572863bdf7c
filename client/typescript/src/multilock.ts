/**
 * Multi-locks, client side: several locks taken all together or none
 * (AcquireAll), released together (ReleaseAll); the Python client's
 * `_recipes/multilock.py` (docs/multilocks.md).
 *
 * The coordinator puts the keys of every name in one etcd transaction, so
 * they share one create revision: no deadlock whatever order callers give
 * the names, and one fencing token per name. Here the local exclusion of the
 * {@link LeasePool} (one local holder per lease and name) is taken for every
 * name, in sorted order (two local multi-locks cannot deadlock on it
 * either), before the call. No state outlives the call unless its caller
 * holds it: a call that ends without a definite answer (aborted, the
 * client's own deadline, the transport failed) is withdrawn (ReleaseAll with
 * token 0: every key of the lease in those locks, one transaction), the
 * local slots kept until then.
 *
 * @module
 */

import { randomUUID } from "node:crypto";
import { now } from "./backoff.js";
import { InvalidArgument, LeaseLost, LockHeld, LockTimeout, NotHolder, StaleTokenError, Unavailable } from "./errors.js";
import type { LockHandle } from "./handle.js";
import { settled, waitFields, type Holds } from "./holds.js";
import type { Lease, LeasePool, Slot } from "./lease.js";
import type { Leasing } from "./leasing.js";
import type { Lifecycle } from "./lifecycle.js";
import { MultiLockHandle, type MultiLockCalls } from "./multihandle.js";
import type { KeepAliveStream } from "./stream.js";
import { owner, type Transport } from "./transport.js";
import { checkName } from "./validate.js";
import { cleanUp } from "./waits.js";

/** Most names of one multi-lock (the coordinator's limit). */
export const MAX_MULTILOCK_NAMES = 32;

/**
 * Check the names of a multi-lock before any call: an array of 2 to 32
 * distinct lock names.
 *
 * @throws {@link InvalidArgument} (field `names`).
 */
export function checkNames(names: unknown): string[] {
  if (!Array.isArray(names)) {
    throw namesError(`names must be an array of lock names, got ${typeof names}`);
  }
  if (names.length < 2 || names.length > MAX_MULTILOCK_NAMES) {
    throw namesError(`names has ${names.length} names; a multi-lock takes 2 to ${MAX_MULTILOCK_NAMES}`);
  }
  const seen = new Set<string>();
  for (const name of names as unknown[]) {
    try {
      checkName(name);
    } catch (err) {
      throw namesError(`names: ${(err as Error).message}`);
    }
    if (seen.has(name as string)) throw namesError(`names has ${JSON.stringify(name)} more than once`);
    seen.add(name as string);
  }
  return [...(names as string[])];
}

function namesError(message: string): InvalidArgument {
  return new InvalidArgument(message, { field: "names" });
}

/** The multi-lock calls of one client; the client owns one. */
export class MultiLocks implements MultiLockCalls {
  constructor(
    private readonly transport: Transport,
    private readonly pool: LeasePool,
    private readonly stream: KeepAliveStream,
    private readonly leasing: Leasing,
    private readonly life: Lifecycle,
    private readonly holds: Holds,
  ) {}

  get open(): boolean {
    return this.life.state !== "new" && this.life.state !== "closed";
  }

  /**
   * Take every lock of `names` under the lease of `ttl` (arguments already
   * checked, the client open).
   *
   * @param until - Clock reading (seconds) after which the wait ends; undefined waits until granted.
   * @param tryOnce - Fail with {@link LockHeld} instead of waiting (nothing taken).
   */
  async acquire(
    names: string[],
    ttl: number,
    until: number | undefined,
    tryOnce: boolean,
    signal: AbortSignal | undefined,
  ): Promise<MultiLockHandle> {
    const lease = await this.leasing.leaseFor(ttl, until, signal);
    const slots: [string, Slot][] = [];
    let taken: Slot[] = [];
    try {
      for (const name of [...names].sort()) {
        const slot = this.pool.slot(lease.leaseId, name);
        slot.users++;
        slots.push([name, slot]);
        if (tryOnce && (slot.locked || slot.users > 1)) {
          throw new LockHeld(`lock ${JSON.stringify(name)} is held by this client: none of the names taken`, {
            lockName: name, leaseId: lease.leaseId, holderLeaseId: lease.leaseId, holderToken: slot.holder?.token ?? 0n,
          });
        }
        if (!(await slot.take(tryOnce ? undefined : until, signal))) {
          throw new LockTimeout("lock is held by this client", { lockName: name, leaseId: lease.leaseId });
        }
        taken.push(slot);
      }
      let tokens: bigint[];
      try {
        tokens = await this.acquireRpc(lease, names, until, tryOnce, signal);
      } catch (err) {
        if (settled(err, signal) || lease.lost || !this.life.open) throw err;
        const withdrawal = this.withdraw(lease, names, slots.filter(([, slot]) => taken.includes(slot)));
        taken = []; // the withdrawal frees them once done
        this.life.spawn(withdrawal);
        await cleanUp(withdrawal);
        throw err;
      }
      const handle = new MultiLockHandle(names, lease, tokens, this);
      if (lease.lost) {
        this.life.spawn(this.withdraw(lease, names, []));
        throw new LeaseLost("the lease was lost while acquiring", {
          lockName: names[0], leaseId: lease.leaseId, reason: lease.lostReason ?? "LEASE_EXPIRED",
        });
      }
      const bySlot = new Map(slots);
      for (const [name, member] of handle._members) {
        lease.holds.set(member._key, member);
        this.stream.watch(member);
        bySlot.get(name)!.holder = member;
      }
      taken = []; // each member's release or loss frees its slot
      return handle;
    } finally {
      for (const slot of taken) slot.release();
      for (const [name, slot] of slots) {
        slot.users--;
        this.pool.dropSlotIfIdle(lease.leaseId, name);
      }
    }
  }

  private async acquireRpc(
    lease: Lease,
    names: string[],
    until: number | undefined,
    tryOnce: boolean,
    signal: AbortSignal | undefined,
  ): Promise<bigint[]> {
    const requestId = randomUUID().replaceAll("-", ""); // the same on every attempt
    const context = { lockName: names[0], leaseId: lease.leaseId };
    const resp = await this.transport.call(
      "AcquireAll",
      (client, left) => {
        const { waitMs, waitForever, timeoutMs } = waitFields(left, tryOnce, this.transport.connectTimeout);
        return client.acquireAll(
          { names, leaseId: lease.leaseId, waitMs, waitForever, requestId },
          { timeoutMs, signal, headers: owner(lease.secret) },
        );
      },
      { until, idempotent: true, context, signal },
    );
    if (!resp.acquired) {
      const held = resp.heldName || names[0]!;
      const holderLeaseId = resp.holder?.leaseId ?? 0n;
      const holderToken = resp.holder?.token ?? 0n;
      const what = resp.holder === undefined
        ? `lock ${JSON.stringify(held)} is free but a lock-delay holds it back`
        : `lock ${JSON.stringify(held)} is held (lease ${holderLeaseId}, token ${holderToken})`;
      const fields = { lockName: held, leaseId: lease.leaseId };
      if (!tryOnce) throw new LockTimeout(`${what}: none of the names taken`, fields);
      throw new LockHeld(`${what}: none of the names taken`, { ...fields, holderLeaseId, holderToken });
    }
    return resp.tokens;
  }

  /**
   * ReleaseAll with token 0: delete every key of `lease` in those locks (a
   * wait or a grant the caller never got), retried while the lease lives and
   * the client is open; then free `slots`.
   */
  private async withdraw(lease: Lease, names: string[], slots: [string, Slot][]): Promise<void> {
    const requestId = randomUUID().replaceAll("-", "");
    try {
      while (!lease.lost && this.life.open) {
        try {
          await this.transport.call(
            "ReleaseAll",
            (client) => client.releaseAll(
              { names, leaseId: lease.leaseId, token: 0n, requestId },
              { timeoutMs: this.transport.connectTimeout * 1000, headers: owner(lease.secret) },
            ),
            { until: undefined, idempotent: true, context: { lockName: names[0], leaseId: lease.leaseId } },
          );
          return;
        } catch (err) {
          if (!(err instanceof Unavailable)) return; // LeaseLost: its keys went with it; else they end with the lease
        }
      }
    } finally {
      for (const [name, slot] of slots) {
        slot.release();
        this.pool.dropSlotIfIdle(lease.leaseId, name);
      }
    }
  }

  /** ReleaseAll of a multi-lock's grant; each member settled by the outcome (see {@link MultiLockHandle.release}). */
  async releaseAll(handle: MultiLockHandle): Promise<void> {
    const members = [...handle._members.values()];
    const first = members[0]!;
    const token = first.token;
    const requestId = randomUUID().replaceAll("-", ""); // the same on every attempt
    const call = this.transport.call(
      "ReleaseAll",
      (client) => client.releaseAll(
        { names: [...handle.names], leaseId: handle.leaseId, token, requestId },
        { timeoutMs: this.transport.connectTimeout * 1000, headers: owner(first.leaseSecret) },
      ),
      {
        until: now() + this.transport.connectTimeout,
        idempotent: true,
        context: { lockName: handle.names[0], leaseId: handle.leaseId, token },
      },
    ).then(() => undefined);
    for (const member of members) member._beginRelease(call);
    let failure: unknown;
    try {
      await call;
    } catch (err) {
      failure = err;
    }
    // NOT_HOLDER or STALE_TOKEN name the first name not held: nothing was released, that name is lost (and
    // with it the multi-lock, whose other names are then released one by one).
    const oneName = (failure instanceof NotHolder || failure instanceof StaleTokenError) &&
      failure.lockName !== undefined && handle._members.has(failure.lockName) ? failure.lockName : undefined;
    for (const member of members) {
      if (oneName !== undefined && member.name !== oneName) this.keepHeld(member);
      else this.settle(member, failure);
    }
    if (failure !== undefined) throw failure;
  }

  /** A member whose ReleaseAll failed for another name: still held, unless its hold ended meanwhile. */
  private keepHeld(member: LockHandle): void {
    const ended = member._endRelease();
    if (ended === "LEASE_EXPIRED") this.pool.lose(member._lease, ended);
    else if (ended !== undefined) this.pool.loseHold(member, ended);
  }

  private settle(member: LockHandle, failure: unknown): void {
    try {
      this.holds.settleRelease(member, failure);
    } catch {
      // the caller gets the ReleaseAll's error once
    }
  }

  async releaseMember(member: LockHandle): Promise<void> {
    try {
      await this.holds.release(member);
    } catch {
      // the key ends with the lease otherwise
    }
  }
}

