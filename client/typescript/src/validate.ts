/**
 * Client-side checks of every argument, by the coordinator's rules and with
 * the Python client's wording, so that bad input fails at once with an
 * {@link InvalidArgument} naming the field, before any call.
 *
 * @module
 */

import { now } from "./backoff.js";
import { InvalidArgument } from "./errors.js";

/** Longest lock name, in bytes of UTF-8. */
export const MAX_NAME_BYTES = 256;
/** Shortest and longest lease TTL, in seconds. */
export const MIN_TTL_SECONDS = 1;
export const MAX_TTL_SECONDS = 86_400;
/** Longest acquire wait, in seconds. */
export const MAX_WAIT_SECONDS = 86_400;
/** Largest fencing token or lease id (int64). */
export const MAX_INT64 = 2n ** 63n - 1n;
/** The default coordinator address. */
export const DEFAULT_ADDRESS = "127.0.0.1:7420";

function isFiniteNumber(value: unknown): value is number {
  return typeof value === "number" && Number.isFinite(value);
}

/**
 * The characters no name may contain: the Unicode general categories Cc (C0 and C1 controls, DEL), Cf
 * (format characters: U+200B zero width space, U+202E and the other bidirectional controls, U+FEFF, ...),
 * Zl and Zp (U+2028, U+2029): the coordinator's and the Python client's rule (fencepost.client.v1.names).
 */
const FORBIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u;

/**
 * What is wrong with a name's characters, worded to follow a field name, with the coordinator's wording
 * (the index counts code points, as Python's does); undefined when nothing is.
 */
export function forbiddenProblem(name: string): string | undefined {
  if (!FORBIDDEN.test(name)) return undefined;
  let index = 0;
  for (const char of name) {
    if (FORBIDDEN.test(char)) {
      const code = char.codePointAt(0) ?? 0;
      const category = /\p{Cc}/u.test(char) ? "Cc" : /\p{Cf}/u.test(char) ? "Cf" : /\p{Zl}/u.test(char) ? "Zl" : "Zp";
      return (
        "must not contain control characters (Unicode Cc), format characters (Cf) or line and paragraph " +
        `separators (Zl, Zp): character ${index} is U+${code.toString(16).toUpperCase().padStart(4, "0")} (${category})`
      );
    }
    index += 1;
  }
  return undefined;
}

/**
 * Check a lock name: a string of 1 to 256 bytes of UTF-8 without a character of the Unicode categories
 * Cc, Cf, Zl or Zp (controls, format characters such as U+200B, line and paragraph separators).
 *
 * @throws {@link InvalidArgument} (field `name`).
 */
export function checkName(name: unknown): string {
  if (typeof name !== "string") throw new InvalidArgument(`name must be a string, got ${typeof name}`, { field: "name" });
  if (name.length === 0) throw new InvalidArgument("name must not be empty", { field: "name" });
  if (!name.isWellFormed()) {
    throw new InvalidArgument("name must be valid UTF-8: it holds a lone surrogate", { field: "name" });
  }
  const size = Buffer.byteLength(name, "utf8");
  if (size > MAX_NAME_BYTES) {
    throw new InvalidArgument(`name is ${size} bytes; at most ${MAX_NAME_BYTES} bytes of UTF-8`, { field: "name" });
  }
  const problem = forbiddenProblem(name);
  if (problem !== undefined) throw new InvalidArgument(`name ${problem}`, { field: "name" });
  return name;
}

/**
 * Check a TTL and convert it to whole seconds, rounding up.
 *
 * @param ttl - Lease TTL in seconds, finite, 1 to 86400.
 * @returns The TTL in whole seconds, never shorter than `ttl`.
 * @throws {@link InvalidArgument} (field `ttl`).
 */
export function ttlToWire(ttl: unknown): number {
  if (!isFiniteNumber(ttl) || ttl < MIN_TTL_SECONDS || ttl > MAX_TTL_SECONDS) {
    throw new InvalidArgument(
      `ttl must be a finite number of seconds from ${MIN_TTL_SECONDS} to ${MAX_TTL_SECONDS}, got ${String(ttl)}`,
      { field: "ttl" },
    );
  }
  return Math.ceil(ttl);
}

/**
 * Check an acquire timeout.
 *
 * @param timeout - Seconds to wait, 0 to 86400; undefined waits forever.
 * @throws {@link InvalidArgument} (field `timeout`).
 */
export function checkTimeout(timeout: unknown): number | undefined {
  if (timeout === undefined) return undefined;
  if (!isFiniteNumber(timeout) || timeout < 0 || timeout > MAX_WAIT_SECONDS) {
    throw new InvalidArgument(
      `timeout must be undefined or a finite number of seconds from 0 to ${MAX_WAIT_SECONDS}, got ${String(timeout)}`,
      { field: "timeout" },
    );
  }
  return timeout;
}

/**
 * Check the options every acquire takes (`ttl`, `timeout` unless `tryOnce`, `signal`), the signal not aborted.
 *
 * @returns The TTL in whole seconds, the deadline (a clock reading in seconds; undefined: none), the signal.
 * @throws {@link InvalidArgument} (field `options`, `ttl`, `timeout` or `signal`); the signal's reason if aborted.
 */
export function checkAcquireOptions(
  options: { ttl?: number; timeout?: number; signal?: AbortSignal },
  tryOnce: boolean,
): { ttl: number; until: number | undefined; signal: AbortSignal | undefined } {
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
  return { ttl, until: timeout === undefined ? undefined : now() + timeout, signal };
}

/** Longest lock-delay, in seconds. */
export const MAX_LOCK_DELAY_SECONDS = 3600;

/**
 * Check a lock-delay and convert it to whole seconds, rounding up.
 *
 * @param lockDelay - Seconds, finite, 0 to 3600; 0 for none.
 * @returns The lock-delay in whole seconds (`AcquireRequest.lock_delay_seconds`), never shorter than asked.
 * @throws {@link InvalidArgument} (field `lockDelay`).
 */
export function lockDelayToWire(lockDelay: unknown): number {
  if (!isFiniteNumber(lockDelay) || lockDelay < 0 || lockDelay > MAX_LOCK_DELAY_SECONDS) {
    throw new InvalidArgument(
      `lockDelay must be a finite number of seconds from 0 to ${MAX_LOCK_DELAY_SECONDS}, got ${String(lockDelay)}`,
      { field: "lockDelay" },
    );
  }
  return Math.ceil(lockDelay);
}

/**
 * Check the `read` option of an acquire: a boolean, and no lock-delay with it (a reader takes none).
 *
 * @param name - The lock name, for the error.
 * @param lockDelay - The lock-delay already checked, in whole seconds.
 * @throws {@link InvalidArgument} (field `read`, or `lockDelay` when both are given).
 */
export function checkRead(read: unknown, lockDelay: number, name: string): boolean {
  if (typeof read !== "boolean") {
    throw new InvalidArgument(`read must be a boolean, got ${typeof read}`, { field: "read", lockName: name });
  }
  if (read && lockDelay > 0) {
    throw new InvalidArgument("a read hold takes no lockDelay", { field: "lockDelay", lockName: name });
  }
  return read;
}

/**
 * Check a number of seconds that must be finite and > 0 (`connectTimeout`).
 *
 * @throws {@link InvalidArgument} (field `field`).
 */
export function checkPositiveSeconds(value: unknown, field: string): number {
  if (!isFiniteNumber(value) || value <= 0) {
    throw new InvalidArgument(`${field} must be a finite number of seconds > 0, got ${String(value)}`, { field });
  }
  return value;
}

/**
 * Check the keepalive period as a fraction of the TTL, in (0, 0.5].
 *
 * @throws {@link InvalidArgument} (field `keepaliveFraction`).
 */
export function checkFraction(value: unknown): number {
  if (!isFiniteNumber(value) || value <= 0 || value > 0.5) {
    throw new InvalidArgument(`keepaliveFraction must be in (0, 0.5], got ${String(value)}`, {
      field: "keepaliveFraction",
    });
  }
  return value;
}

/**
 * Check a fencing token offered with a write: a bigint from 1 to 2^63-1.
 *
 * @throws {@link InvalidArgument} (field `token`).
 */
export function checkToken(token: unknown): bigint {
  if (typeof token !== "bigint") {
    throw new InvalidArgument(`token must be a bigint fencing token, not ${typeof token}`, { field: "token" });
  }
  if (token <= 0n || token > MAX_INT64) {
    throw new InvalidArgument(`token must be from 1 to 2**63-1, got ${token}`, { field: "token" });
  }
  return token;
}

/** What a coordinator address may be, for error messages. */
export const ADDRESS_FORMS =
  "HOST:PORT (a host name, an IPv4 address or [IPv6]; port 1 to 65535), dns:///HOST:PORT, or unix:/ABSOLUTE/PATH";

/** A parsed coordinator address. */
export type Address =
  | { text: string; kind: "tcp"; host: string; port: number }
  | { text: string; kind: "unix"; path: string };

const HOST_LABEL = /^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$/;

function parseHostPort(text: string): { host: string; port: number } | string {
  let host: string;
  let port: string;
  if (text.startsWith("[")) {
    const end = text.indexOf("]");
    if (end < 0 || text[end + 1] !== ":") return "is not [IPv6]:PORT";
    host = text.slice(1, end);
    port = text.slice(end + 2);
    if (!/^[0-9A-Fa-f:.]+$/.test(host) || !host.includes(":")) return `has a bad IPv6 address ${JSON.stringify(host)}`;
  } else {
    const colon = text.lastIndexOf(":");
    if (colon < 0) return "has no port";
    host = text.slice(0, colon);
    port = text.slice(colon + 1);
    if (host.includes(":")) return "is an IPv6 address without brackets";
    if (!host || !host.split(".").every((label) => HOST_LABEL.test(label))) {
      return `has a bad host ${JSON.stringify(host)}`;
    }
  }
  if (!/^[0-9]{1,5}$/.test(port) || Number(port) < 1 || Number(port) > 65535) {
    return `has a bad port ${JSON.stringify(port)} (1 to 65535)`;
  }
  return { host, port: Number(port) };
}

function parseAddress(text: string): Address | string {
  if (text.startsWith("unix:")) {
    const path = text.startsWith("unix:///") ? text.slice("unix://".length) : text.slice("unix:".length);
    if (!path.startsWith("/") || path.startsWith("//")) return "is a relative unix socket path";
    if (Buffer.byteLength(path) > 107) return "has a unix socket path longer than 107 bytes";
    return { text, kind: "unix", path };
  }
  const rest = text.startsWith("dns:///") ? text.slice("dns:///".length) : text;
  if (rest.includes("/") || rest.includes("://")) return "is not an address";
  const parsed = parseHostPort(rest);
  if (typeof parsed === "string") return parsed;
  return { text, kind: "tcp", ...parsed };
}

/**
 * Check coordinator addresses: one string (comma-separated allowed) or an array of them.
 *
 * @returns The parsed addresses, in order.
 * @throws {@link InvalidArgument} (field `address`).
 */
export function checkAddresses(address: unknown): Address[] {
  const items: unknown[] = Array.isArray(address) ? address : [address];
  const out: Address[] = [];
  for (const item of items) {
    if (typeof item !== "string") {
      throw new InvalidArgument(`address must be a string or an array of strings, got ${typeof item}`, {
        field: "address",
      });
    }
    for (const part of item.split(",")) {
      const text = part.trim();
      if (!text) continue;
      const parsed = parseAddress(text);
      if (typeof parsed === "string") {
        throw new InvalidArgument(`address ${JSON.stringify(text)} ${parsed}; an address is ${ADDRESS_FORMS}`, {
          field: "address",
        });
      }
      out.push(parsed);
    }
  }
  if (out.length === 0) {
    throw new InvalidArgument(`address must name at least one coordinator, got ${JSON.stringify(address)}`, {
      field: "address",
    });
  }
  return out;
}

/** SQL identifiers the guards accept. */
export const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Check a table or column name before it is put in a statement.
 *
 * @throws {@link InvalidArgument} (field `argument`).
 */
export function checkIdentifier(value: unknown, argument: string): string {
  if (typeof value !== "string" || !IDENTIFIER.test(value)) {
    throw new InvalidArgument(`${argument} must match ${IDENTIFIER.source}, got ${JSON.stringify(value)}`, {
      field: argument,
    });
  }
  return value;
}
