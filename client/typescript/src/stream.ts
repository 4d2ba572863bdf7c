/**
 * The keepalive stream: one bidirectional KeepAlive call for every lease and
 * hold of a client (the Python client's `_leases/stream.py`).
 *
 * Each lease sends a keepalive every `ttl * keepaliveFraction` seconds, each
 * hold is watched so that the coordinator reports its end (HoldEnded). What
 * a broken stream may have lost (a keepalive per lease, a watch per hold) is
 * sent again on the next one; leases and tokens do not change across a
 * reconnect. An acknowledgement is matched to its keepalive by request id
 * and moves that lease's deadline from the keepalive's send time; one with
 * TTL <= 0 loses the lease. A HoldEnded is matched by (name, lease id, token).
 *
 * Reconnects wait a delay drawn uniformly from [0, ceiling] (full jitter),
 * the ceiling growing from 0.05 s to 2 s but never above
 * {@link KeepAliveStream.reconnectCeiling}; the growth starts again once a
 * stream answers. When the server itself ends the stream (it is shutting
 * down, and all its clients reconnect at once) the ceiling is
 * `reconnectCeiling()` from the first attempt.
 *
 * @module
 */

import type { MessageInitShape } from "@bufbuild/protobuf";
import { ErrorReason, HoldKind, type HoldEnded, type KeepAliveRequestSchema, type KeepAliveResponse, type LeaseKeepAliveAck } from "./gen/fencepost/v1/lock_pb.js";
import { BACKOFF_BASE, BACKOFF_CAP, ceilings, now, sleep } from "./backoff.js";
import { fromConnectError } from "./errors.js";
import type { Lease, LeasePool } from "./lease.js";
import { holdKey, type LockHandle } from "./handle.js";
import type { Transport } from "./transport.js";

type Request = MessageInitShape<typeof KeepAliveRequestSchema>;

/** An unbounded queue read as an async iterable; `close()` ends the iteration. */
class Outbox implements AsyncIterable<Request> {
  private readonly items: Request[] = [];
  private wake: (() => void) | undefined;
  private closed = false;

  push(item: Request): void {
    if (this.closed) return;
    this.items.push(item);
    this.wake?.();
  }

  close(): void {
    this.closed = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Request> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.closed) return;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
  }
}

/** The reason name of an ErrorReason value (`NOT_HOLDER` when unset or unknown to this client). */
export function reasonName(reason: ErrorReason): string {
  const name = ErrorReason[reason];
  return reason === ErrorReason.ERROR_REASON_UNSPECIFIED || name === undefined ? "NOT_HOLDER" : name;
}

/** The WatchHold of a hold: a read hold is watched as HOLD_KIND_READ, a write hold as HOLD_KIND_LOCK. */
function watchOf(handle: LockHandle): { name: string; leaseId: bigint; token: bigint; kind: HoldKind } {
  const kind = handle.read ? HoldKind.READ : HoldKind.LOCK;
  return { name: handle.name, leaseId: handle.leaseId, token: handle.token, kind };
}

/** The client's KeepAlive stream: outbox, resend on reconnect, dispatch of what arrives. */
export class KeepAliveStream {
  private outbox: Outbox | undefined;
  /** request id -> (lease, clock reading when its keepalive was queued) */
  private readonly pending = new Map<bigint, { lease: Lease; sent: number }>();
  private nextRequestId = 1n;
  /** The round trip of the last keepalive acknowledged on this stream, whole ms (0: none yet): `lastRttMs`. */
  private lastRttMs = 0;
  private closing = false;
  private readonly stop = new AbortController();
  /** How many streams answered (for tests and logs). */
  opened = 0;

  constructor(
    private readonly transport: Transport,
    private readonly pool: LeasePool,
    private readonly fraction: number,
  ) {}

  private send(message: Request): void {
    this.outbox?.push(message);
  }

  /** Queue one keepalive of `lease`, remembering its send time under a new request id. */
  sendKeepalive(lease: Lease): void {
    if (this.outbox === undefined || lease.lost) return;
    const t = now();
    for (const [id, { lease: old, sent }] of this.pending) {
      if (sent + old.ttl < t) this.pending.delete(id);
    }
    const requestId = this.nextRequestId++;
    this.pending.set(requestId, { lease, sent: t });
    this.send({
      request: { case: "keepalive", value: { leaseId: lease.leaseId, requestId } },
      leaseSecret: lease.secret,
      lastRttMs: this.lastRttMs,
      sentMs: BigInt(Math.max(1, Math.floor(t * 1000))),
    });
  }

  /** Ask to be told (HoldEnded) when the hold ends. */
  watch(handle: LockHandle): void {
    this.send({ request: { case: "watch", value: watchOf(handle) }, leaseSecret: handle.leaseSecret });
  }

  /** Stop hearing about a released hold. */
  unwatch(handle: LockHandle): void {
    this.send({ request: { case: "unwatch", value: watchOf(handle) } });
  }

  private resendAll(): void {
    for (const lease of this.pool.leases()) {
      this.sendKeepalive(lease);
      for (const handle of lease.holds.values()) this.watch(handle);
    }
  }

  /** Send `lease`'s keepalives every `ttl * fraction` seconds until it is lost or the stream closes. */
  startKeepalives(lease: Lease): void {
    const period = lease.ttl * this.fraction * 1000;
    const tick = (): void => {
      if (lease.lost || this.closing) return;
      this.sendKeepalive(lease);
      lease.timer = setTimeout(tick, period);
    };
    tick();
  }

  private dispatch(response: KeepAliveResponse): void {
    if (response.response.case === "keepalive") this.onAck(response.response.value);
    else if (response.response.case === "holdEnded") this.onHoldEnded(response.response.value);
  }

  private onAck(ack: LeaseKeepAliveAck): void {
    const entry = this.pending.get(ack.requestId);
    if (entry === undefined) return;
    this.pending.delete(ack.requestId);
    const { lease, sent } = entry;
    if (lease.leaseId !== ack.leaseId) return;
    this.lastRttMs = Math.min(2 ** 32 - 1, Math.max(1, Math.round((now() - sent) * 1000)));
    if (lease.lost) return;
    if (!lease.onAck(sent, ack.ttlSeconds)) this.pool.lose(lease, "LEASE_EXPIRED");
  }

  private onHoldEnded(event: HoldEnded): void {
    if (event.kind !== HoldKind.LOCK && event.kind !== HoldKind.READ) return;
    const key = holdKey(event.name, event.kind === HoldKind.READ);
    const handle = this.pool.findHold(event.leaseId, key, event.token);
    if (handle === undefined) return;
    const reason = reasonName(event.reason);
    if (handle._holdEndedDuringRelease(reason)) return;
    if (reason === "LEASE_EXPIRED") this.pool.lose(handle._lease, reason);
    else this.pool.loseHold(handle, reason);
  }

  /**
   * The longest wait before the next attempt to reopen the stream, in seconds:
   * the backoff cap (2 s), but no more than half the keepalive period of the
   * shortest-lived lease and no less than the backoff base.
   */
  reconnectCeiling(): number {
    const ttls = this.pool.leases().filter((l) => !l.lost).map((l) => l.ttl);
    if (ttls.length === 0) return BACKOFF_CAP;
    return Math.max(BACKOFF_BASE, Math.min(BACKOFF_CAP, (Math.min(...ttls) * this.fraction) / 2));
  }

  /** Stop sending keepalives and end the stream. */
  close(): void {
    this.closing = true;
    this.stop.abort();
    this.outbox?.close();
  }

  /** Keep a stream open until {@link close}. Never throws. */
  async run(): Promise<void> {
    let growth = ceilings();
    while (!this.closing) {
      const position = this.transport.position;
      const outbox = new Outbox();
      let answered = false;
      let force = false;
      try {
        const client = this.transport.client();
        const responses = client.keepAlive(outbox, { signal: this.stop.signal });
        this.outbox = outbox;
        this.pending.clear();
        this.lastRttMs = 0;
        this.resendAll();
        for await (const response of responses) {
          if (!answered) {
            answered = true;
            this.opened++;
            growth = ceilings();
          }
          this.dispatch(response);
        }
        force = true; // the server ended the stream: try another one
      } catch (err) {
        if (this.closing) break;
        const reason = fromConnectError(err).reason;
        force = reason === "SHUTTING_DOWN" || reason === "DRAINING"; // stopping: the next address
      } finally {
        if (this.outbox === outbox) this.outbox = undefined;
        outbox.close();
      }
      if (this.closing) break;
      if (force) growth = (function* () { for (;;) yield BACKOFF_CAP; })() as Generator<number, never>;
      this.transport.rotate(position);
      try {
        await sleep(Math.random() * Math.min(growth.next().value, this.reconnectCeiling()), this.stop.signal);
      } catch {
        break;
      }
    }
  }
}
