/**
 * Waiting for work that goes on without its caller: a LeaseGrant shared by
 * several acquires, a clean-up (Withdraw, LeaseRevoke) left running in the
 * background.
 *
 * @module
 */

/**
 * Longest time an aborted call waits for its clean-up (a Withdraw, a
 * LeaseRevoke) before it rejects, in seconds; the clean-up goes on after that.
 */
const CLEANUP_WAIT_SECONDS = 1.0;

/** `work`, or the signal's reason as soon as `signal` aborts (`work` goes on). */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
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

/** Wait for a clean-up (already running) up to CLEANUP_WAIT_SECONDS; it goes on after that. */
export async function cleanUp(work: Promise<unknown>): Promise<void> {
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
