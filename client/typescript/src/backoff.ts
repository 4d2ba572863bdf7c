/**
 * The client's backoff policy: exponential ceilings from 0.05 s to 2 s, full
 * jitter (a delay drawn uniformly from [0, ceiling]); the Python client's
 * `CLIENT_BACKOFF`.
 *
 * @module
 */

/** First ceiling, in seconds. */
export const BACKOFF_BASE = 0.05;
/** Largest ceiling, in seconds. */
export const BACKOFF_CAP = 2.0;

/** The ceilings of successive delays, in seconds: base, 2 base, ... up to cap, forever. */
export function* ceilings(): Generator<number, never> {
  let ceiling = BACKOFF_BASE;
  for (;;) {
    yield ceiling;
    ceiling = Math.min(BACKOFF_CAP, ceiling * 2);
  }
}

/** Successive delays with full jitter, in seconds. */
export function* delays(): Generator<number, never> {
  const growth = ceilings();
  for (;;) yield Math.random() * growth.next().value;
}

/** A monotonic clock in seconds. */
export function now(): number {
  return performance.now() / 1000;
}

/** Wait `seconds` (at least 0), or until `signal` aborts (then reject with its reason). */
export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(done, Math.max(0, seconds) * 1000);
    function done(): void {
      signal?.removeEventListener("abort", aborted);
      resolve();
    }
    function aborted(): void {
      clearTimeout(timer);
      reject(signal?.reason);
    }
    signal?.addEventListener("abort", aborted, { once: true });
  });
}
