/**
 * The answers of the client's read calls, and their conversion from the wire
 * (the Python client's `_info.py`).
 *
 * {@link LockInfo} is one lock as Describe reports it, {@link HeldLock} one
 * entry of a ListLocks listing, {@link ServerInfo} (with its
 * {@link EtcdInfo}) one coordinator as ServerInfo reports it. Ids, tokens and
 * revisions are bigints, counts and seconds numbers, and what the coordinator
 * did not know is undefined.
 *
 * @module
 */

import type {
  DescribeResponse,
  LockInfo as LockInfoMessage,
  ServerInfoResponse,
} from "./gen/fencepost/v1/lock_pb.js";

/** A snapshot of one lock, from {@link LockClient.describe}. */
export interface LockInfo {
  name: string;
  held: boolean;
  holderLeaseId: bigint;
  token: bigint;
  /** Seconds left on the holder's lease as etcd reports it (a lower bound), -1 when not held. */
  ttlRemaining: number;
  /** How many contenders are queued behind the holders. */
  waiterCount: number;
  /**
   * The lease ids of the readers holding the lock together (a read-write
   * lock, docs/rwlocks.md), the holder first, in grant order; empty when a
   * writer or a plain lock's holder holds it.
   */
  readers: bigint[];
  /** The lease ids of the listed waiters that will read, in grant order. */
  waitingReaders: bigint[];
}

/** One held lock, from {@link LockClient.listLocks}, or one that a lock-delay holds back (no holder). */
export interface HeldLock {
  name: string;
  /** The holder's lease id; 0n while a lock-delay holds the lock back. */
  holderLeaseId: bigint;
  /** The holder's fencing token; 0n while a lock-delay holds the lock back. */
  token: bigint;
  /** The holder is a reader of a read-write lock (docs/rwlocks.md): others may read beside it. */
  holderReads: boolean;
  /** Seconds left on the holder's lease as etcd reported it (a lower bound only); undefined when the lease ended meanwhile. */
  ttlRemaining: number | undefined;
  /** The holder lease's granted TTL in seconds (0 when it ended). */
  ttl: number;
  /** Seconds since the grant; undefined when the coordinator that answered did not make the grant. */
  heldFor: number | undefined;
  /** How many contenders are queued behind the holders (all of them when held back). */
  waiterCount: number;
  /** How many contenders hold the lock together: 1, or the readers holding it; 0 while held back. */
  holderCount: number;
  /** The etcd revision of the listing. */
  revision: bigint;
  /** The lock-delay holding the lock back, in seconds; 0 for a held lock. */
  lockDelay: number;
  /** Seconds left on that delay; undefined when it starts at the next acquire, or for a held lock. */
  lockDelayRemaining: number | undefined;
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
  /** Where it serves the HTTP/JSON API and the lock board; undefined without one. */
  httpAddress: string | undefined;
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

/** The {@link LockInfo} of lock `name` from its DescribeResponse. */
export function lockInfoFromResponse(name: string, resp: DescribeResponse): LockInfo {
  return {
    name,
    held: resp.held,
    holderLeaseId: resp.holder?.leaseId ?? 0n,
    token: resp.holder?.token ?? 0n,
    ttlRemaining: Number(resp.ttlRemainingSeconds),
    waiterCount: Number(resp.waiterCount),
    readers: resp.holders.filter((c) => c.read).map((c) => c.leaseId),
    waitingReaders: resp.waiters.filter((c) => c.read).map((c) => c.leaseId),
  };
}

/** The {@link HeldLock} of one entry of a ListLocks page read at etcd revision `revision`. */
export function heldLockFromMessage(info: LockInfoMessage, revision: bigint): HeldLock {
  return {
    name: info.name,
    holderLeaseId: info.holder?.leaseId ?? 0n,
    token: info.holder?.token ?? 0n,
    holderReads: info.holder?.read ?? false,
    ttlRemaining: info.ttlRemainingSeconds >= 0n ? Number(info.ttlRemainingSeconds) : undefined,
    ttl: Number(info.ttlSeconds),
    heldFor: info.heldSeconds >= 0 ? info.heldSeconds : undefined,
    waiterCount: Number(info.waiterCount),
    holderCount: Number(info.holderCount),
    revision,
    lockDelay: Number(info.lockDelaySeconds),
    lockDelayRemaining:
      info.lockDelaySeconds > 0n && info.lockDelayRemainingMs >= 0n
        ? Number(info.lockDelayRemainingMs) / 1000
        : undefined,
  };
}

/** The {@link ServerInfo} of a ServerInfoResponse: etcd's fields undefined when it did not answer. */
export function serverInfoFromResponse(resp: ServerInfoResponse): ServerInfo {
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
    httpAddress: resp.httpAddress || undefined,
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
