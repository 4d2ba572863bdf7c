"""S3 guard: a conditional PUT on the ETag read just before, the token in the object's metadata.

S3 has no conditional expression over metadata, only conditional writes on
the object's ETag, so a fenced write is a compare-and-swap of the whole
object. The token is user metadata (``x-amz-meta-fencing-token``, decimal;
no such metadata = no token yet). One ``put`` costs a read and a
conditional write::

    head_object(Bucket=b, Key=k)                    # -> ETag E, stored token s (404: no object)
    # s > t: refused, StaleTokenError(current_token=s); nothing written
    put_object(Bucket=b, Key=k, Body=..., Metadata={"fencing-token": str(t)},
               IfMatch=E)                           # IfNoneMatch="*" when there was no object

A 412 (PreconditionFailed: someone wrote in between), a 409
(ConditionalRequestConflict: a concurrent conditional write) or a 404 (the
object was deleted in between) starts over,
after a jittered pause (:data:`CONFLICT_BACKOFF`), with a fresh HEAD while
the stored token is still <= t; a write that keeps
losing to other writers gives up after ``max_attempts`` rounds with
:class:`~fencepost.client.ResourceExhausted` (nothing written by it).

Guarantee: the PUT lands only on the very object version whose token the
HEAD found <= t (S3 applies If-Match atomically), so a write with a lower
token than the stored one is refused, as for every guard. Not guaranteed:

- ETags are content hashes (MD5 of the body for a single-part upload without
  SSE-KMS), not versions. If between the HEAD and the PUT the object is
  rewritten to exactly the bytes the HEAD saw (A -> B -> A, under a higher
  token), its ETag is the same again and a stale write can land. When the
  same body can recur, make every body unique (carry the fencing token in
  it).
- Writes that do not go through the guard (a plain ``put_object``, a copy,
  a lifecycle rule) are not checked, and a PUT without the metadata resets
  the object to "no token yet".
- Needs a store that honours If-Match and If-None-Match on PutObject: AWS S3
  (since November 2024), and boto3 1.35.69 or later to send them.

Object keys are strings; the body is bytes (a str is sent as UTF-8). The
metadata key is lower case (S3 lower-cases user metadata names); the guard
owns it: ``metadata`` naming it raises InvalidArgument.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgument, ResourceExhausted
from ..v1.retry import Backoff
from ._ahead import TokenHold
from ._guard import FencingGuard, MalformedTokenError, RejectHook, stored_token, writer_token

#: The user metadata name (x-amz-meta-...) that stores the token.
TOKEN_METADATA = "fencing-token"
#: HEAD + conditional PUT rounds before a contended write gives up.
MAX_ATTEMPTS = 16
#: The pause after a conditional write lost to another write (full jitter, 5 ms growing to 200 ms).
CONFLICT_BACKOFF = Backoff(base=0.005, cap=0.2)
#: The error codes of a conditional write that lost to another write (NoSuchKey: an
#: If-Match PUT on an object deleted since the HEAD).
RETRY_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409", "NoSuchKey", "404"})
_METADATA_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def _body(body: object) -> bytes:
    if isinstance(body, str):
        try:
            return body.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidArgument(f"body must be valid UTF-8: {err.reason}", field="body") from None
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise InvalidArgument(f"body must be bytes or str, got {type(body).__name__}", field="body")


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class S3Guard(FencingGuard):
    """Fenced writes to the objects of one S3 bucket (boto3 low-level client).

    Args:
        client: ``boto3.client("s3", ...)`` (thread-safe; shared by writers).
        bucket: The bucket name.
        token_metadata: The user metadata name that stores the token
            (lower case letters, digits, ``-``, ``_``, ``.``).
        max_attempts: HEAD + conditional PUT rounds a contended write may
            take (>= 1).
        on_reject: Hook called with each StaleTokenError (see FencingGuard).
        metrics: A ``prometheus_client.CollectorRegistry`` to count writes in
            (see FencingGuard); ``storage`` is ``s3``.

    Raises:
        InvalidArgument: ``client`` is not an S3 client, ``bucket`` is not a
            non-empty str, ``token_metadata`` is not a lower-case metadata
            name, or ``max_attempts`` is not an int >= 1.
    """

    storage = "s3"

    def __init__(self, client: Any, bucket: str, *, token_metadata: str = TOKEN_METADATA,
                 max_attempts: int = MAX_ATTEMPTS, on_reject: RejectHook | None = None,
                 metrics: Any = None) -> None:
        super().__init__(on_reject=on_reject, metrics=metrics)
        if not all(callable(getattr(client, m, None)) for m in ("put_object", "head_object", "get_object")):
            raise InvalidArgument(f"client must be a boto3 S3 client, got {client!r}", field="client")
        if not isinstance(bucket, str) or not bucket.strip():
            raise InvalidArgument(f"bucket must be a non-empty bucket name, got {bucket!r}", field="bucket")
        if not isinstance(token_metadata, str) or not _METADATA_NAME.match(token_metadata):
            raise InvalidArgument(f"token_metadata must match {_METADATA_NAME.pattern}, got {token_metadata!r}",
                                  field="token_metadata")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be an int >= 1, got {max_attempts!r}", field="max_attempts")
        self.client = client
        self.bucket = bucket
        self.token_metadata = token_metadata
        self.max_attempts = max_attempts

    def put(self, key: str, token: int | TokenHold, body: bytes | str, *,
            metadata: Mapping[str, str] | None = None, content_type: str | None = None) -> str:
        """Write the object if ``token`` is not lower than its token: HEAD, then a conditional PUT.

        Args:
            key: The object key (a non-empty str).
            token: The writer's fencing token, or its lock handle (then a
                refusal while the hold is live is a StoredTokenAheadError).
            body: The object's new content (bytes; a str is sent as UTF-8).
            metadata: Other user metadata (str -> str), stored with the token.
            content_type: The object's Content-Type (S3's default when None).

        Returns:
            The ETag of the written object.

        Raises:
            StaleTokenError: the object holds a higher token; nothing was written
                (StoredTokenAheadError while the hold given as ``token`` is live).
            ResourceExhausted: ``max_attempts`` conditional PUTs each lost to
                another write while the stored token stayed <= ``token``;
                nothing was written by this call.
            InvalidArgument: a bad key, token, body or metadata (naming the
                token metadata, say); nothing was sent.
            MalformedTokenError: the object's token metadata is not a canonical
                non-negative integer (written outside the guard); nothing was written.
            botocore.exceptions.ClientError: any other failure (no such bucket).
        """
        token, hold = writer_token(token)
        self._check_key(key)
        data = _body(body)
        extra = self._check_metadata(metadata)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": data,
                                  "Metadata": {**extra, self.token_metadata: str(token)}}
        if content_type is not None:
            kwargs["ContentType"] = content_type
        pauses = CONFLICT_BACKOFF.delays()
        for attempt in range(self.max_attempts):
            if attempt:
                time.sleep(next(pauses))
            etag, stored = self._head(key)
            current = stored_token(stored, text=True)
            if stored is not None and current is None:
                raise self._malformed(key, token, stored, what=f"{self.token_metadata} metadata")
            if current is not None and current > token:
                raise self._reject(key, token, current, hold=hold)
            condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
            try:
                written = str(self.client.put_object(**kwargs, **condition)["ETag"])
                self._accepted()
                return written
            except self.client.exceptions.ClientError as exc:
                if _code(exc) not in RETRY_CODES:
                    raise
        raise ResourceExhausted(f"s3://{self.bucket}/{key}: {self.max_attempts} conditional writes with fencing "
                                f"token {token} each lost to another write; nothing written, retry later")

    def get(self, key: str) -> tuple[bytes | None, int | None]:
        """Read an object: (body, token), each None when absent (one GET).

        Raises:
            InvalidArgument: ``key`` is not a non-empty str.
            MalformedTokenError: the token metadata is not a canonical
                non-negative integer (not counted: nothing was refused).
            botocore.exceptions.ClientError: any failure but a missing object.
        """
        self._check_key(key)
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
        except self.client.exceptions.ClientError as exc:
            if _code(exc) in {"NoSuchKey", "404"}:
                return None, None
            raise
        stored = (resp.get("Metadata") or {}).get(self.token_metadata)
        token = stored_token(stored, text=True)
        if stored is not None and token is None:
            raise MalformedTokenError(f"s3://{self.bucket}/{key}: the stored {self.token_metadata} metadata is "
                                      f"{stored!r}, not a fencing token", record=key, stored=stored)
        return resp["Body"].read(), token

    def _head(self, key: str) -> tuple[str | None, str | None]:
        """(ETag, stored token metadata as text) of the object; (None, None) when there is none."""
        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=key)
        except self.client.exceptions.ClientError as exc:
            if _code(exc) in {"404", "NoSuchKey", "NotFound"}:
                return None, None
            raise
        return str(resp["ETag"]), (resp.get("Metadata") or {}).get(self.token_metadata)

    @staticmethod
    def _check_key(key: object) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"key must be a non-empty object key, got {key!r}", field="key")

    def _check_metadata(self, metadata: Mapping[str, str] | None) -> dict[str, str]:
        if metadata is None:
            return {}
        if not isinstance(metadata, Mapping):
            raise InvalidArgument(f"metadata must be a mapping of str to str, got {type(metadata).__name__}",
                                  field="metadata")
        for name, value in metadata.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise InvalidArgument(f"metadata must map str to str, got {name!r}: {value!r}", field="metadata")
            if name.lower() == self.token_metadata:
                raise InvalidArgument(f"metadata must not set {name!r}: the guard writes the fencing token itself",
                                      field="metadata")
        return dict(metadata)
