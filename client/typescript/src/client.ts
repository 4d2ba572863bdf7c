/**
 * The Fencepost lock client for Node.js: the same shape and rules as the
 * Python `AsyncLockClient` (`client/_aio/`, `client/_recipes/`).
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
import { LockHandle } from "./handle.js";
import { Lease, LeasePool, type Grant, type Slot } from "./lease.js";
import { KeepAliveStream } from "./stream.js";
import { readTls, type TlsOptions } from "./tls.js";
import { Transport } from "./transport.js";
import {
  DEFAULT_ADDRESS,
  checkAddresses,
  checkFraction,
  checkName,
  checkPositiveSeconds,
  checkTimeout,
  ttlToWire,
} from "./validate.js";

/** Slack added to the deadline of a bounded Acquire, in seconds, so that the coordinator's own ACQUIRE_TIMEOUT answer arrives first. */
const ACQUIRE_SLACK_SECONDS = 1.0;
/** Longest time `close()` spends on the server, in seconds. */
const CLOSE_BUDGET_SECONDS = 5.0;
/** Longest acquire wait on the wire, in milliseconds. */
const MAX_WAIT_MS = 86_400_000;
/**
 * Longest time an aborted call waits for its clean-up (a Withdraw, a
 * LeaseRevoke) before it rejects, in seconds; the clean-up goes on after that.
 */
const CLEANUP_WAIT_SECONDS = 1.0;
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
const SETTLED_REASONS = new Set(["INVALID_FIELD", "ACQUIRE_TIMEOUT", "LEASE_EXPIRED", "TOO_MANY_WAITERS", "LIMIT_EXCEEDED"]);

/** Options of a {@link LockClient}. */
export interface ClientOptions {
  /** TLS settings (PEM file paths, read when the client is made); undefined for plaintext. */
  tls?: TlsOptions;
  /** Keepalive period as a fraction of the granted TTL, in (0, 0.5]; 1/3 by default. */
  keepaliveFraction?: number;
  /** Seconds to keep trying to reach a coordinator, for each call; finite, > 0; 10 by default. */
  connectTimeout?: number;
}

/** Options of {@link LockClient.acquire}. */
export interface AcquireOptions {
  /** Lease TTL in seconds, finite, 1 to 86400, rounded up to whole seconds; 10 by default. The server may grant more (`handle.ttl`). */
  ttl?: number;
  /** Seconds to wait for the lock, 0 to 86400 (0 tries once, failing with LockTimeout); undefined waits until granted. */
  timeout?: number;
  /**
   * Aborts the wait: the acquire rejects with the signal's reason and leaves
   * nothing behind. A queued wait or a grant it may have left is withdrawn
   * (Withdraw), and a lease granted for it alone is revoked; the rejection
   * comes once that is done (after 1 s at most; it then goes on in the
   * background).
   */
  signal?: AbortSignal;
}

/** A snapshot of one lock, from {@link LockClient.describe}. */
export interface LockInfo {
  name: string;
  held: boolean;
  holderLeaseId: bigint;
  token: bigint;
  /** Seconds left on the holder's lease as etcd reports it (a lower bound), -1 when not held. */
  ttlRemaining: number;
  waiterCount: number;
}

/** One held lock, from {@link LockClient.listLocks}. */
export interface HeldLock {
  name: string;
  holderLeaseId: bigint;
  /** The holder's fencing token. */
  token: bigint;
  /** Seconds left on the holder's lease as etcd reported it (a lower bound only); undefined when the lease ended meanwhile. */
  ttlRemaining: number | undefined;
  /** The holder lease's granted TTL in seconds (0 when it ended). */
  ttl: number;
  /** Seconds since the grant; undefined when the coordinator that answered did not make the grant. */
  heldFor: number | undefined;
  /** How many contenders are queued behind the holder. */
  waiterCount: number;
  /** The etcd revision of the listing. */
  revision: bigint;
}

/** The etcd a coordinator uses, as it saw it, from {@link LockClient.serverInfo}. */
export interface EtcdInfo {
  /** The etcd endpoints as the coordinator was configured with them (never with credentials). */
  endpoints: string[];
  /** Whether the coordinator runs its own etcd. */
  embedded: boolean;
  /** Whether etcd answered; when false, the fields below `error` are undefined. */
  available: boolean;
  /** Why etcd did not answer, or why its Status call failed while the read worked. */
  error: string | undefined;
  /** The answering etcd member's version ("3.5.1"). */
  serverVersion: string | undefined;
  clusterId: bigint | undefined;
  /** The id of the etcd member that answered. */
  memberId: bigint | undefined;
  /** The etcd revision when the coordinator read it. */
  revision: bigint | undefined;
  raftTerm: bigint | undefined;
  /** The raft leader's member id; undefined when unknown or there is none. */
  leader: bigint | undefined;
  raftIndex: bigint | undefined;
  /** The answering member's database size in bytes. */
  dbSize: number | undefined;
}

/**
 * One coordinator's version, identity, addresses, readiness, etcd and counts,
 * from {@link LockClient.serverInfo}. Counts marked "this coordinator" are of
 * the replica that answered; "cluster-wide" ones are read from etcd.
 */
export interface ServerInfo {
  /** The coordinator's fencepost version. */
  version: string;
  /** Random hex, new at each coordinator process start. */
  instanceId: string;
  /** Seconds since the coordinator started serving. */
  uptime: number;
  listenAddress: string;
  /** Its plaintext health-only listener; undefined without one. */
  healthAddress: string | undefined;
  /** HOST:PORT of its /metrics endpoint; undefined without one. */
  metricsAddress: string | undefined;
  keyPrefix: string;
  /** Its readiness: true when its health is SERVING. */
  serving: boolean;
  etcd: EtcdInfo;
  /** This coordinator: KeepAlive streams open. */
  keepaliveStreams: number;
  /** This coordinator: leases kept alive through the open streams. */
  keepaliveLeases: number;
  /** This coordinator: holds the open streams watch for their end. */
  watchedHolds: number;
  /** This coordinator: Acquire calls waiting for a lock. */
  waitingAcquires: number;
  /** Cluster-wide: lock keys under the prefix (holders and waiters); undefined when etcd did not answer. */
  contenderKeys: number | undefined;
  /** Cluster-wide: held locks; undefined when etcd did not answer or past 1000 lock keys. */
  heldLocks: number | undefined;
  /** Cluster-wide: contenders queued behind a holder; undefined when `heldLocks` is. */
  waiters: number | undefined;
}

/**
 * A client of Fencepost coordinators: locks with fencing tokens.
 *
 * It keeps one lease per distinct TTL for all its locks of that TTL, and one
 * KeepAlive stream for all its leases, renewing each about every
 * `ttl * keepaliveFraction` seconds. A lease whose local deadline (send time
 * of the last acknowledged keepalive + TTL - margin, margin = min(1, max(0.1,
 * 0.1 * ttl)) s) passes, or that the server reports gone, is lost with all its
 * holds: each handle's `lost` settles and its `signal` aborts. When the
 * stream breaks the client reconnects with jittered backoff, trying the
 * addresses in turn; leases and tokens are unchanged by a reconnect.
 *
 * A TTL alone is not mutual exclusion: send `handle.token` with every write
 * and let the storage refuse a lower one (see `@fencepost/client/fencing`).
 *
 * @example
 * ```ts
 * const client = new LockClient(["10.0.0.5:7420", "10.0.0.6:7420"]);
 * await client.withLock("inv:42", { ttl: 10, timeout: 5 }, async (handle) => {
 *   await guard.updateWithFencing(42, { total: 100 }, handle.token);
 * });
 * await client.close();
 * ```
 */
export class LockClient {
  private readonly transport: Transport;
  private readonly pool = new LeasePool();
  private readonly stream: KeepAliveStream;
  private state: "new" | "open" | "closing" | "closed" = "new";
  private streamTask: Promise<void> | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private closing: Promise<void> | undefined;
  private readonly background = new Set<Promise<unknown>>();
  /** LeaseGrant calls in flight (close waits for them, so that a lease they grant is revoked). */
  private readonly granting = new Set<Promise<unknown>>();
  /** Aborted when the client starts closing: stops the backoff sleeps of background clean-ups. */
  private readonly closeController = new AbortController();

  /**
   * Make a client; nothing is contacted until the first call.
   *
   * @param address - `HOST:PORT` of a coordinator, or several (an array or a
   *   comma-separated string), tried in turn: a host name, IPv4 or `[IPv6]`
   *   with a port, `dns:///HOST:PORT`, or `unix:/ABSOLUTE/PATH`.
   * @throws {@link InvalidArgument} a bad address (field `address`), option
   *   (`keepaliveFraction`, `connectTimeout`) or TLS file (`tls.ca`, `tls.cert`, `tls.key`).
   */
  constructor(address: string | readonly string[] = DEFAULT_ADDRESS, options: ClientOptions = {}) {
    if (typeof options !== "object" || options === null) {
      throw new InvalidArgument("options must be an object", { field: "options" });
    }
    const addresses = checkAddresses(address);
    const fraction = checkFraction(options.keepaliveFraction ?? 1 / 3);
    const connectTimeout = checkPositiveSeconds(options.connectTimeout ?? 10, "connectTimeout");
    const tls = readTls(options.tls);
    this.transport = new Transport(addresses, connectTimeout, tls);
    this.stream = new KeepAliveStream(this.transport, this.pool, fraction);
    this.pool.onLeaseLost = () => this.armDeadlines();
  }

  /** The coordinator addresses, in the order they are tried. */
  get addresses(): string[] {
    return this.transport.addresses.map((a) => a.text);
  }

  private ensureOpen(): void {
    if (this.state === "new") {
      this.state = "open";
      this.streamTask = this.stream.run();
    } else if (this.state !== "open") {
      throw new FencepostError("client is closed");
    }
  }

  private armDeadlines(): void {
    if (this.deadlineTimer !== undefined) clearTimeout(this.deadlineTimer);
    this.deadlineTimer = undefined;
    if (this.state !== "open") return;
    const delay = this.pool.expire();
    if (delay !== undefined) this.deadlineTimer = setTimeout(() => this.armDeadlines(), delay * 1000 + 1);
  }

  private spawn(work: Promise<unknown>): void {
    const task = work.catch(() => undefined);
    this.background.add(task);
    void task.finally(() => this.background.delete(task));
  }

  // ------------------------------------------------------------------ leases

  private async leaseFor(ttl: number, until: number | undefined, signal: AbortSignal | undefined): Promise<Lease> {
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
          await this.cleanUp(grant.promise);
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
      if (this.state !== "open" || grant.waiters <= 0) {
        await this.revokeQuietly(lease.leaseId, lease.secret);
        const why = this.state !== "open" ? "client is closed" : "every acquire waiting for the lease was aborted";
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

  /** Revoke a lease the client does not keep; a failure is ignored (the lease then expires by its TTL). */
  private async revokeQuietly(leaseId: bigint, secret: string): Promise<void> {
    try {
      await this.transport.call(
        "LeaseRevoke",
        (client) =>
          client.leaseRevoke({ leaseId }, { timeoutMs: this.transport.connectTimeout * 1000, headers: owner(secret) }),
        { until: now() + this.transport.connectTimeout, idempotent: true, context: { leaseId } },
      );
    } catch {
      // it expires by its TTL
    }
  }

  /** Wait for a clean-up (already running) up to CLEANUP_WAIT_SECONDS; it goes on after that. */
  private async cleanUp(work: Promise<unknown>): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const budget = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, CLEANUP_WAIT_SECONDS * 1000);
    });
    try {
      await Promise.race([work.catch(() => undefined), budget]);
    } finally {
      clearTimeout(timer);
    }
  }

  // ------------------------------------------------------------------ acquire

  /**
   * Acquire the lock `name`, waiting up to `timeout` seconds.
   *
   * Contenders are granted first come, first served. A second local acquire
   * of a name this client holds under the same TTL waits for the local
   * holder to release it (within the same timeout).
   *
   * @param name - The lock name: 1 to 256 bytes of UTF-8, no control characters.
   * @returns The handle of the grant, with its fencing token (a bigint).
   * @throws {@link InvalidArgument} bad name (`name`), ttl (`ttl`), timeout
   *   (`timeout`) or signal (`signal`), before any call.
   * @throws {@link LockTimeout} not granted within `timeout`.
   * @throws {@link LeaseLost} the lease was lost while waiting, twice in a row.
   * @throws {@link ResourceExhausted} too many waiters on the coordinator.
   * @throws {@link Unavailable} no coordinator reachable within `connectTimeout`.
   * @throws the signal's reason when `signal` aborts.
   */
  acquire(name: string, options: AcquireOptions = {}): Promise<LockHandle> {
    return this.acquireImpl(name, options, false);
  }

  /**
   * Acquire the lock `name` if it is free, without waiting.
   *
   * @param options.ttl - Lease TTL in seconds, as for {@link acquire}.
   * @returns The handle of the grant.
   * @throws {@link LockHeld} the lock is held (by another client, or by this
   *   one under the same TTL); carries the holder's lease id and token.
   * @throws {@link InvalidArgument} bad name or ttl, before any call.
   * @throws {@link Unavailable} no coordinator reachable.
   */
  tryAcquire(name: string, options: { ttl?: number; signal?: AbortSignal } = {}): Promise<LockHandle> {
    return this.acquireImpl(name, options, true);
  }

  /**
   * Run `fn` while holding the lock `name`, then release it.
   *
   * `fn` gets the handle; `handle.signal` (also the second argument) is
   * aborted with a {@link LeaseLost} if the hold is lost while `fn` runs:
   * pass it to the work. If the hold was lost, `withLock` rejects with that
   * LeaseLost (whether `fn` noticed or not); otherwise with what `fn` threw,
   * or it resolves with `fn`'s result once the lock is released.
   *
   * @throws everything {@link acquire} and {@link LockHandle.release} throw,
   *   and {@link LeaseLost} when the hold was lost before `fn` ended.
   */
  async withLock<T>(
    name: string,
    options: AcquireOptions,
    fn: (handle: LockHandle, signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    if (typeof fn !== "function") throw new InvalidArgument("fn must be a function", { field: "fn" });
    const handle = await this.acquire(name, options);
    let result: T;
    try {
      result = await fn(handle, handle.signal);
    } catch (err) {
      await this.releaseQuietly(handle);
      if (handle.lostReason !== undefined) throw handle.signal.reason as LeaseLost;
      throw err;
    }
    if (handle.lostReason !== undefined) {
      await this.releaseQuietly(handle);
      throw handle.signal.reason as LeaseLost;
    }
    await handle.release();
    return result;
  }

  private async acquireImpl(
    name: string,
    options: AcquireOptions,
    tryOnce: boolean,
  ): Promise<LockHandle> {
    checkName(name);
    if (typeof options !== "object" || options === null) {
      throw new InvalidArgument("options must be an object", { field: "options" });
    }
    const ttl = ttlToWire(options.ttl ?? 10);
    const timeout = tryOnce ? undefined : checkTimeout(options.timeout);
    const signal = options.signal;
    if (signal !== undefined && !(signal instanceof AbortSignal)) {
      throw new InvalidArgument("signal must be an AbortSignal", { field: "signal" });
    }
    signal?.throwIfAborted();
    this.ensureOpen();
    const until = timeout === undefined ? undefined : now() + timeout;
    let retriesOnLostLease = 1;
    for (;;) {
      const lease = await this.leaseFor(ttl, until, signal);
      const slot = this.pool.slot(lease.leaseId, name);
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
          handle = await this.acquireRpc(lease, name, until, tryOnce, signal);
        } catch (err) {
          if (err instanceof LeaseLost && !signal?.aborted) {
            slot.release();
            this.pool.lose(lease, "LEASE_EXPIRED");
            if (retriesOnLostLease-- > 0) continue;
            throw err;
          }
          if (settled(err, signal) || lease.lost || this.state !== "open") {
            slot.release();
            throw err;
          }
          // The Acquire may have queued a key, or been granted, for a caller
          // who will never know: withdraw it, keeping the slot taken until that
          // is done (a later local acquire of this name under this lease must
          // not be the one withdrawn). Wait for it a little, so that normally
          // nothing is left once we reject; it goes on in the background.
          const withdrawal = this.withdraw(lease, name, slot);
          this.spawn(withdrawal);
          await this.cleanUp(withdrawal);
          throw err;
        }
        slot.holder = handle;
        return handle;
      } finally {
        slot.users--;
        this.pool.dropSlotIfIdle(lease.leaseId, name);
      }
    }
  }

  /**
   * Delete this lease's key in lock `name` (Withdraw: a queued wait, or a
   * grant that never reached its caller), retried with backoff while the
   * lease lives and the client is open; then free `slot`.
   */
  private async withdraw(lease: Lease, name: string, slot: Slot): Promise<void> {
    const backoff = delays();
    let rechecked = false;
    try {
      while (!lease.lost && this.state === "open") {
        try {
          const resp = await this.transport.call(
            "Withdraw",
            (client) =>
              client.withdraw(
                { name, leaseId: lease.leaseId },
                { timeoutMs: this.transport.connectTimeout * 1000, headers: owner(lease.secret) },
              ),
            { until: undefined, idempotent: true, context: { lockName: name, leaseId: lease.leaseId } },
          );
          if (resp.found || rechecked) return;
          // Nothing found: the aborted Acquire's own write may still be on its
          // way to etcd (the coordinator finishes it, then keeps the key 2 s).
          // Look once more, a little later.
          rechecked = true;
          await sleep(WITHDRAW_RECHECK_SECONDS, this.closeController.signal);
          continue;
        } catch (err) {
          if (!(err instanceof Unavailable)) return; // LeaseLost: its keys went with it; else it ends with the lease
          try {
            await sleep(backoff.next().value, this.closeController.signal);
          } catch {
            return; // closing
          }
        }
      }
    } finally {
      slot.release();
      this.pool.dropSlotIfIdle(lease.leaseId, name);
    }
  }

  private async acquireRpc(
    lease: Lease,
    name: string,
    until: number | undefined,
    tryOnce: boolean,
    signal: AbortSignal | undefined,
  ): Promise<LockHandle> {
    const resp = await this.transport.call(
      "Acquire",
      (client, left) => {
        let waitMs = 0n;
        let waitForever = false;
        let timeoutMs: number | undefined;
        if (tryOnce) timeoutMs = this.transport.connectTimeout * 1000;
        else if (left === undefined) waitForever = true;
        else {
          const ms = Math.min(Math.round(Math.max(0, left) * 1000), MAX_WAIT_MS);
          waitMs = BigInt(ms);
          timeoutMs = ms + ACQUIRE_SLACK_SECONDS * 1000;
        }
        return client.acquire(
          { name, leaseId: lease.leaseId, waitMs, waitForever },
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
    const handle = new LockHandle(name, lease, resp.token, (h) => this.release(h));
    if (lease.lost) {
      // The lease was declared lost while the Acquire was in flight: give the
      // grant back in the background and retry on a new lease.
      this.spawn(this.releaseRpc(handle, now() + this.transport.connectTimeout));
      throw new LeaseLost("the lease was lost while acquiring", {
        lockName: name,
        leaseId: lease.leaseId,
        reason: lease.lostReason ?? "LEASE_EXPIRED",
      });
    }
    lease.holds.set(name, handle);
    this.stream.watch(handle);
    return handle;
  }

  // ------------------------------------------------------------------ release

  /**
   * Release a hold. Concurrent calls share the one Release in flight (and
   * its outcome): a second Release of the same grant would be refused with
   * NOT_HOLDER and wrongly lose the hold. The hold stays valid until the
   * coordinator answers.
   */
  private release(handle: LockHandle): Promise<void> {
    if (handle._releaseTask !== undefined) return handle._releaseTask;
    if (handle.released) {
      return Promise.reject(new NotHolder("lock was already released", { lockName: handle.name, leaseId: handle.leaseId }));
    }
    if (this.state === "new" || this.state === "closed") {
      return Promise.reject(new FencepostError("client is closed", { lockName: handle.name, leaseId: handle.leaseId }));
    }
    const until = now() + this.transport.connectTimeout;
    if (handle.lostReason !== undefined) {
      const reason = handle.lostReason;
      // The server may not know yet: free the lock early, in the background.
      if (reason === REASON_DEADLINE) this.spawn(this.releaseRpc(handle, until));
      this.pool.finishRelease(handle);
      return Promise.reject(new LeaseLost("lock hold was lost before release", {
        lockName: handle.name,
        leaseId: handle.leaseId,
        reason,
      }));
    }
    handle._releasing = true;
    const task = this.releaseRpc(handle, until).then(
      () => this.settleRelease(handle, undefined),
      (err: unknown) => this.settleRelease(handle, err),
    );
    handle._releaseTask = task;
    return task;
  }

  /** Apply the outcome of a Release call to the hold; rethrows its error. */
  private settleRelease(handle: LockHandle, err: unknown): void {
    handle._releaseTask = undefined;
    handle._releasing = false;
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
    const ended = handle._endedDuringRelease;
    if (ended === "LEASE_EXPIRED") this.pool.lose(handle._lease, ended);
    else if (ended !== undefined) this.pool.finishRelease(handle);
    throw err;
  }

  private async releaseRpc(handle: LockHandle, until: number): Promise<void> {
    await this.transport.call(
      "Release",
      (client) =>
        client.release(
          { name: handle.name, leaseId: handle.leaseId, token: handle.token },
          { timeoutMs: this.transport.connectTimeout * 1000, headers: owner(handle.leaseSecret) },
        ),
      {
        until,
        idempotent: false,
        context: { lockName: handle.name, leaseId: handle.leaseId, token: handle.token },
      },
    );
  }

  private async releaseQuietly(handle: LockHandle): Promise<void> {
    try {
      await handle.release();
    } catch {
      // released or lost either way
    }
  }

  // ------------------------------------------------------------------ describe

  /**
   * Report the holder, fencing token, waiters and TTL left of one lock.
   *
   * @throws {@link InvalidArgument} bad name.
   * @throws {@link Unavailable} no coordinator reachable.
   */
  async describe(name: string): Promise<LockInfo> {
    checkName(name);
    this.ensureOpen();
    const resp = await this.transport.call(
      "Describe",
      (client) => client.describe({ name }, { timeoutMs: this.transport.connectTimeout * 1000 }),
      { until: undefined, idempotent: true, context: { lockName: name } },
    );
    return {
      name,
      held: resp.held,
      holderLeaseId: resp.holder?.leaseId ?? 0n,
      token: resp.holder?.token ?? 0n,
      ttlRemaining: Number(resp.ttlRemainingSeconds),
      waiterCount: Number(resp.waiterCount),
    };
  }

  /**
   * List every held lock whose name starts with `prefix`, reading all pages.
   *
   * @param prefix - The name prefix; "" (the default) lists every lock.
   * @param options.pageSize - Locks per ListLocks call, 1 to 1000; 0 (the
   *   default) lets the coordinator choose (100).
   * @returns The held locks in the order of their etcd keys, all read at the
   *   revision of the first page (TTLs as etcd reported them per page).
   * @throws {@link InvalidArgument} bad prefix or page size (`field` names it).
   * @throws {@link Unavailable} no coordinator reachable.
   */
  async listLocks(prefix = "", options: { pageSize?: number } = {}): Promise<HeldLock[]> {
    if (typeof prefix !== "string") throw new InvalidArgument("prefix must be a string", { field: "prefix" });
    if (typeof options !== "object" || options === null) {
      throw new InvalidArgument("options must be an object", { field: "options" });
    }
    const pageSize = options.pageSize ?? 0;
    if (!Number.isInteger(pageSize) || pageSize < 0 || pageSize > 1000) {
      throw new InvalidArgument("pageSize must be an integer from 0 to 1000", { field: "pageSize" });
    }
    this.ensureOpen();
    const locks: HeldLock[] = [];
    let pageToken = "";
    for (;;) {
      const request = { prefix, pageSize, pageToken };
      const resp = await this.transport.call(
        "ListLocks",
        (client) => client.listLocks(request, { timeoutMs: this.transport.connectTimeout * 1000 }),
        { until: undefined, idempotent: true },
      );
      for (const info of resp.locks) {
        locks.push({
          name: info.name,
          holderLeaseId: info.holder?.leaseId ?? 0n,
          token: info.holder?.token ?? 0n,
          ttlRemaining: info.ttlRemainingSeconds >= 0n ? Number(info.ttlRemainingSeconds) : undefined,
          ttl: Number(info.ttlSeconds),
          heldFor: info.heldSeconds >= 0 ? info.heldSeconds : undefined,
          waiterCount: Number(info.waiterCount),
          revision: resp.revision,
        });
      }
      pageToken = resp.nextPageToken;
      if (!pageToken) return locks;
    }
  }

  /**
   * Report on the coordinator currently used: version, uptime, addresses,
   * etcd, counts. Answers also while etcd is out of reach (`etcd.available`
   * is then false and `etcd.error` says why): the coordinator gives etcd at
   * most 2 s.
   *
   * @throws {@link Unavailable} no coordinator reachable.
   * @throws {@link FencepostError} with code UNIMPLEMENTED: the coordinator
   *   is older than ServerInfo, or not a coordinator.
   */
  async serverInfo(): Promise<ServerInfo> {
    this.ensureOpen();
    const resp = await this.transport.call(
      "ServerInfo",
      (client) => client.serverInfo({}, { timeoutMs: this.transport.connectTimeout * 1000 }),
      { until: undefined, idempotent: true },
    );
    const e = resp.etcd;
    const up = e?.available ?? false;
    const known = (value: bigint | undefined): bigint | undefined => (up && value ? value : undefined);
    const count = (value: bigint): number | undefined => (up && value >= 0n ? Number(value) : undefined);
    return {
      version: resp.version,
      instanceId: resp.instanceId,
      uptime: resp.uptimeSeconds,
      listenAddress: resp.listenAddress,
      healthAddress: resp.healthAddress || undefined,
      metricsAddress: resp.metricsAddress || undefined,
      keyPrefix: resp.keyPrefix,
      serving: resp.serving,
      etcd: {
        endpoints: [...(e?.endpoints ?? [])],
        embedded: e?.embedded ?? false,
        available: up,
        error: e?.error || undefined,
        serverVersion: up ? e?.serverVersion || undefined : undefined,
        clusterId: up ? e?.clusterId : undefined,
        memberId: up ? e?.memberId : undefined,
        revision: up ? e?.revision : undefined,
        raftTerm: up ? e?.raftTerm : undefined,
        leader: known(e?.leader),
        raftIndex: known(e?.raftIndex),
        dbSize: up && e?.dbSizeBytes ? Number(e.dbSizeBytes) : undefined,
      },
      keepaliveStreams: Number(resp.keepaliveStreams),
      keepaliveLeases: Number(resp.keepaliveLeases),
      watchedHolds: Number(resp.watchedHolds),
      waitingAcquires: Number(resp.waitingAcquires),
      contenderKeys: count(resp.contenderKeys),
      heldLocks: count(resp.heldLocks),
      waiters: count(resp.waiters),
    };
  }

  // ------------------------------------------------------------------ close

  /**
   * Release every held lock, revoke the leases, stop the stream, close the
   * connections. Spends at most about 5 s on the server (errors are
   * ignored: leases that could not be revoked expire by their TTL). Handles
   * still held become released. Idempotent.
   */
  close(): Promise<void> {
    if (this.closing === undefined) this.closing = this.closeImpl();
    return this.closing;
  }

  /** `await using client = new LockClient(...)` closes it. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  private async closeImpl(): Promise<void> {
    const wasOpen = this.state === "open";
    this.state = "closing";
    this.closeController.abort();
    if (wasOpen) {
      const until = now() + Math.min(this.transport.connectTimeout, CLOSE_BUDGET_SECONDS);
      const quietly = (work: Promise<unknown>): Promise<unknown> => {
        const budget = new Promise((resolve) => setTimeout(resolve, Math.max(0, until - now()) * 1000).unref());
        return Promise.race([work.catch(() => undefined), budget]);
      };
      await Promise.all(this.pool.holds().map((h) => quietly(this.release(h))));
      // A LeaseGrant in flight revokes the lease it gets, the client being closed.
      await quietly(Promise.all([...this.granting]));
      await Promise.all(
        this.pool.leases().map((lease) =>
          quietly(
            this.transport.call(
              "LeaseRevoke",
              (client) =>
                client.leaseRevoke(
                  { leaseId: lease.leaseId },
                  { timeoutMs: CLOSE_BUDGET_SECONDS * 1000, headers: owner(lease.secret) },
                ),
              { until, idempotent: true, context: { leaseId: lease.leaseId } },
            ),
          ),
        ),
      );
    }
    this.pool.close();
    this.stream.close();
    if (this.deadlineTimer !== undefined) clearTimeout(this.deadlineTimer);
    this.transport.close();
    await this.streamTask;
    await Promise.all([...this.background]);
    this.state = "closed";
  }
}

/** Whether an Acquire that failed with `err` is known to have left nothing in etcd (no withdrawal needed). */
function settled(err: unknown, signal: AbortSignal | undefined): boolean {
  if (signal?.aborted) return false; // the call may have queued or been granted
  if (!(err instanceof FencepostError)) return false;
  if (err instanceof LockHeld || err instanceof InvalidArgument) return true;
  if (err.code === undefined) return err instanceof LockTimeout; // made here: "held" after one try; else no answer
  return err.reason !== undefined && SETTLED_REASONS.has(err.reason);
}

/** `work`, or the signal's reason as soon as `signal` aborts (`work` goes on). */
function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (signal === undefined) return work;
  if (signal.aborted) return Promise.reject(signal.reason as unknown);
  return new Promise<T>((resolve, reject) => {
    const aborted = (): void => reject(signal.reason as unknown);
    signal.addEventListener("abort", aborted, { once: true });
    work.then(
      (value) => {
        signal.removeEventListener("abort", aborted);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener("abort", aborted);
        reject(err);
      },
    );
  });
}

/** The metadata presenting a lease's secret (gRPC metadata `fencepost-lease-secret`); none for "". */
function owner(secret: string): Record<string, string> {
  return secret ? { "fencepost-lease-secret": secret } : {};
}
