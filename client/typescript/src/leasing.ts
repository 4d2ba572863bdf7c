/**
 * How a client gets, gives back and watches its leases: the one LeaseGrant
 * in flight per requested TTL, shared by the acquires that wait for it; the
 * LeaseRevoke of a lease nobody will use; the deadline watcher that loses a
 * lease once its local deadline passes.
 *
 * @module
 */

import { now } from "./backoff.js";
import { FencepostError } from "./errors.js";
import { Lease, type Grant, type LeasePool } from "./lease.js";
import type { Lifecycle } from "./lifecycle.js";
import type { KeepAliveStream } from "./stream.js";
import { owner, type Transport } from "./transport.js";
import { cleanUp, untilAborted } from "./waits.js";

/** The lease calls of one client and its deadline watcher; the client owns one. */
export class Leasing {
  private readonly transport: Transport;
  private readonly pool: LeasePool;
  private readonly stream: KeepAliveStream;
  private readonly life: Lifecycle;
  private deadlineTimer: NodeJS.Timeout | undefined;
  /** LeaseGrant calls in flight (close waits for them, so that a lease they grant is revoked). */
  private readonly granting = new Set<Promise<unknown>>();

  constructor(transport: Transport, pool: LeasePool, stream: KeepAliveStream, life: Lifecycle) {
    this.transport = transport;
    this.pool = pool;
    this.stream = stream;
    this.life = life;
    this.pool.onLeaseLost = () => this.armDeadlines();
  }

  /**
   * The live lease of `ttl`: the pool's, or the one a LeaseGrant (this
   * caller's, or one in flight that it joins) grants.
   *
   * @param until - Clock reading (seconds) after which to stop trying to reach a coordinator; undefined for none.
   * @throws the signal's reason when `signal` aborts (after waiting a little
   *   for the revocation of a lease granted for nobody).
   */
  async leaseFor(ttl: number, until: number | undefined, signal: AbortSignal | undefined): Promise<Lease> {
    for (;;) {
      const live = this.pool.live(ttl);
      if (live !== undefined) return live;
      signal?.throwIfAborted();
      const joined = this.pool.inFlight(ttl);
      const grant = joined ?? this.startGrant(ttl, until);
      grant.waiters++;
      let waiting = true;
      try {
        return await untilAborted(grant.promise, signal);
      } catch (err) {
        if (signal?.aborted) {
          // The LeaseGrant goes on: if nobody waits for it any more once it
          // answers, its lease is revoked (see startGrant). Wait for that, a
          // little, so that normally no lease is left once we reject.
          grant.waiters--;
          waiting = false;
          await cleanUp(grant.promise);
          throw signal.reason;
        }
        if (joined === undefined) throw err;
        // the other caller's grant failed: try our own
      } finally {
        if (waiting) grant.waiters--;
      }
    }
  }

  /**
   * Start the one LeaseGrant of a requested TTL. The call is not cancelled
   * with its callers: a lease granted for callers who all gave up, or once
   * the client is closing, is revoked, so that no lease the client does not
   * know is left to live for its TTL.
   */
  private startGrant(ttl: number, until: number | undefined): Grant {
    const grant: { promise: Promise<Lease>; waiters: number } = { promise: Promise.resolve(undefined as never), waiters: 0 };
    grant.promise = (async () => {
      const sent = now();
      let resp;
      try {
        resp = await this.transport.call(
          "LeaseGrant",
          (client) => client.leaseGrant({ ttlSeconds: BigInt(ttl) }, { timeoutMs: this.transport.connectTimeout * 1000 }),
          { until, idempotent: false },
        );
      } finally {
        this.pool.setInFlight(ttl, undefined);
      }
      const lease = new Lease(resp.leaseId, Math.max(Number(resp.ttlSeconds), ttl), sent, resp.leaseSecret);
      if (!this.life.open || grant.waiters <= 0) {
        await this.revokeQuietly(lease);
        const why = !this.life.open ? "client is closed" : "every acquire waiting for the lease was aborted";
        throw new FencepostError(why, { leaseId: lease.leaseId });
      }
      this.pool.add(ttl, lease);
      this.stream.startKeepalives(lease);
      this.armDeadlines();
      return lease;
    })();
    this.pool.setInFlight(ttl, grant);
    const tracked = grant.promise.catch(() => undefined);
    this.granting.add(tracked);
    void tracked.finally(() => this.granting.delete(tracked));
    return grant;
  }

  /** Settles once every LeaseGrant now in flight has (its lease kept, or revoked once the client is closing). */
  granted(): Promise<unknown> {
    return Promise.all([...this.granting]);
  }

  /**
   * Revoke `lease` (LeaseRevoke, presenting its secret).
   *
   * @param until - Clock reading (seconds) after which to stop trying.
   * @param timeoutSeconds - Deadline of each attempt.
   */
  revoke(lease: Lease, until: number, timeoutSeconds: number): Promise<unknown> {
    return this.transport.call(
      "LeaseRevoke",
      (client) =>
        client.leaseRevoke({ leaseId: lease.leaseId }, { timeoutMs: timeoutSeconds * 1000, headers: owner(lease.secret) }),
      { until, idempotent: true, context: { leaseId: lease.leaseId } },
    );
  }

  /** Revoke a lease the client does not keep; a failure is ignored (the lease then expires by its TTL). */
  private async revokeQuietly(lease: Lease): Promise<void> {
    try {
      await this.revoke(lease, now() + this.transport.connectTimeout, this.transport.connectTimeout);
    } catch {
      // it expires by its TTL
    }
  }

  /** Lose every lease past its local deadline, and wake again at the nearest one left (while the client is open). */
  private armDeadlines(): void {
    if (this.deadlineTimer !== undefined) clearTimeout(this.deadlineTimer);
    this.deadlineTimer = undefined;
    if (!this.life.open) return;
    const delay = this.pool.expire();
    if (delay !== undefined) this.deadlineTimer = setTimeout(() => this.armDeadlines(), delay * 1000 + 1);
  }

  /** Stop the deadline watcher (the client is closing). */
  stop(): void {
    if (this.deadlineTimer !== undefined) clearTimeout(this.deadlineTimer);
  }
}
