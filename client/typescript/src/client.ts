/**
 * The Fencepost lock client for Node.js: the same shape and rules as the
 * Python `AsyncLockClient` (`client/_aio/`, `client/_recipes/`).
 *
 * {@link LockClient} checks the arguments of each call and wires its parts
 * together, each the one owner of its state:
 *
 * - {@link Transport} (`transport.ts`): addresses, connections, the unary
 *   call retry loop;
 * - {@link LeasePool} (`lease.ts`): leases by TTL, their holds and slots;
 * - {@link KeepAliveStream} (`stream.ts`): the one KeepAlive stream;
 * - {@link Lifecycle} (`lifecycle.ts`): new, open, closing, closed, and the
 *   background tasks;
 * - {@link Leasing} (`leasing.ts`): LeaseGrant and LeaseRevoke, the deadline
 *   watcher;
 * - {@link Holds} (`holds.ts`): the acquire loop, withdrawal, release;
 * - {@link MultiLocks} (`multilock.ts`): AcquireAll and ReleaseAll.
 *
 * The answers of the read calls are in `info.ts`.
 *
 * @module
 */

import { now } from "./backoff.js";
import { InvalidArgument } from "./errors.js";
import type { LockHandle } from "./handle.js";
import { Holds } from "./holds.js";
import {
  heldLockFromMessage,
  lockInfoFromResponse,
  serverInfoFromResponse,
  type HeldLock,
  type LockInfo,
  type ServerInfo,
} from "./info.js";
import { LeasePool } from "./lease.js";
import { Leasing } from "./leasing.js";
import { Lifecycle } from "./lifecycle.js";
import type { MultiLockHandle } from "./multihandle.js";
import { MultiLocks, checkNames } from "./multilock.js";
import { holdWhile } from "./scoped.js";
import { KeepAliveStream } from "./stream.js";
import { TlsFiles, type TlsOptions } from "./tls.js";
import { Transport } from "./transport.js";
import {
  DEFAULT_ADDRESS,
  checkAcquireOptions,
  checkAddresses,
  checkFraction,
  checkName,
  checkPositiveSeconds,
  checkRead,
  forbiddenProblem,
  lockDelayToWire,
} from "./validate.js";

/** Longest time `close()` spends on the server, in seconds. */
const CLOSE_BUDGET_SECONDS = 5.0;

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
  /**
   * Take a read hold (docs/rwlocks.md): shared with other readers, excluded by
   * a writer (any hold of the name without `read`), granted first come, first
   * served with the writers (a waiting writer blocks later readers). Its token
   * is its own; a later writer's token is larger than every earlier reader's.
   * No upgrade or downgrade. False by default.
   */
  read?: boolean;
  /**
   * Lock-delay in seconds, finite, 0 to 3600, rounded up to whole seconds; 0
   * (the default): none. If this hold ends because its lease expired or was
   * revoked (not by a release), the lock's next grant waits this long after
   * the end (docs/fencing.md, "Lock-delay"). A read hold takes none.
   */
  lockDelay?: number;
}

/** Options of {@link LockClient.tryAcquire}: those of {@link AcquireOptions} but the wait. */
export type TryAcquireOptions = Omit<AcquireOptions, "timeout">;

/** Options of {@link LockClient.acquireAll}: `ttl`, `timeout` and `signal` as for {@link LockClient.acquire}. */
export type AcquireAllOptions = Pick<AcquireOptions, "ttl" | "timeout" | "signal">;

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
  private readonly life = new Lifecycle();
  private readonly leasing: Leasing;
  private readonly holds: Holds;
  private readonly multiLocks: MultiLocks;
  private streamTask: Promise<void> | undefined;
  private closing: Promise<void> | undefined;

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
    const tls = options.tls === undefined ? undefined : new TlsFiles(options.tls);
    this.transport = new Transport(addresses, connectTimeout, tls);
    this.stream = new KeepAliveStream(this.transport, this.pool, fraction);
    this.leasing = new Leasing(this.transport, this.pool, this.stream, this.life);
    this.holds = new Holds(this.transport, this.pool, this.stream, this.leasing, this.life);
    this.multiLocks = new MultiLocks(this.transport, this.pool, this.stream, this.leasing, this.life, this.holds);
  }

  /** The coordinator addresses, in the order they are tried. */
  get addresses(): string[] {
    return this.transport.addresses.map((a) => a.text);
  }

  private ensureOpen(): void {
    if (this.life.start()) this.streamTask = this.stream.run();
  }

  // ------------------------------------------------------------------ acquire

  /**
   * Acquire the lock `name`, waiting up to `timeout` seconds.
   *
   * Contenders are granted first come, first served. A second local acquire
   * of a name this client holds under the same TTL waits for the local
   * holder to release it (within the same timeout).
   *
   * @param name - The lock name: 1 to 256 bytes of UTF-8, no character of the Unicode categories Cc, Cf, Zl, Zp.
   * @returns The handle of the grant, with its fencing token (a bigint); `handle.read` says its mode.
   * @throws {@link InvalidArgument} bad name (`name`), ttl (`ttl`), timeout
   *   (`timeout`), signal (`signal`), read (`read`) or lockDelay (`lockDelay`,
   *   also when given with `read`), before any call.
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
   * @param options - As for {@link acquire}, without `timeout`; with `read`,
   *   refused while a writer holds or waits.
   * @returns The handle of the grant.
   * @throws {@link LockHeld} the lock is held (by another client, or by this
   *   one under the same TTL); carries the holder's lease id and token.
   * @throws {@link InvalidArgument} bad name, ttl, read or lockDelay, before any call.
   * @throws {@link Unavailable} no coordinator reachable.
   */
  tryAcquire(name: string, options: TryAcquireOptions = {}): Promise<LockHandle> {
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
    return holdWhile(await this.acquire(name, options), fn);
  }

  // ------------------------------------------------------------------ multi-locks

  /**
   * Acquire every lock of `names` together, or none, waiting up to `timeout`
   * seconds (docs/multilocks.md). One etcd transaction queues the caller in
   * every lock at one revision, so no two callers deadlock whatever order
   * they give the names; each name gets its own fencing token. A timeout, an
   * abort or a failure leaves no key of any name.
   *
   * @param names - 2 to 32 distinct lock names, any order.
   * @returns The multi-lock's handle: `tokens` (name -> bigint), `tokenFor(name)`, `release()`, `lost`, `signal`.
   * @throws {@link InvalidArgument} bad names (field `names`), ttl, timeout or signal, before any call.
   * @throws {@link LockTimeout} not every name granted within `timeout`.
   * @throws {@link LeaseLost} the lease was lost, or a name's key was deleted, while waiting.
   * @throws {@link ResourceExhausted}, {@link Unavailable}, the signal's reason: as {@link acquire}.
   */
  acquireAll(names: readonly string[], options: AcquireAllOptions = {}): Promise<MultiLockHandle> {
    return this.acquireAllImpl(names, options, false);
  }

  /**
   * Acquire every lock of `names` if all are free now, else none, without waiting.
   *
   * @throws {@link LockHeld} a name is held (`lockName`: the first found held, with its holder's lease and
   *   token); nothing was taken.
   * @throws {@link InvalidArgument}, {@link Unavailable}: as {@link acquireAll}.
   */
  tryAcquireAll(names: readonly string[], options: Omit<AcquireAllOptions, "timeout"> = {}): Promise<MultiLockHandle> {
    return this.acquireAllImpl(names, options, true);
  }

  /**
   * Run `fn` while holding every lock of `names` (see {@link acquireAll}),
   * then release them all (one call). `handle.signal` (also the second
   * argument) aborts with a {@link LeaseLost} if any name is lost while `fn`
   * runs; `withLocks` then rejects with that LeaseLost, as {@link withLock}.
   *
   * @throws everything {@link acquireAll} and {@link MultiLockHandle.release} throw.
   */
  async withLocks<T>(
    names: readonly string[],
    options: AcquireAllOptions,
    fn: (handle: MultiLockHandle, signal: AbortSignal) => Promise<T> | T,
  ): Promise<T> {
    if (typeof fn !== "function") throw new InvalidArgument("fn must be a function", { field: "fn" });
    return holdWhile(await this.acquireAll(names, options), fn);
  }

  private async acquireAllImpl(names: readonly string[], options: AcquireAllOptions, tryOnce: boolean) {
    const checked = checkNames(names);
    const { ttl, until, signal } = checkAcquireOptions(options, tryOnce);
    this.ensureOpen();
    return this.multiLocks.acquire(checked, ttl, until, tryOnce, signal);
  }

  private async acquireImpl(
    name: string,
    options: AcquireOptions,
    tryOnce: boolean,
  ): Promise<LockHandle> {
    checkName(name);
    const { ttl, until, signal } = checkAcquireOptions(options, tryOnce);
    const lockDelay = lockDelayToWire(options.lockDelay ?? 0);
    const read = checkRead(options.read ?? false, lockDelay, name);
    this.ensureOpen();
    return this.holds.acquire({ name, read, lockDelay }, ttl, until, tryOnce, signal);
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
    return lockInfoFromResponse(name, resp);
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
    const problem = forbiddenProblem(prefix);
    if (problem !== undefined) throw new InvalidArgument(`prefix ${problem}`, { field: "prefix" });
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
      for (const info of resp.locks) locks.push(heldLockFromMessage(info, resp.revision));
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
    return serverInfoFromResponse(resp);
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
    const wasOpen = this.life.beginClose();
    if (wasOpen) {
      const until = now() + Math.min(this.transport.connectTimeout, CLOSE_BUDGET_SECONDS);
      const quietly = (work: Promise<unknown>): Promise<unknown> => {
        const budget = new Promise((resolve) => setTimeout(resolve, Math.max(0, until - now()) * 1000).unref());
        return Promise.race([work.catch(() => undefined), budget]);
      };
      await Promise.all(this.pool.holds().map((h) => quietly(this.holds.release(h))));
      // A LeaseGrant in flight revokes the lease it gets, the client being closed.
      await quietly(this.leasing.granted());
      await Promise.all(
        this.pool.leases().map((lease) => quietly(this.leasing.revoke(lease, until, CLOSE_BUDGET_SECONDS))),
      );
    }
    this.pool.close();
    this.stream.close();
    this.leasing.stop();
    this.transport.close();
    await this.streamTask;
    await this.life.finishClose();
  }
}
