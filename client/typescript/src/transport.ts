/**
 * Connections to the coordinators: one HTTP/2 session per address (Connect-ES
 * gRPC transport), tried in turn, and the retry rule of every unary call
 * (the Python client's `_transport/`):
 *
 * - idempotent calls (Acquire, LeaseRevoke, Withdraw, Describe, ListLocks) that fail with
 *   UNAVAILABLE are retried on the next address;
 * - LeaseGrant is retried only while no connection could be made (the
 *   request cannot have reached a server); once sent, an UNAVAILABLE answer
 *   is thrown;
 * - a call given a request id (Release: the coordinator answers a retry of
 *   an applied request id as the first attempt was answered) gets at most a
 *   third of `connectTimeout` (at least {@link MIN_ATTEMPT_SECONDS}) per
 *   attempt, and an attempt whose answer is lost (UNAVAILABLE,
 *   DEADLINE_EXCEEDED, or Connect-ES's ABORTED, INTERNAL or CANCELED of a
 *   broken connection, with no reason from a coordinator) is sent again with
 *   the same request id within the call's time; when none is answered,
 *   {@link Unavailable} with reason `OUTCOME_UNKNOWN` (it may have been
 *   applied) is thrown;
 * - a call refused by a coordinator that drains before it stops (UNAVAILABLE /
 *   DRAINING: a new lease or stream, an acquire; nothing was done) goes to the
 *   next address, idempotent or not;
 * - a call stops trying `connectTimeout` seconds after its first failure
 *   (or at its own deadline), with jittered backoff between attempts;
 * - once every address has failed its TLS handshake, {@link TlsError} is
 *   thrown at once;
 * - TLS files that changed on disk are read again before a new connection:
 *   a connection that is not open is made again with them (a renewed
 *   certificate is used at the next handshake; open connections keep theirs).
 *
 * @module
 */

import * as net from "node:net";
import * as tlsModule from "node:tls";
import type * as http2 from "node:http2";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";
import { LockService } from "./gen/fencepost/v1/lock_pb.js";
import { delays, now, sleep } from "./backoff.js";
import {
  FencepostError,
  REASON_OUTCOME_UNKNOWN,
  TlsError,
  Unavailable,
  fromConnectError,
  type CallContext,
} from "./errors.js";
import type { TlsFiles, TlsMaterial } from "./tls.js";
import type { Address } from "./validate.js";

/** The generated LockService client of Connect-ES. */
export type LockServiceClient = Client<typeof LockService>;

/** The metadata presenting a lease's secret (gRPC metadata `fencepost-lease-secret`); none for "". */
export function owner(secret: string): Record<string, string> {
  return secret ? { "fencepost-lease-secret": secret } : {};
}

/** Longest wait for one connection attempt, in seconds. */
const CONNECT_ATTEMPT_SECONDS = 3;
/** The shortest time one attempt of a call with a request id gets, in seconds (the Python client's). */
export const MIN_ATTEMPT_SECONDS = 2;
/**
 * The codes of a failed call that, without an ErrorInfo reason (no coordinator's own answer), say its answer
 * was lost and it may have been applied: no answer in time, or the connection broken under it (where gRPC
 * says UNAVAILABLE, Connect-ES says ABORTED for a reset connection, INTERNAL or CANCELED for an HTTP/2
 * session or stream ended under the call).
 */
const ANSWER_LOST: ReadonlySet<Code> = new Set([
  Code.Unavailable, Code.DeadlineExceeded, Code.Aborted, Code.Internal, Code.Canceled,
]);

interface Slot {
  manager: Http2SessionManager;
  client: LockServiceClient;
  /** The TLS material its connections use. */
  material: TlsMaterial | undefined;
}

/** Whether a connection error is a failed TLS handshake. */
export function tlsProblem(err: unknown): string | undefined {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && /CERT|SSL|TLS|EPROTO|SELF_SIGNED|UNABLE_TO_|HOSTNAME|ALTNAME/.test(code)) {
      return `${e.message} (${code})`;
    }
  }
  return undefined;
}

function describe(err: unknown): string {
  const parts: string[] = [];
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    parts.push(typeof code === "string" ? `${e.message} (${code})` : e.message);
  }
  return parts.join(": ") || String(err);
}

/** The client's connections to its coordinators. */
export class Transport {
  readonly addresses: readonly Address[];
  readonly connectTimeout: number;
  private readonly files: TlsFiles | undefined;
  private readonly slots: (Slot | undefined)[];
  private index = 0;
  private closed = false;

  /**
   * @param addresses - The coordinators, tried in turn.
   * @param connectTimeout - Seconds a call keeps trying after its first failure.
   * @param files - TLS files, undefined for plaintext.
   */
  constructor(addresses: readonly Address[], connectTimeout: number, files: TlsFiles | undefined) {
    this.addresses = addresses;
    this.connectTimeout = connectTimeout;
    this.files = files;
    this.slots = addresses.map(() => undefined);
  }

  /** The address in use. */
  get address(): string {
    return this.addresses[this.index]!.text;
  }

  /** The position of the address in use (to pass to {@link rotate}). */
  get position(): number {
    return this.index;
  }

  private slot(i: number): Slot {
    let slot = this.slots[i];
    const material = this.files?.current();
    if (slot !== undefined && slot.material !== material && slot.manager.state() !== "open") {
      slot.manager.abort(); // TLS files renewed: the next connection uses them
      slot = this.slots[i] = undefined;
    }
    if (slot === undefined) {
      const address = this.addresses[i]!;
      const tlsMaterial = material;
      const scheme = tlsMaterial ? "https" : "http";
      const authority = address.kind === "tcp"
        ? `${address.host.includes(":") ? `[${address.host}]` : address.host}:${address.port}`
        : "localhost";
      const options: http2.SecureClientSessionOptions = {};
      if (tlsMaterial) {
        if (tlsMaterial.ca) options.ca = tlsMaterial.ca;
        if (tlsMaterial.cert) options.cert = tlsMaterial.cert;
        if (tlsMaterial.key) options.key = tlsMaterial.key;
        if (tlsMaterial.serverName) options.servername = tlsMaterial.serverName;
      }
      if (address.kind === "unix") {
        const path = address.path;
        const tls = tlsMaterial;
        options.createConnection = () => {
          if (!tls) return net.connect(path);
          return tlsConnect(path, options);
        };
      }
      const url = `${scheme}://${authority}`;
      const manager = new Http2SessionManager(
        url,
        { connectTimeoutMs: CONNECT_ATTEMPT_SECONDS * 1000, pingIntervalMs: 10_000, pingTimeoutMs: 10_000 },
        options,
      );
      const transport = createGrpcTransport({ baseUrl: url, sessionManager: manager });
      slot = { manager, client: createClient(LockService, transport), material };
      this.slots[i] = slot;
    }
    return slot;
  }

  /** The generated client on the address in use. */
  client(): LockServiceClient {
    if (this.closed) throw new FencepostError("client is closed");
    return this.slot(this.index).client;
  }

  /**
   * Move on to the next address if `failed` is still the one in use; the
   * failed address's connection is dropped, to be made again when its turn comes.
   */
  rotate(failed: number): void {
    const slot = this.slots[failed];
    if (slot !== undefined) {
      slot.manager.abort();
      this.slots[failed] = undefined;
    }
    if (this.index === failed) this.index = (this.index + 1) % this.addresses.length;
  }

  /** Whether the TLS files changed since the connection to address `position` was made. */
  private renewed(position: number): boolean {
    return this.files !== undefined && this.slots[position]?.material !== this.files.current();
  }

  /** Connect the address in use: undefined when connected, else the connection error. */
  async connect(): Promise<unknown> {
    const slot = this.slot(this.index);
    const state = await slot.manager.connect();
    return state === "error" ? (slot.manager.error() ?? new Error("connection failed")) : undefined;
  }

  /**
   * The deadline of one attempt of a call with a request id, in milliseconds: a third of `connectTimeout`
   * (at least {@link MIN_ATTEMPT_SECONDS}), and no more than `left` seconds (the call's time left, if any),
   * so that an attempt whose answer is lost is sent again within the call's time.
   */
  attemptTimeoutMs(left: number | undefined): number {
    const attempt = Math.max(MIN_ATTEMPT_SECONDS, this.connectTimeout / 3);
    return Math.max(1, Math.round(Math.min(attempt, left ?? attempt) * 1000));
  }

  /**
   * Run one unary RPC with connection handling, retries and error mapping.
   *
   * @param method - For messages, and to tell an Acquire (whose own deadline is a LockTimeout).
   * @param run - Makes the call on a client: gets the seconds left before `until` (or undefined).
   * @param opts.until - Clock reading (seconds) after which to stop trying.
   * @param opts.idempotent - Whether an UNAVAILABLE answer may be retried.
   * @param opts.context - Lock name, lease id and token of the call, for the errors.
   * @param opts.signal - Aborts the call (then its reason is thrown).
   * @param opts.requestId - The request id every attempt carries (`run` puts it in the request), for a call
   *   the coordinator settles by it: a lost answer is asked for again with it (needs `idempotent`).
   * @throws {@link FencepostError} subclasses mapped from the status,
   *   {@link Unavailable} when no coordinator was reachable in time (reason `OUTCOME_UNKNOWN`: a call
   *   with a request id was sent, and no attempt was answered in time),
   *   {@link TlsError} when every address failed its TLS handshake.
   */
  async call<T>(
    method: string,
    run: (client: LockServiceClient, left: number | undefined) => Promise<T>,
    opts: {
      until: number | undefined;
      idempotent: boolean;
      context?: CallContext;
      signal?: AbortSignal | undefined;
      requestId?: string;
    },
  ): Promise<T> {
    const backoff = delays();
    let giveUpAt: number | undefined;
    const budget = (): number => {
      const t = now();
      if (giveUpAt === undefined) {
        giveUpAt = t + this.connectTimeout;
        if (opts.until !== undefined) giveUpAt = Math.min(giveUpAt, opts.until);
      }
      return giveUpAt - t;
    };
    const tlsFailed = new Map<string, string>();
    let lastProblem = "";
    const context = opts.context ?? {};
    const settles = opts.idempotent && opts.requestId !== undefined;
    // The failure of the last attempt of such a call that was sent and got no answer (it may have been applied).
    let unsettled: unknown;
    // The last UNAVAILABLE answer a coordinator gave with a reason (ETCD_UNAVAILABLE): what a call whose
    // retries then run out of time throws, a better account than "no answer".
    let answered: FencepostError | undefined;
    const outcomeUnknown = (cause: unknown): Unavailable => new Unavailable(
      `${method} was sent but no answer said whether it was applied (retried with request id ` +
        `${opts.requestId} until the call's time ran out)`,
      { ...context, reason: REASON_OUTCOME_UNKNOWN, cause },
    );
    for (;;) {
      if (this.closed) throw new FencepostError("client is closed", context);
      opts.signal?.throwIfAborted();
      const position = this.index;
      const address = this.address;
      const failure = await this.connect();
      if (failure !== undefined) {
        const problem = this.files?.problem();
        const tls = tlsProblem(failure);
        if (tls !== undefined && !this.renewed(position)) {
          tlsFailed.set(address, problem === undefined ? tls : `${tls}; ${problem}`);
          if (tlsFailed.size >= this.addresses.length) {
            const [first, cause] = [...tlsFailed.entries()][0]!;
            throw new TlsError(`TLS handshake with ${first} failed: ${cause}`, {
              ...context, address: first, tlsCause: cause, cause: failure,
            });
          }
        }
        lastProblem = `${address}: ${describe(failure)}`;
        this.rotate(position);
        const left = budget();
        if (left <= 0) {
          if (unsettled !== undefined) throw outcomeUnknown(unsettled);
          throw new Unavailable(`no coordinator reachable (${lastProblem})`, { ...context, cause: failure });
        }
        await sleep(Math.min(backoff.next().value, left), opts.signal);
        continue;
      }
      const left = opts.until === undefined ? undefined : opts.until - now();
      try {
        return await run(this.client(), left);
      } catch (err) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        const mapped = fromConnectError(err, context);
        const code = err instanceof ConnectError ? err.code : undefined;
        if (settles && mapped.reason === undefined && code !== undefined && ANSWER_LOST.has(code)) {
          // Sent, and its answer lost: ask again with the same request id, on a fresh connection.
          unsettled = err;
          lastProblem = `${address}: ${mapped.message}`;
          this.rotate(position);
          const remaining = budget();
          if (remaining <= 0) throw answered ?? outcomeUnknown(err);
          await sleep(Math.min(backoff.next().value, remaining), opts.signal);
          continue;
        }
        if (code === Code.DeadlineExceeded && mapped.reason === undefined && !method.startsWith("Acquire")) {
          throw new Unavailable(`${method}: no answer from ${address} in time`, { ...context, cause: err });
        }
        if (mapped.reason === "DRAINING") {
          // A coordinator draining before it stops did nothing: the next address, idempotent or not.
          lastProblem = `${address}: ${mapped.message}`;
          this.rotate(position);
          const remaining = budget();
          if (remaining <= 0) throw mapped;
          await sleep(Math.min(backoff.next().value, remaining), opts.signal);
          continue;
        }
        if (!(mapped instanceof Unavailable) || !opts.idempotent) throw mapped;
        if (mapped.reason !== undefined) answered = mapped; // a coordinator's own answer, not a broken connection
        lastProblem = `${address}: ${mapped.message}`;
        this.rotate(position);
        const remaining = budget();
        if (remaining <= 0) throw mapped;
        await sleep(Math.min(backoff.next().value, remaining), opts.signal);
      }
    }
  }

  /** Drop every connection; later calls throw. */
  close(): void {
    this.closed = true;
    for (let i = 0; i < this.slots.length; i++) {
      this.slots[i]?.manager.abort();
      this.slots[i] = undefined;
    }
  }
}

function tlsConnect(path: string, options: http2.SecureClientSessionOptions): net.Socket {
  return tlsModule.connect({
    path,
    ca: options.ca,
    cert: options.cert,
    key: options.key,
    servername: options.servername ?? "localhost",
    ALPNProtocols: ["h2"],
  });
}
