/**
 * Work done under a held handle, then the release: the body of
 * {@link LockClient.withLock} and {@link LockClient.withLocks}.
 *
 * @module
 */

import type { LeaseLost } from "./errors.js";
import type { LockHandle } from "./handle.js";
import type { MultiLockHandle } from "./multihandle.js";

/**
 * Run `fn(handle, handle.signal)`, then release the handle. If the hold was
 * lost before `fn` ended, reject with that {@link LeaseLost} (whether `fn`
 * noticed or not); else with what `fn` threw (the handle released quietly),
 * or resolve with `fn`'s result once the release is done.
 *
 * @throws the LeaseLost of the loss, `fn`'s error, or the release's.
 */
export async function holdWhile<H extends LockHandle | MultiLockHandle, T>(
  handle: H,
  fn: (handle: H, signal: AbortSignal) => Promise<T> | T,
): Promise<T> {
  let result: T;
  try {
    result = await fn(handle, handle.signal);
  } catch (err) {
    await releaseQuietly(handle);
    if (handle.lostReason !== undefined) throw handle.signal.reason as LeaseLost;
    throw err;
  }
  if (handle.lostReason !== undefined) {
    await releaseQuietly(handle);
    throw handle.signal.reason as LeaseLost;
  }
  await handle.release();
  return result;
}

async function releaseQuietly(handle: LockHandle | MultiLockHandle): Promise<void> {
  try {
    await handle.release();
  } catch {
    // released or lost either way
  }
}
