/**
 * A client's life (new -> open -> closing -> closed) and its background
 * tasks: the one owner of that state, read by the parts of the client
 * ({@link Leasing}, {@link Holds}) and moved on only by {@link LockClient}.
 *
 * @module
 */

import { FencepostError } from "./errors.js";

/** Where a client is in its life: nothing contacted yet, in use, closing, closed. */
export type ClientState = "new" | "open" | "closing" | "closed";

/** The state of one client, its background tasks, and the signal that stops their sleeps at close. */
export class Lifecycle {
  private current: ClientState = "new";
  private readonly background = new Set<Promise<unknown>>();
  /** Aborted when the client starts closing: stops the backoff sleeps of background clean-ups. */
  private readonly closeController = new AbortController();

  get state(): ClientState {
    return this.current;
  }

  /** Whether the client is open: not new, closing or closed. */
  get open(): boolean {
    return this.current === "open";
  }

  /** Aborted when the client starts closing. */
  get closeSignal(): AbortSignal {
    return this.closeController.signal;
  }

  /**
   * Open a new client; nothing to do for an open one.
   *
   * @returns True when the client was new (the caller then starts what an open client runs).
   * @throws {@link FencepostError} the client is closing or closed.
   */
  start(): boolean {
    if (this.current === "new") {
      this.current = "open";
      return true;
    }
    if (this.current !== "open") throw new FencepostError("client is closed");
    return false;
  }

  /**
   * Start closing: abort {@link closeSignal}.
   *
   * @returns Whether the client was open.
   */
  beginClose(): boolean {
    const wasOpen = this.current === "open";
    this.current = "closing";
    this.closeController.abort();
    return wasOpen;
  }

  /** Run `work` in the background (its failure ignored); {@link finishClose} waits for it. */
  spawn(work: Promise<unknown>): void {
    const task = work.catch(() => undefined);
    this.background.add(task);
    void task.finally(() => this.background.delete(task));
  }

  /** Wait for every background task, then the client is closed. */
  async finishClose(): Promise<void> {
    await Promise.all([...this.background]);
    this.current = "closed";
  }
}
