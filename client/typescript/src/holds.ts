/**
 * The holds of one client: the one acquire loop, the withdrawal of an
 * abandoned Acquire, the one release (the Python client's `_recipes/holds.py`).
 *
 * Each acquire and release keeps the {@link LeasePool} in step with the
 * answers:
 *
 * - a second local acquire of a name held under the same lease waits for the
 *   local holder (the pool's slot), so that the coordinator is never asked
 *   for a hold its caller already has;
 * - a grant that arrives after its lease was declared lost is given back, and
 *   the acquire retries once on a new lease;
 * - an Acquire that ends without a definite answer (aborted, the transport
 *   failed) is withdrawn, the caller's slot kept taken until that is done;
 * - a release keeps the hold until the server confirms, and classifies a
 *   refusal: NOT_HOLDER and STALE_TOKEN lose the hold, LEASE_EXPIRED loses
 *   the lease; it carries the hold's request id, so that an attempt whose
 *   answer was lost is sent again and answered as the first was.
 *
 * @module
 */

import { delays, now, sleep } from "./backoff.js";
import {
  FencepostError,
  InvalidArgument,
  LeaseLost,
  LockHeld,
  LockTimeout,
  NotHolder,
  REASON_DEADLINE,
  StaleTokenError,
  Unavailable,
} from "./errors.js";
import { LockMode } from "./gen/fencepost/v1/lock_pb.js";
import { holdKey, LockHandle } from "./handle.js";
import type { Lease, LeasePool, Slot } from "./lease.js";
import type { Leasing } from "./leasing.js";
import type { Lifecycle } from "./lifecycle.js";
import type { KeepAliveStream } from "./stream.js";
import { owner, type Transport } from "./transport.js";
import { cleanUp } from "./waits.js";

/** Slack added to the deadline of a bounded Acquire, in seconds, so that the coordinator's own ACQUIRE_TIMEOUT answer arrives first. */
const ACQUIRE_SLACK_SECONDS = 1.0;
/** Longest acquire wait on the wire, in milliseconds. */
const MAX_WAIT_MS = 86_400_000;
/**
 * Pause before a second Withdraw when the first found no key, in seconds: an
 * aborted Acquire's write may still be in flight on the coordinator (which
 * finishes it even though the call was cancelled) when the first arrives.
 */
const WITHDRAW_RECHECK_SECONDS = 0.05;
/**
 * Reasons of a refused Acquire after which the coordinator has left nothing of
 * that call in etcd (bad input, its wait timed out and was withdrawn, the lease
 * is gone, the queue was full, a limit refused it): no withdrawal is needed.
 */
const SETTLED_REASONS = new Set([
  "INVALID_FIELD", "ACQUIRE_TIMEOUT", "LEASE_EXPIRED", "TOO_MANY_WAITERS", "LIMIT_EXCEEDED",
  // Refused before anything was done, and a Withdraw would be refused for the same reason.
  "ACCESS_DENIED", "NOT_LEASE_OWNER",
]);

/** What one acquire asks for (checked): the lock, its mode, its lock-delay. */
export interface LockRequest {
  /** The lock name. */
  name: string;
  /** A read hold (LOCK_MODE_READ), else a write hold. */
  read: boolean;
  /** The hold's lock-delay in whole seconds, 0 for none (always 0 for a read hold). */
  lockDelay: number;
}

/** The wire mode of a hold. */
function modeOf(read: boolean): LockMode {
  return read ? LockMode.READ : LockMode.WRITE;
}

/** The acquires and releases of one client; the client owns one. */
export class Holds {
  private readonly transport: Transport;
  private readonly pool: LeasePool;
  private readonly stream: KeepAliveStream;
  private readonly leasing: Leasing;
  private readonly life: Lifecycle;

  constructor(transport: Transport, pool: LeasePool, stream: KeepAliveStream, leasing: Leasing, life: Lifecycle) {
    this.transport = transport;
    this.pool = pool;
    this.stream = stream;
    this.leasing = leasing;
    this.life = life;
  }

  /**
   * Acquire the lock `request.name` under the lease of `ttl` (arguments
   * already checked, the client open): wait for the local slot of (lease,
   * hold key: the name, or a read hold's), then Acquire; retry once on a new
   * lease when the lease is lost meanwhile.
   *
   * @param until - Clock reading (seconds) after which the wait ends; undefined waits until granted.
   * @param tryOnce - Fail with {@link LockHeld} instead of waiting.
   */
  async acquire(
    request: LockRequest,
    ttl: number,
    until: number | undefined,
    tryOnce: boolean,
    signal: AbortSignal | undefined,
  ): Promise<LockHandle> {
    const { name } = request;
    const key = holdKey(name, request.read);
    let retriesOnLostLease = 1;
    for (;;) {
      const lease = await this.leasing.leaseFor(ttl, until, signal);
      const slot = this.pool.slot(lease.leaseId, key);
      slot.users++;
      try {
        if (tryOnce) {
          if (slot.locked || slot.users > 1) {
            throw new LockHeld("lock is held by this client", {
              lockName: name,
              leaseId: lease.leaseId,
              holderLeaseId: lease.leaseId,
              holderToken: slot.holder?.token ?? 0n,
            });
          }
          await slot.take(undefined, signal);
        } else if (!(await slot.take(until, signal))) {
          throw new LockTimeout("lock is held by this client", { lockName: name, leaseId: lease.leaseId });
        }
        let handle: LockHandle;
        try {
          if (lease.lost) {
            slot.release();
            continue;
          }
          handle = await this.acquireRpc(lease, request, until, tryOnce, signal);
        } catch (err) {
          if (err instanceof LeaseLost && !signal?.aborted) {
            slot.release();
            this.pool.lose(lease, "LEASE_EXPIRED");
            if (retriesOnLostLease-- > 0) continue;
            throw err;
          }
          if (settled(err, signal) || lease.lost || !this.life.open) {
            slot.release();
            throw err;
          }
          // The Acquire may have queued a key, or been granted, for a caller
          // who will never know: withdraw it, keeping the slot taken until that
          // is done (a later local acquire of this name under this lease must
          // not be the one withdrawn). Wait for it a little, so that normally
          // nothing is left once we reject; it goes on in the background.
          const withdrawal = this.withdraw(lease, request, slot);
          this.life.spawn(withdrawal);
          await cleanUp(withdrawal);
          throw err;
        }
        slot.holder = handle;
        return handle;
      } finally {
        slot.users--;
        this.pool.dropSlotIfIdle(lease.leaseId, key);
      }
    }
  }

  /**
   * Delete this lease's key in lock `request.name` in its mode (Withdraw: a
   * queued wait, or a grant that never reached its caller), retried with
   * backoff while the lease lives and the client is open; then free `slot`.
   */
  private async withdraw(lease: Lease, request: LockRequest, slot: Slot): Promise<void> {
    const { name } = request;
    const backoff = delays();
    let rechecked = false;
    try {
      while (!lease.lost && this.life.open) {
        try {
          const resp = await this.transport.call(
            "Withdraw",
            (client) =>
              client.withdraw(
                { name, leaseId: lease.leaseId, mode: modeOf(request.read) },
                { timeoutMs: this.transport.connectTimeout * 1000, headers: owner(lease.secret) },
              ),
            { until: undefined, idempotent: true, context: { lockName: name, leaseId: lease.leaseId } },
          );
          if (resp.found || rechecked) return;
          // Nothing found: the aborted Acquire's own write may still be on its
          // way to etcd (the coordinator finishes it, then keeps the key 2 s).
          // Look once more, a little later.
          rechecked = true;
          await sleep(WITHDRAW_RECHECK_SECONDS, this.life.closeSignal);
          continue;
        } catch (err) {
          if (!(err instanceof Unavailable)) return; // LeaseLost: its keys went with it; else it ends with the lease
          try {
            await sleep(backoff.next().value, this.life.closeSignal);
          } catch {
            return; // closing
          }
        }
      }
    } finally {
      slot.release();
      this.pool.dropSlotIfIdle(lease.leaseId, holdKey(name, request.read));
    }
  }

  private async acquireRpc(
    lease: Lease,
    request: LockRequest,
    until: number | undefined,
    tryOnce: boolean,
    signal: AbortSignal | undefined,
  ): Promise<LockHandle> {
    const { name, read, lockDelay } = request;
    const resp = await this.transport.call(
      "Acquire",
      (client, left) => {
        const { waitMs, waitForever, timeoutMs } = waitFields(left, tryOnce, this.transport.connectTimeout);
        return client.acquire(
          { name, leaseId: lease.leaseId, waitMs, waitForever, lockDelaySeconds: BigInt(lockDelay), mode: modeOf(read) },
          { timeoutMs, signal, headers: owner(lease.secret) },
        );
      },
      { until, idempotent: true, context: { lockName: name, leaseId: lease.leaseId }, signal },
    );
    if (!resp.acquired) {
      const holderLeaseId = resp.holder?.leaseId ?? 0n;
      const holderToken = resp.holder?.token ?? 0n;
      if (!tryOnce) {
        throw new LockTimeout(`lock is held (lease ${holderLeaseId}, token ${holderToken})`, {
          lockName: name,
          leaseId: lease.leaseId,
        });
      }
      throw new LockHeld("lock is held", { lockName: name, leaseId: lease.leaseId, holderLeaseId, holderToken });
    }
    const handle = new LockHandle(name, lease, resp.token, (h) => this.release(h), read);
    if (lease.lost) {
      // The lease was declared lost while the Acquire was in flight: give the
      // grant back in the background and retry on a new lease.
      this.life.spawn(this.releaseRpc(handle, now() + this.transport.connectTimeout));
      throw new LeaseLost("the lease was lost while acquiring", {
        lockName: name,
        leaseId: lease.leaseId,
        reason: lease.lostReason ?? "LEASE_EXPIRED",
      });
    }
    lease.holds.set(handle._key, handle);
    this.stream.watch(handle);
    return handle;
  }

  /**
   * Release a hold. Concurrent calls share the one Release in flight (and
   * its outcome): a second Release of the same grant would be refused with
   * NOT_HOLDER and wrongly lose the hold. The hold stays valid until the
   * coordinator answers.
   */
  release(handle: LockHandle): Promise<void> {
    const inFlight = handle._releaseInFlight;
    if (inFlight !== undefined) return inFlight;
    if (handle.released) {
      return Promise.reject(new NotHolder("lock was already released", { lockName: handle.name, leaseId: handle.leaseId }));
    }
    if (this.life.state === "new" || this.life.state === "closed") {
      return Promise.reject(new FencepostError("client is closed", { lockName: handle.name, leaseId: handle.leaseId }));
    }
    const until = now() + this.transport.connectTimeout;
    if (handle.lostReason !== undefined) {
      const reason = handle.lostReason;
      // The server may not know yet: free the lock early, in the background.
      if (reason === REASON_DEADLINE) this.life.spawn(this.releaseRpc(handle, until));
      this.pool.finishRelease(handle);
      return Promise.reject(new LeaseLost("lock hold was lost before release", {
        lockName: handle.name,
        leaseId: handle.leaseId,
        reason,
      }));
    }
    const task = this.releaseRpc(handle, until).then(
      () => this.settleRelease(handle, undefined),
      (err: unknown) => this.settleRelease(handle, err),
    );
    handle._beginRelease(task);
    return task;
  }

  /** Apply the outcome of a Release (or ReleaseAll) call to the hold; rethrows its error. */
  settleRelease(handle: LockHandle, err: unknown): void {
    const ended = handle._endRelease();
    if (err === undefined) {
      this.pool.finishRelease(handle);
      this.stream.unwatch(handle);
      return;
    }
    if (err instanceof NotHolder || err instanceof StaleTokenError || err instanceof LeaseLost) {
      if (err instanceof LeaseLost) this.pool.lose(handle._lease, "LEASE_EXPIRED");
      this.pool.loseHold(handle, err.reason ?? "NOT_HOLDER");
      this.pool.finishRelease(handle);
      throw err;
    }
    if (ended === "LEASE_EXPIRED") this.pool.lose(handle._lease, ended);
    else if (ended !== undefined) this.pool.finishRelease(handle);
    throw err;
  }

  /**
   * One Release of a hold (a read hold's too) with the hold's request id, so that an attempt whose answer
   * was lost is sent again and answered as the first was (see {@link Transport.call}).
   */
  private async releaseRpc(handle: LockHandle, until: number): Promise<void> {
    const requestId = handle._releaseRequestId();
    await this.transport.call(
      "Release",
      (client, left) =>
        client.release(
          { name: handle.name, leaseId: handle.leaseId, token: handle.token, mode: modeOf(handle.read), requestId },
          { timeoutMs: this.transport.attemptTimeoutMs(left), headers: owner(handle.leaseSecret) },
        ),
      {
        until,
        idempotent: true,
        requestId,
        context: { lockName: handle.name, leaseId: handle.leaseId, token: handle.token },
      },
    );
  }
}

/**
 * The wait of an Acquire or AcquireAll attempt: `waitMs` and `waitForever` on
 * the wire, and the call's own deadline (`timeoutMs`: the wait plus a slack,
 * so that the coordinator's ACQUIRE_TIMEOUT answer comes first).
 *
 * @param left - Seconds left before the caller's deadline; undefined: none.
 * @param tryOnce - One try: no wait, a call deadline of `connectTimeout` seconds.
 */
export function waitFields(
  left: number | undefined,
  tryOnce: boolean,
  connectTimeout: number,
): { waitMs: bigint; waitForever: boolean; timeoutMs: number | undefined } {
  if (tryOnce) return { waitMs: 0n, waitForever: false, timeoutMs: connectTimeout * 1000 };
  if (left === undefined) return { waitMs: 0n, waitForever: true, timeoutMs: undefined };
  const ms = Math.min(Math.round(Math.max(0, left) * 1000), MAX_WAIT_MS);
  return { waitMs: BigInt(ms), waitForever: false, timeoutMs: ms + ACQUIRE_SLACK_SECONDS * 1000 };
}

/** Whether an Acquire (or AcquireAll) that failed with `err` is known to have left nothing in etcd (no withdrawal needed). */
export function settled(err: unknown, signal: AbortSignal | undefined): boolean {
  if (signal?.aborted) return false; // the call may have queued or been granted
  if (!(err instanceof FencepostError)) return false;
  if (err instanceof LockHeld || err instanceof InvalidArgument) return true;
  if (err.code === undefined) return err instanceof LockTimeout; // made here: "held" after one try; else no answer
  return err.reason !== undefined && SETTLED_REASONS.has(err.reason);
}
