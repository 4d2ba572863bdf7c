"""Fencing tokens that never go back, even after etcd is restored from an older snapshot.

A fencing token is the create revision of the holder's key plus the **token
floor** F: ``token = revision + F``. F is 0 until an operator recovers from
a restore; :meth:`TokenFloor.token` and :meth:`TokenFloor.revision` are the
one place where tokens and revisions meet.

etcd's revisions only grow, except when etcd is restored from a snapshot
(``etcdutl snapshot restore``) or its data directory is replaced by an older
copy: its revisions then restart below tokens already handed out, and a new
holder would get a token that storage has already seen (and would refuse:
fencing stays safe, but the lock is useless, and a lower token reaching a
record that never saw the higher one would be accepted out of order). So the
coordinator watches for it and refuses rather than hand out a smaller token:

- **high-water mark**: the highest ``revision + F`` this coordinator has seen
  in the header of a linearizable Range or Txn response (the etcd layer
  reports each one, :meth:`TokenFloor.seen`), a bound on every token it
  granted. A response whose ``revision + F`` is lower than that mark was
  when its request was sent means etcd's history went back.
- **the token record**, the key ``<prefix>.tokens`` (inside the prefix, so a
  coordinator's etcd role limited to the prefix can read and write it, and
  outside every lock's key range: those all end in ``/<lease id>``): JSON
  ``{"cluster_id", "floor", "high"}``, created at the first start with a
  create-only Txn. A header whose cluster id differs from the record's means
  etcd was restored with a new ``--initial-cluster-token`` or replaced by
  another cluster. A coordinator that sees its revisions go back writes its
  high-water mark into ``high``, so that every replica refuses too, also one
  started after the restore, which has no memory of the old revisions.

etcd restored with the same cluster token keeps its cluster id (it is a hash
of the member names, peer URLs and token): a restore that no running
coordinator witnessed, and that no coordinator recorded, cannot be seen from
etcd alone. A coordinator with a data directory remembers across restarts:
at its first check of the record (before its first token, once it knows the
floor) its high-water mark rises to the one it kept there
(:class:`~.high_water.HighWaterFile`), so that check refuses. Without one,
the procedure in docs/deploy.md runs :func:`recover` after every restore.

While refusing, :meth:`TokenFloor.token` and :meth:`TokenFloor.ready` raise
:class:`~fencepost.client.errors.DataLoss` (UNAVAILABLE / DATA_LOSS), the
server's health is NOT_SERVING, and one ERROR line says what was seen and
what to do. :func:`recover` (``fencepost admin recover-tokens --above T``)
deletes every lock key (they come from before the restore: a restored holder
or waiter would otherwise be granted its old, smaller token) and sets F so that
every later token is greater than T, the restored level and every high-water
mark published; coordinators read the record every second and serve again.
Meanwhile no coordinator creates a key under the old floor: each Txn that may
create one compares the record's mod revision with the one its floor was
read from (:attr:`TokenFloor.adopted`, :mod:`.floor_guard`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from fencepost.client.errors import DataLoss, FencepostError, Unavailable
from fencepost.client.v1 import etcdops
from fencepost.client.v1.details import RETRY_DELAY_BY_REASON, ErrorReason, reason_name
from fencepost.client.v1.etcd import rpc_pb2
from fencepost.client.v1.keys import MAX_TOKEN, TOKEN_RECORD_SUFFIX, Keys, token_floor

from ..etcd import NOT_APPLIED, EtcdClient, Op, TxnPlan, etcd_unavailable
from ..telemetry.events import log_event
from .high_water import HighWaterFile

__all__ = ["RECORD_SUFFIX", "Adopted", "Recovery", "TokenFloor", "TokenRecord", "record_key", "recover"]

_log = logging.getLogger("fencepost.coordinator")

#: The token record's key is the lock prefix followed by this (no "/": no lock's key range holds it).
RECORD_SUFFIX = TOKEN_RECORD_SUFFIX
#: Where the operator procedure is written down (the log line points there).
PROCEDURE = "docs/deploy.md, 'Restoring etcd from a snapshot'"


def record_key(keys: Keys) -> bytes:
    """The token record's key under ``keys.prefix``: ``/fencepost/locks/.tokens`` for the default prefix."""
    return keys.token_record


@dataclass(frozen=True)
class TokenRecord:
    """The token record: under which etcd cluster tokens are handed out, and with which floor.

    Attributes:
        cluster_id: The etcd cluster id the tokens are handed out under.
        floor: The token floor F (``token = revision + F``), >= 0.
        high: The highest token known to have been handed out, as far as a
            coordinator that saw etcd go back, or the last recovery, could tell
            (0: none known). Not kept up to date in normal operation.
    """

    cluster_id: int
    floor: int = 0
    high: int = 0

    def encode(self) -> bytes:
        """The record as stored in etcd (JSON, numbers in decimal)."""
        return json.dumps({"cluster_id": self.cluster_id, "floor": self.floor, "high": self.high},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> TokenRecord:
        """Read a stored record.

        Raises:
            ValueError: not a token record (not JSON, a field missing or out of range).
        """
        try:
            data = json.loads(value)
            record = cls(int(data["cluster_id"]), token_floor(value), int(data.get("high", 0)))
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"not a token record: {value[:100]!r}") from exc
        if record.floor < 0 or record.high < 0 or record.floor > MAX_TOKEN:
            raise ValueError(f"token record out of range: {value[:100]!r}")
        return record


@dataclass(frozen=True)
class Adopted:
    """The token floor a coordinator uses, and the mod revision of the token record it read it from.

    Attributes:
        floor: The token floor F.
        mod_revision: The record's mod revision when read; 0 when no record was read.
    """

    floor: int
    mod_revision: int


def data_loss(message: str) -> DataLoss:
    """The error of a call refused because tokens would go back (UNAVAILABLE / DATA_LOSS + RetryInfo)."""
    return DataLoss(message, reason=reason_name(ErrorReason.DATA_LOSS),
                    retry_delay=RETRY_DELAY_BY_REASON[ErrorReason.DATA_LOSS])


class TokenFloor:
    """This coordinator's token floor and its watch for etcd going back (see the module's docstring).

    Args:
        etcd: The etcd layer; None for a floor of 0 with no record and no
            checks (tests that drive the lock module alone).
        keys: The key layout (the record lives under its prefix).
        kept: Where the high-water mark is kept across restarts, already
            loaded: the first record check raises the mark to it, and every
            rise is noted there; None keeps it in memory only.
    """

    def __init__(self, etcd: EtcdClient | None, keys: Keys, kept: HighWaterFile | None = None) -> None:
        self._etcd = etcd
        self.key = record_key(keys)
        #: The token floor F in use.
        self.floor = 0
        # The mark kept from before a restart: a token level (revision + the floor then), so it is compared
        # with etcd at the first record check, once the floor is known, never with an answer read before.
        self._kept = kept
        self._high = 0  # highest revision + floor seen: a bound on every token granted here
        self._record: TokenRecord | None = None
        self._adopted = Adopted(0, 0)  # the floor in use and the mod revision of the record it was read from
        self._checked = etcd is None
        self._problem: str | None = None  # why tokens would go back; None while serving
        self._detections = 0
        self._checking = asyncio.Lock()

    # ------------------------------------------------------------ conversions (the hot path)

    def token(self, revision: int, floor: int | None = None) -> int:
        """The fencing token of a key created at ``revision``, to hand out or report.

        Args:
            revision: The key's create revision.
            floor: The floor the key was created under, as :func:`.floor_guard.under_floor` returned it
                with the Txn that created or found the key; None: the floor adopted now (the unit tests').

        Raises:
            DataLoss: tokens would go back (the coordinator is refusing).
            Unavailable: the token record was never read (:meth:`ready` reads it).
        """
        if self._problem is not None or not self._checked:
            raise self._refusal()
        return revision + (self.floor if floor is None else floor)

    def revision(self, token: int) -> int:
        """The create revision a key must have to hold under ``token``; <= 0 when no key can.

        Not checked: a stream's hold watch and a re-read of a hold use it also
        while refusing (they only ever end a hold).
        """
        return token - self.floor

    def reported(self, revision: int) -> int:
        """The token of a key created at ``revision`` for a message that only reports an end (not checked)."""
        return revision + self.floor

    # ------------------------------------------------------------ state

    @property
    def refusing(self) -> str | None:
        """Why the coordinator refuses to grant tokens now; None while it serves (and before the first check)."""
        return self._problem

    @property
    def recorded(self) -> bool:
        """Whether the floor comes from the token record in etcd (False: a floor of 0 without etcd, in unit tests)."""
        return self._etcd is not None

    @property
    def adopted(self) -> Adopted:
        """The floor in use and the token record's mod revision it was read from (0 before the first check, and
        always without etcd): a Txn that compares that mod revision creates its keys under that floor."""
        return self._adopted

    @property
    def high(self) -> int:
        """The highest token this coordinator may have handed out or seen published (0: none)."""
        return self._high

    def check_serving(self) -> None:
        """Raise when tokens would go back; nothing to do otherwise.

        Raises:
            DataLoss: refusing (see :attr:`refusing`).
        """
        if self._problem is not None:
            raise self._refusal()

    async def ready(self) -> None:
        """Return once the token record has been checked and tokens are safe to hand out.

        The first call checks the record (one read, and a create at the very
        first start); later calls cost nothing.

        Raises:
            DataLoss: tokens would go back.
            Unavailable: etcd unreachable before the first check.
        """
        if not self._checked:
            await self.check(Op.RANGE, first=True)
        self.check_serving()

    def mark(self) -> int:
        """The high-water mark now: taken by the etcd layer before each Range or Txn is sent."""
        return self._high

    def seen(self, mark: int, header: Any) -> None:
        """Note the header of a linearizable Range or Txn response whose request was sent at ``mark``.

        Args:
            mark: :meth:`mark` before the request was sent: every revision it
                covers was committed before the request, so a linearizable
                answer's revision (plus the floor) is at least that.
            header: The response's ``ResponseHeader`` (revision, cluster_id).
        """
        level = int(header.revision) + self.floor
        if level < mark:
            self._went_back(f"etcd answered at revision {int(header.revision)} (tokens up to {level} with "
                            f"floor {self.floor}) after {self._who(mark)} had seen tokens up to {mark}")
        elif self._record is not None and int(header.cluster_id) != self._record.cluster_id:
            self._went_back(self._moved(int(header.cluster_id)))
        if level > self._high:
            self._raise(level)

    async def check(self, op: Op = Op.HEALTH, *, first: bool = False) -> None:
        """Read the token record (creating it at the first start) and decide whether tokens are safe.

        Called every second by the server's health monitor, and by the first
        call that needs a token. Adopts the record's floor, publishes this
        coordinator's high-water mark when etcd went back, and stops refusing
        once the record (after a recovery) makes every later token higher than
        every token seen.

        Args:
            op: The retry rule of the read (HEALTH: 2 tries of 1 s).
            first: Only if the record was never checked (a check made meanwhile will do).

        Raises:
            Unavailable: etcd unreachable, or refused the coordinator.
        """
        if self._etcd is None:
            return
        async with self._checking:  # one at a time: one create at the first start
            if not (first and self._checked):
                await self._check(op)

    async def _check(self, op: Op) -> None:
        assert self._etcd is not None
        mark, detections = self._high, self._detections
        resp = await self._etcd.range(etcdops.get(self.key).request_range, op=op)
        header = resp.header
        revision = int(header.revision)
        stored = resp.kvs[0] if resp.kvs else None
        if stored is None:
            # The record written holds this coordinator's mark when the create was sent, which other calls may
            # have raised since the Range: the create's own revision is the level to compare it with.
            record, mod_revision, revision = await self._create(int(header.cluster_id))
        else:
            try:
                record, mod_revision = TokenRecord.decode(bytes(stored.value)), int(stored.mod_revision)
            except ValueError as exc:
                self._went_back(f"the token record {self.key.decode(errors='replace')} cannot be read ({exc})")
                self._checked = True
                return
        self._record = record
        self.floor = record.floor
        self._adopted = Adopted(record.floor, mod_revision)
        if not self._checked and self._kept is not None and self._kept.recorded > mark:
            mark = self._kept.recorded  # before the first token: the mark this coordinator kept across its restart
            self._raise(mark)
        if record.high > self._high:
            self._raise(record.high)
        level = revision + record.floor
        problem = None
        if int(header.cluster_id) != record.cluster_id:
            problem = self._moved(int(header.cluster_id))
        elif level < max(mark, record.high):
            who = self._who(mark) if mark >= record.high else "a coordinator (the token record's 'high')"
            problem = (f"etcd is at revision {revision} (tokens up to {level} with floor "
                       f"{record.floor}) but {who} saw tokens up to {max(mark, record.high)}")
        self._checked = True
        if problem is not None:
            self._went_back(problem)
            if self._high > record.high:
                await self._publish(record, mod_revision)
        elif self._problem is not None and self._detections == detections:
            log_event(_log, logging.INFO, "tokens_recovered", f"fencing tokens safe again: token floor "
                      f"{record.floor}, every new token > {level}; serving", floor=record.floor)
            self._problem = None

    # ------------------------------------------------------------ internals

    def _raise(self, level: int) -> None:
        """Raise the high-water mark to ``level`` (noted in the kept file, written within its interval)."""
        self._high = level
        if self._kept is not None:
            self._kept.advance(level)

    def _who(self, mark: int) -> str:
        """Who saw tokens up to ``mark``: this coordinator, before its restart when the mark is the kept one."""
        if self._kept is not None and 0 < mark <= self._kept.recorded:
            return f"this coordinator, before its restart (its data directory's {self._kept.path})"
        return "this coordinator"

    def _refusal(self) -> Unavailable:
        if self._problem is None:
            return etcd_unavailable("the coordinator has not yet read its token record from etcd")
        return data_loss(f"fencing tokens would go back: {self._problem}; no token is granted until an operator "
                         f"runs 'fencepost admin recover-tokens' ({PROCEDURE})")

    def _moved(self, cluster_id: int) -> str:
        assert self._record is not None
        return (f"etcd's cluster id is {cluster_id:x}, but the tokens were handed out under cluster id "
                f"{self._record.cluster_id:x} (the token record): etcd was restored or replaced")

    def _went_back(self, problem: str) -> None:
        self._detections += 1
        if self._problem is None:
            self._problem = problem
            log_event(_log, logging.ERROR, "tokens_went_back",
                      f"fencing tokens would go back: {problem}. Refusing Acquire, Release, Describe, ListLocks "
                      f"and LeaseGrant (UNAVAILABLE/DATA_LOSS), health NOT_SERVING, until an operator runs "
                      f"'fencepost admin recover-tokens --above T' with T at least the highest token ever handed "
                      f"out (at least {self._high}, the highest this coordinator may have handed out); see "
                      f"{PROCEDURE}", high=self._high, floor=self.floor)

    async def _create(self, cluster_id: int) -> tuple[TokenRecord, int, int]:
        """Write the record at the first start (create-only): the record, its mod revision, and the revision etcd
        answered at (at least every ``high`` the record can hold: each was seen before its create was sent)."""
        assert self._etcd is not None
        mine = TokenRecord(cluster_id, 0, self._high)

        def stored(resp: Any) -> tuple[TokenRecord, int, int]:
            kvs = resp.responses[0].response_range.kvs
            if not kvs:
                return NOT_APPLIED  # type: ignore[no-any-return]
            return TokenRecord.decode(bytes(kvs[0].value)), int(kvs[0].mod_revision), int(resp.header.revision)

        def decide(resp: Any) -> tuple[TokenRecord, int, int]:
            if resp.succeeded:
                _log.info("token record %s created (etcd cluster id %x, token floor 0)",
                          self.key.decode(errors="replace"), cluster_id)
                return mine, int(resp.header.revision), int(resp.header.revision)
            return stored(resp)  # another coordinator created it first

        read = [etcdops.get(self.key)]
        return await self._etcd.txn(TxnPlan(etcdops.txn([etcdops.is_absent(self.key)],
                                                         [etcdops.put(self.key, mine.encode())], read),
                                            decide, read, stored))

    async def _publish(self, record: TokenRecord, mod_revision: int) -> None:
        """Raise the record's ``high`` to this coordinator's mark, unless the record changed meanwhile."""
        assert self._etcd is not None
        raised = TokenRecord(record.cluster_id, record.floor, self._high)
        plan = TxnPlan(etcdops.txn([etcdops.is_unchanged(self.key, mod_revision)],
                                   [etcdops.put(self.key, raised.encode())]),
                       lambda resp: bool(resp.succeeded), [], lambda resp: True)
        try:
            if await self._etcd.txn(plan):
                _log.warning("token record: published this coordinator's highest token %d, so that every "
                             "coordinator refuses", self._high)
        except FencepostError as exc:
            _log.warning("could not publish the highest token %d in the token record: %s", self._high, exc)


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` did.

    Attributes:
        record: The token record written.
        revision: The etcd revision of the recovery (every later key is newer).
        lowest_token: The lowest token a grant can get from now on.
        deleted: How many lock keys (holds and waits from before) were deleted.
        previous: The record before, None when there was none.
    """

    record: TokenRecord
    revision: int
    lowest_token: int
    deleted: int
    previous: TokenRecord | None


async def recover(etcd: EtcdClient, keys: Keys, above: int, *, attempts: int = 5) -> Recovery:
    """Make every later token greater than ``above``: raise the token floor, record the cluster id.

    In one etcd Txn: deletes every lock key under the prefix (holds and waits
    that came with the restored data: granting them would hand out their old,
    smaller tokens; their holders' KeepAlive streams get HoldEnded) and writes
    the token record with this cluster's id and a floor F such that every key
    created afterwards gets a token greater than ``above``, than the level the
    restored data was at, and than every coordinator's published high-water
    mark. Coordinators serve again at their next check (within a second);
    none creates a key under the old floor meanwhile (:mod:`.floor_guard`).

    Args:
        etcd: An etcd layer on the restored cluster.
        keys: The coordinators' key layout (their ``--prefix``).
        above: The highest fencing token ever handed out (or more); >= 0.
        attempts: How often to re-read when the record changes under the Txn.

    Returns:
        What was written.

    Raises:
        ValueError: ``above`` out of range.
        Unavailable: etcd unreachable, or the record kept changing.
    """
    if not 0 <= above < MAX_TOKEN // 2:
        raise ValueError(f"above is {above}; must be 0 to {MAX_TOKEN // 2 - 1}")
    key = record_key(keys)
    for _ in range(attempts):
        resp = await etcd.range(etcdops.get(key).request_range)
        base = int(resp.header.revision)
        previous: TokenRecord | None = None
        if resp.kvs:
            try:
                previous = TokenRecord.decode(bytes(resp.kvs[0].value))
            except ValueError:
                _log.warning("the token record held %s; overwriting it",
                             bytes(resp.kvs[0].value)[:100].decode("utf-8", "backslashreplace"))
        target = max(above, base + (previous.floor if previous else 0), previous.high if previous else 0)
        # Keys created after this Txn (at revision >= base + 1) have revisions >= base + 2: tokens > target.
        record = TokenRecord(int(resp.header.cluster_id), target - base, target)
        written = record.encode()
        compare = etcdops.is_unchanged(key, int(resp.kvs[0].mod_revision)) if resp.kvs else etcdops.is_absent(key)
        deletes = [rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=start, range_end=end))
                   for start, end in ((keys.prefix, key), (key + b"\0", keys.range_end))]

        def decide(r: Any) -> tuple[bool, int, int]:
            if not r.succeeded:
                return False, 0, 0
            return True, int(r.header.revision), sum(int(op.response_delete_range.deleted) for op in r.responses[:2])

        def resolve(r: Any) -> tuple[bool, int, int]:
            kvs = r.responses[0].response_range.kvs
            if kvs and bytes(kvs[0].value) == written:
                return True, int(kvs[0].mod_revision), -1  # applied; its count of deletions is lost
            return NOT_APPLIED  # type: ignore[no-any-return]

        done, revision, deleted = await etcd.txn(TxnPlan(
            etcdops.txn([compare], [*deletes, etcdops.put(key, written)]), decide, [etcdops.get(key)], resolve))
        if done:
            _log.info("tokens recovered at revision %d: token floor %d (was %s), every new token > %d; %s lock "
                      "keys deleted", revision, record.floor, previous.floor if previous else "no record",
                      target, deleted if deleted >= 0 else "some")
            return Recovery(record, revision, revision + 1 + record.floor, deleted, previous)
        await asyncio.sleep(0.05)  # the record changed under us (a coordinator published its mark): read again
    raise Unavailable(f"the token record {key.decode(errors='replace')} kept changing; try again")
