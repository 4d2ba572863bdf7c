// Fencepost lock service, version 1.
//
// Locks with fencing tokens on top of etcd. Read this file as the API
// reference; the repository's docs/architecture.md explains the model and
// the guarantees.
//
// Model in short:
// - A *lease* is an etcd lease with a TTL in whole seconds. The caller keeps
//   it alive by sending keepalives on the KeepAlive stream about every
//   TTL/3. A lease that receives no keepalive for TTL seconds expires, and
//   every lock it holds or waits for is released. A client normally keeps one
//   lease for all its locks of one TTL.
// - A *lock* is named by a UTF-8 string. Contenders for one name are granted
//   the lock first come, first served. One lease may hold many locks.
// - Every grant carries a *fencing token*: the etcd revision at which the
//   holder's key was created, plus the token floor (0 until an operator
//   recovers from an etcd restore, see ErrorReason DATA_LOSS). Tokens of
//   successive holders of one name strictly increase, across coordinator
//   restarts, etcd leader changes and etcd restores. Tokens are ordered
//   per name only: grants of different names may carry the same token
//   (a coordinator writes concurrent grants in one etcd transaction).
//   A TTL alone is not mutual exclusion: pass the token to the storage and
//   let it reject writes that carry a token lower than one it has accepted.
// - A *hold* is one grant of one lock: the triple (name, lease_id, token).
//   It lasts until Release, the lease's end, or the deletion of its key.
//
// Errors: every failed call returns a gRPC status whose details hold one
// google.rpc.ErrorInfo with domain "fencepost.dev" and, as its reason, the
// name of an ErrorReason value below. Calls that fail with UNAVAILABLE also
// carry a google.rpc.RetryInfo and may be retried. A coordinator run with
// an access policy (`fencepost serve --policy`) may refuse any call with
// PERMISSION_DENIED/ACCESS_DENIED (see that reason; docs/security.md says
// which action each call needs). ErrorInfo.metadata keys,
// each present only where it applies and known (numbers in decimal):
//   field          INVALID_FIELD: the request field at fault ("name",
//                  "ttl_seconds", "lease_id", "token", "wait_ms").
//   name           the lock name the call concerned.
//   lease_id       the lease id the call concerned.
//   token          the fencing token the call carried (Release).
//   current_token  STALE_TOKEN: the newer token under which the lease holds
//                  the lock. NOT_HOLDER: the token of the lock's current
//                  holder, when the lock is held.
//   action         ACCESS_DENIED: the action the access policy refused
//                  ("acquire", "release", "describe", "admin").
//   limit          LIMIT_EXCEEDED: the limit reached, as its `fencepost
//                  serve` flag without dashes ("max-leases-per-caller").
//   value          LIMIT_EXCEEDED: that limit's configured value.
//
// Retries: Release, Withdraw, Acquire, Campaign, Resign, AcquirePermit,
// ReleasePermit and AdminRevoke take a request_id: chosen by the caller,
// 1 to 64 characters of [A-Za-z0-9_-] (a UUID's hex is fine), unique per
// call and the same on each retry of that call. A retry (after a lost
// answer, a broken connection, another replica) of a call that succeeded
// answers as the first attempt did, for at least 60 s after it, instead of
// doing it again or failing: Release, Resign and ReleasePermit answer OK
// with the first revision, AdminRevoke names the lease it revoked. Acquire,
// Campaign and AcquirePermit are idempotent per (lease_id, name) anyway; a
// wait the caller abandoned is removed by Withdraw (Resign / ReleasePermit
// with token 0), itself idempotent. An empty request_id: no record (the
// behaviour before request ids). LeaseGrant has none: a LeaseGrant whose
// answer is lost leaves a lease that holds nothing and expires after its TTL.
// How: the call's etcd transaction also writes a record
// "<prefix>.request.<request_id>" naming the call (method, name, lease_id,
// token, slot), under a lease of the coordinators' own that is never kept
// alive (the record ends 60 to 120 s later; AdminRevoke writes its record
// before it revokes). A retry that would be refused (NOT_HOLDER,
// STALE_TOKEN, LEASE_EXPIRED) reads the record: the same call is answered
// from it; another call gets REQUEST_ID_REUSED. So a reused id is noticed
// only by a call that would fail, or by AdminRevoke.
//
// Ownership: a lease belongs to the caller that granted it. With mutual TLS
// the owner is the identity of the caller's client certificate (its SPIFFE
// ID, else first URI SAN, else first DNS SAN, else subject CN); in every
// case LeaseGrant also returns a lease_secret. A call naming a lease
// (LeaseRevoke, LeaseKeepAlive, Acquire, Release, Withdraw, and keepalives
// and watches on the KeepAlive stream) is served only for its owner: a
// caller with the same certificate identity, or one that presents the
// lease's secret (as the gRPC metadata entry "fencepost-lease-secret" on
// unary calls, in KeepAliveRequest.lease_secret on the stream). Anyone else
// gets PERMISSION_DENIED / NOT_LEASE_OWNER (metadata lease_id) and nothing
// changes. A lease that is gone is reported as before (LEASE_EXPIRED,
// NOT_HOLDER, found = false), whoever asks. Describe and ListLocks show
// holders' lease ids and tokens, which are not credentials.

// @generated by protoc-gen-es v2.17.0 with parameter "target=ts,import_extension=js"
// @generated from file fencepost/v1/lock.proto (package fencepost.v1, syntax proto3)
/* eslint-disable */

import type { GenEnum, GenFile, GenMessage, GenService } from "@bufbuild/protobuf/codegenv2";
import { enumDesc, fileDesc, messageDesc, serviceDesc } from "@bufbuild/protobuf/codegenv2";
import type { Message } from "@bufbuild/protobuf";

/**
 * Describes the file fencepost/v1/lock.proto.
 */
export const file_fencepost_v1_lock: GenFile = /*@__PURE__*/
  fileDesc("ChdmZW5jZXBvc3QvdjEvbG9jay5wcm90bxIMZmVuY2Vwb3N0LnYxIigKEUxlYXNlR3JhbnRSZXF1ZXN0EhMKC3R0bF9zZWNvbmRzGAEgASgDIlEKEkxlYXNlR3JhbnRSZXNwb25zZRIQCghsZWFzZV9pZBgBIAEoAxITCgt0dGxfc2Vjb25kcxgCIAEoAxIUCgxsZWFzZV9zZWNyZXQYAyABKAkiJgoSTGVhc2VSZXZva2VSZXF1ZXN0EhAKCGxlYXNlX2lkGAEgASgDIiQKE0xlYXNlUmV2b2tlUmVzcG9uc2USDQoFZm91bmQYASABKAgiKQoVTGVhc2VLZWVwQWxpdmVSZXF1ZXN0EhAKCGxlYXNlX2lkGAEgASgDIj8KFkxlYXNlS2VlcEFsaXZlUmVzcG9uc2USEAoIbGVhc2VfaWQYASABKAMSEwoLdHRsX3NlY29uZHMYAiABKAMirQEKDkFjcXVpcmVSZXF1ZXN0EgwKBG5hbWUYASABKAkSEAoIbGVhc2VfaWQYAiABKAMSDwoHd2FpdF9tcxgDIAEoAxIUCgx3YWl0X2ZvcmV2ZXIYBCABKAgSGgoSbG9ja19kZWxheV9zZWNvbmRzGAUgASgDEhIKCnJlcXVlc3RfaWQYBiABKAkSJAoEbW9kZRgHIAEoDjIWLmZlbmNlcG9zdC52MS5Mb2NrTW9kZSJYCg9BY3F1aXJlUmVzcG9uc2USEAoIYWNxdWlyZWQYASABKAgSDQoFdG9rZW4YAiABKAMSJAoGaG9sZGVyGAMgASgLMhQuZmVuY2Vwb3N0LnYxLkhvbGRlciJ5Cg5SZWxlYXNlUmVxdWVzdBIMCgRuYW1lGAEgASgJEhAKCGxlYXNlX2lkGAIgASgDEg0KBXRva2VuGAMgASgDEhIKCnJlcXVlc3RfaWQYBCABKAkSJAoEbW9kZRgFIAEoDjIWLmZlbmNlcG9zdC52MS5Mb2NrTW9kZSIjCg9SZWxlYXNlUmVzcG9uc2USEAoIcmV2aXNpb24YASABKAMibwoRQWNxdWlyZUFsbFJlcXVlc3QSDQoFbmFtZXMYASADKAkSEAoIbGVhc2VfaWQYAiABKAMSDwoHd2FpdF9tcxgDIAEoAxIUCgx3YWl0X2ZvcmV2ZXIYBCABKAgSEgoKcmVxdWVzdF9pZBgFIAEoCSJvChJBY3F1aXJlQWxsUmVzcG9uc2USEAoIYWNxdWlyZWQYASABKAgSDgoGdG9rZW5zGAIgAygDEiQKBmhvbGRlchgDIAEoCzIULmZlbmNlcG9zdC52MS5Ib2xkZXISEQoJaGVsZF9uYW1lGAQgASgJIlcKEVJlbGVhc2VBbGxSZXF1ZXN0Eg0KBW5hbWVzGAEgAygJEhAKCGxlYXNlX2lkGAIgASgDEg0KBXRva2VuGAMgASgDEhIKCnJlcXVlc3RfaWQYBCABKAkiNQoSUmVsZWFzZUFsbFJlc3BvbnNlEhAKCHJldmlzaW9uGAEgASgDEg0KBWZvdW5kGAIgASgFImsKD1dpdGhkcmF3UmVxdWVzdBIMCgRuYW1lGAEgASgJEhAKCGxlYXNlX2lkGAIgASgDEhIKCnJlcXVlc3RfaWQYAyABKAkSJAoEbW9kZRgEIAEoDjIWLmZlbmNlcG9zdC52MS5Mb2NrTW9kZSJBChBXaXRoZHJhd1Jlc3BvbnNlEg0KBWZvdW5kGAEgASgIEgwKBGhlbGQYAiABKAgSEAoIcmV2aXNpb24YAyABKAMiNwoGSG9sZGVyEhAKCGxlYXNlX2lkGAEgASgDEg0KBXRva2VuGAIgASgDEgwKBHJlYWQYAyABKAgiwQQKEEtlZXBBbGl2ZVJlcXVlc3QSMQoJa2VlcGFsaXZlGAEgASgLMhwuZmVuY2Vwb3N0LnYxLkxlYXNlS2VlcEFsaXZlSAASKAoFd2F0Y2gYAiABKAsyFy5mZW5jZXBvc3QudjEuV2F0Y2hIb2xkSAASKgoHdW53YXRjaBgDIAEoCzIXLmZlbmNlcG9zdC52MS5XYXRjaEhvbGRIABIvCgdhY3F1aXJlGAUgASgLMhwuZmVuY2Vwb3N0LnYxLkFjcXVpcmVSZXF1ZXN0SAASLwoHcmVsZWFzZRgGIAEoCzIcLmZlbmNlcG9zdC52MS5SZWxlYXNlUmVxdWVzdEgAEjEKCHdpdGhkcmF3GAcgASgLMh0uZmVuY2Vwb3N0LnYxLldpdGhkcmF3UmVxdWVzdEgAEioKBmNhbmNlbBgIIAEoCzIYLmZlbmNlcG9zdC52MS5DYW5jZWxDYWxsSAASMwoKa2VlcGFsaXZlcxgMIAEoCzIdLmZlbmNlcG9zdC52MS5MZWFzZUtlZXBBbGl2ZXNIABIqCgVjYWxscxgPIAEoCzIZLmZlbmNlcG9zdC52MS5TdHJlYW1DYWxsc0gAEhQKDGxlYXNlX3NlY3JldBgEIAEoCRISCgpyZXF1ZXN0X2lkGAkgASgEEhIKCnRpbWVvdXRfbXMYCiABKAMSEwoLdHJhY2VwYXJlbnQYCyABKAkSEwoLbGFzdF9ydHRfbXMYDSABKA0SDwoHc2VudF9tcxgOIAEoBEIJCgdyZXF1ZXN0IiAKCkNhbmNlbENhbGwSEgoKcmVxdWVzdF9pZBgBIAEoBCKoAgoKU3RyZWFtQ2FsbBIvCgdhY3F1aXJlGAEgASgLMhwuZmVuY2Vwb3N0LnYxLkFjcXVpcmVSZXF1ZXN0SAASLwoHcmVsZWFzZRgCIAEoCzIcLmZlbmNlcG9zdC52MS5SZWxlYXNlUmVxdWVzdEgAEjEKCHdpdGhkcmF3GAMgASgLMh0uZmVuY2Vwb3N0LnYxLldpdGhkcmF3UmVxdWVzdEgAEioKBmNhbmNlbBgEIAEoCzIYLmZlbmNlcG9zdC52MS5DYW5jZWxDYWxsSAASEgoKcmVxdWVzdF9pZBgFIAEoBBISCgp0aW1lb3V0X21zGAYgASgDEhMKC3RyYWNlcGFyZW50GAcgASgJEhQKDGxlYXNlX3NlY3JldBgIIAEoCUIGCgRjYWxsIjYKC1N0cmVhbUNhbGxzEicKBWNhbGxzGAEgAygLMhguZmVuY2Vwb3N0LnYxLlN0cmVhbUNhbGwi9QEKDFN0cmVhbUFuc3dlchIxCghhY3F1aXJlZBgBIAEoCzIdLmZlbmNlcG9zdC52MS5BY3F1aXJlUmVzcG9uc2VIABIxCghyZWxlYXNlZBgCIAEoCzIdLmZlbmNlcG9zdC52MS5SZWxlYXNlUmVzcG9uc2VIABIzCgl3aXRoZHJhd24YAyABKAsyHi5mZW5jZXBvc3QudjEuV2l0aGRyYXdSZXNwb25zZUgAEioKBmZhaWxlZBgEIAEoCzIYLmZlbmNlcG9zdC52MS5DYWxsRmFpbGVkSAASEgoKcmVxdWVzdF9pZBgFIAEoBEIKCghyZXNwb25zZSI8Cg1TdHJlYW1BbnN3ZXJzEisKB2Fuc3dlcnMYASADKAsyGi5mZW5jZXBvc3QudjEuU3RyZWFtQW5zd2VyIkwKDkxlYXNlS2VlcEFsaXZlEhAKCGxlYXNlX2lkGAEgASgDEhIKCnJlcXVlc3RfaWQYAiABKAQSFAoMbGVhc2Vfc2VjcmV0GAMgASgJIkMKD0xlYXNlS2VlcEFsaXZlcxIwCgprZWVwYWxpdmVzGAEgAygLMhwuZmVuY2Vwb3N0LnYxLkxlYXNlS2VlcEFsaXZlIm4KCVdhdGNoSG9sZBIMCgRuYW1lGAEgASgJEhAKCGxlYXNlX2lkGAIgASgDEg0KBXRva2VuGAMgASgDEiQKBGtpbmQYBCABKA4yFi5mZW5jZXBvc3QudjEuSG9sZEtpbmQSDAoEc2xvdBgFIAEoBSLHAwoRS2VlcEFsaXZlUmVzcG9uc2USNAoJa2VlcGFsaXZlGAEgASgLMh8uZmVuY2Vwb3N0LnYxLkxlYXNlS2VlcEFsaXZlQWNrSAASLQoKaG9sZF9lbmRlZBgCIAEoCzIXLmZlbmNlcG9zdC52MS5Ib2xkRW5kZWRIABIxCghhY3F1aXJlZBgDIAEoCzIdLmZlbmNlcG9zdC52MS5BY3F1aXJlUmVzcG9uc2VIABIxCghyZWxlYXNlZBgEIAEoCzIdLmZlbmNlcG9zdC52MS5SZWxlYXNlUmVzcG9uc2VIABIzCgl3aXRoZHJhd24YBSABKAsyHi5mZW5jZXBvc3QudjEuV2l0aGRyYXdSZXNwb25zZUgAEioKBmZhaWxlZBgGIAEoCzIYLmZlbmNlcG9zdC52MS5DYWxsRmFpbGVkSAASNgoKa2VlcGFsaXZlcxgIIAEoCzIgLmZlbmNlcG9zdC52MS5MZWFzZUtlZXBBbGl2ZUFja3NIABIuCgdhbnN3ZXJzGAkgASgLMhsuZmVuY2Vwb3N0LnYxLlN0cmVhbUFuc3dlcnNIABISCgpyZXF1ZXN0X2lkGAcgASgEQgoKCHJlc3BvbnNlIjsKCkNhbGxGYWlsZWQSDAoEY29kZRgBIAEoBRIPCgdtZXNzYWdlGAIgASgJEg4KBnN0YXR1cxgDIAEoDCJOChFMZWFzZUtlZXBBbGl2ZUFjaxIQCghsZWFzZV9pZBgBIAEoAxISCgpyZXF1ZXN0X2lkGAIgASgEEhMKC3R0bF9zZWNvbmRzGAMgASgDIkMKEkxlYXNlS2VlcEFsaXZlQWNrcxItCgRhY2tzGAEgAygLMh8uZmVuY2Vwb3N0LnYxLkxlYXNlS2VlcEFsaXZlQWNrIp8BCglIb2xkRW5kZWQSDAoEbmFtZRgBIAEoCRIQCghsZWFzZV9pZBgCIAEoAxINCgV0b2tlbhgDIAEoAxIpCgZyZWFzb24YBSABKA4yGS5mZW5jZXBvc3QudjEuRXJyb3JSZWFzb24SJAoEa2luZBgGIAEoDjIWLmZlbmNlcG9zdC52MS5Ib2xkS2luZBIMCgRzbG90GAcgASgFSgQIBBAFIh8KD0Rlc2NyaWJlUmVxdWVzdBIMCgRuYW1lGAEgASgJIq0CChBEZXNjcmliZVJlc3BvbnNlEgwKBGhlbGQYASABKAgSJAoGaG9sZGVyGAIgASgLMhQuZmVuY2Vwb3N0LnYxLkhvbGRlchIdChV0dGxfcmVtYWluaW5nX3NlY29uZHMYAyABKAMSEwoLdHRsX3NlY29uZHMYBCABKAMSFAoMd2FpdGVyX2NvdW50GAUgASgDEiUKB3dhaXRlcnMYBiADKAsyFC5mZW5jZXBvc3QudjEuSG9sZGVyEhAKCHJldmlzaW9uGAcgASgDEh8KF2xvY2tfZGVsYXlfcmVtYWluaW5nX21zGAggASgDEhoKEmxvY2tfZGVsYXlfc2Vjb25kcxgJIAEoAxIlCgdob2xkZXJzGAogAygLMhQuZmVuY2Vwb3N0LnYxLkhvbGRlciJJChBMaXN0TG9ja3NSZXF1ZXN0Eg4KBnByZWZpeBgBIAEoCRIRCglwYWdlX3NpemUYAiABKAUSEgoKcGFnZV90b2tlbhgDIAEoCSLxAQoITG9ja0luZm8SDAoEbmFtZRgBIAEoCRIkCgZob2xkZXIYAiABKAsyFC5mZW5jZXBvc3QudjEuSG9sZGVyEh0KFXR0bF9yZW1haW5pbmdfc2Vjb25kcxgDIAEoAxITCgt0dGxfc2Vjb25kcxgEIAEoAxIUCgxoZWxkX3NlY29uZHMYBSABKAESFAoMd2FpdGVyX2NvdW50GAYgASgDEh8KF2xvY2tfZGVsYXlfcmVtYWluaW5nX21zGAcgASgDEhoKEmxvY2tfZGVsYXlfc2Vjb25kcxgIIAEoAxIUCgxob2xkZXJfY291bnQYCSABKAMiZQoRTGlzdExvY2tzUmVzcG9uc2USJQoFbG9ja3MYASADKAsyFi5mZW5jZXBvc3QudjEuTG9ja0luZm8SFwoPbmV4dF9wYWdlX3Rva2VuGAIgASgJEhAKCHJldmlzaW9uGAMgASgDIhMKEVNlcnZlckluZm9SZXF1ZXN0IvABCghFdGNkSW5mbxIRCgllbmRwb2ludHMYASADKAkSEAoIZW1iZWRkZWQYAiABKAgSEQoJYXZhaWxhYmxlGAMgASgIEg0KBWVycm9yGAQgASgJEhYKDnNlcnZlcl92ZXJzaW9uGAUgASgJEhIKCmNsdXN0ZXJfaWQYBiABKAQSEQoJbWVtYmVyX2lkGAcgASgEEhAKCHJldmlzaW9uGAggASgDEhEKCXJhZnRfdGVybRgJIAEoBBIOCgZsZWFkZXIYCiABKAQSEgoKcmFmdF9pbmRleBgLIAEoBBIVCg1kYl9zaXplX2J5dGVzGAwgASgDIp8DChJTZXJ2ZXJJbmZvUmVzcG9uc2USDwoHdmVyc2lvbhgBIAEoCRITCgtpbnN0YW5jZV9pZBgCIAEoCRIWCg51cHRpbWVfc2Vjb25kcxgDIAEoARIWCg5saXN0ZW5fYWRkcmVzcxgEIAEoCRIWCg5oZWFsdGhfYWRkcmVzcxgFIAEoCRIXCg9tZXRyaWNzX2FkZHJlc3MYBiABKAkSFAoMaHR0cF9hZGRyZXNzGBEgASgJEhIKCmtleV9wcmVmaXgYByABKAkSDwoHc2VydmluZxgIIAEoCBIkCgRldGNkGAkgASgLMhYuZmVuY2Vwb3N0LnYxLkV0Y2RJbmZvEhkKEWtlZXBhbGl2ZV9zdHJlYW1zGAogASgDEhgKEGtlZXBhbGl2ZV9sZWFzZXMYCyABKAMSFQoNd2F0Y2hlZF9ob2xkcxgMIAEoAxIYChB3YWl0aW5nX2FjcXVpcmVzGA0gASgDEhYKDmNvbnRlbmRlcl9rZXlzGA4gASgDEhIKCmhlbGRfbG9ja3MYDyABKAMSDwoHd2FpdGVycxgQIAEoAyJqChJBZG1pblJldm9rZVJlcXVlc3QSEgoKcmVxdWVzdF9pZBgCIAEoCRIMCgRuYW1lGAEgASgJEiQKBGtpbmQYAyABKA4yFi5mZW5jZXBvc3QudjEuSG9sZEtpbmQSDAoEc2xvdBgEIAEoBSJHChNBZG1pblJldm9rZVJlc3BvbnNlEg8KB3Jldm9rZWQYASABKAgSEAoIbGVhc2VfaWQYAiABKAMSDQoFdG9rZW4YAyABKAMiPAoTTGlzdFNlc3Npb25zUmVxdWVzdBIRCglwYWdlX3NpemUYASABKAUSEgoKcGFnZV90b2tlbhgCIAEoCSKJAQoLU2Vzc2lvbkluZm8SEAoIbGVhc2VfaWQYASABKAMSFgoOb3duZXJfaWRlbnRpdHkYAiABKAkSEwoLdHRsX3NlY29uZHMYAyABKAMSHQoVdHRsX3JlbWFpbmluZ19zZWNvbmRzGAQgASgDEg0KBWhvbGRzGAUgAygJEg0KBXdhaXRzGAYgAygJIm4KFExpc3RTZXNzaW9uc1Jlc3BvbnNlEisKCHNlc3Npb25zGAEgAygLMhkuZmVuY2Vwb3N0LnYxLlNlc3Npb25JbmZvEhcKD25leHRfcGFnZV90b2tlbhgCIAEoCRIQCghyZXZpc2lvbhgDIAEoAyI8CgpMZWFkZXJJbmZvEhAKCGxlYXNlX2lkGAEgASgDEg0KBXRva2VuGAIgASgDEg0KBXZhbHVlGAMgASgMIn8KD0NhbXBhaWduUmVxdWVzdBIQCghlbGVjdGlvbhgBIAEoCRIQCghsZWFzZV9pZBgCIAEoAxINCgV2YWx1ZRgDIAEoDBIPCgd3YWl0X21zGAQgASgDEhQKDHdhaXRfZm9yZXZlchgFIAEoCBISCgpyZXF1ZXN0X2lkGAYgASgJIlwKEENhbXBhaWduUmVzcG9uc2USDwoHZWxlY3RlZBgBIAEoCBINCgV0b2tlbhgCIAEoAxIoCgZsZWFkZXIYAyABKAsyGC5mZW5jZXBvc3QudjEuTGVhZGVySW5mbyJTCg9Qcm9jbGFpbVJlcXVlc3QSEAoIZWxlY3Rpb24YASABKAkSEAoIbGVhc2VfaWQYAiABKAMSDQoFdG9rZW4YAyABKAMSDQoFdmFsdWUYBCABKAwiJAoQUHJvY2xhaW1SZXNwb25zZRIQCghyZXZpc2lvbhgBIAEoAyJWCg1SZXNpZ25SZXF1ZXN0EhAKCGVsZWN0aW9uGAEgASgJEhAKCGxlYXNlX2lkGAIgASgDEg0KBXRva2VuGAMgASgDEhIKCnJlcXVlc3RfaWQYBCABKAkiMQoOUmVzaWduUmVzcG9uc2USEAoIcmV2aXNpb24YASABKAMSDQoFZm91bmQYAiABKAgiIQoNTGVhZGVyUmVxdWVzdBIQCghlbGVjdGlvbhgBIAEoCSJMCg5MZWFkZXJSZXNwb25zZRIoCgZsZWFkZXIYASABKAsyGC5mZW5jZXBvc3QudjEuTGVhZGVySW5mbxIQCghyZXZpc2lvbhgCIAEoAyI6Cg5PYnNlcnZlUmVxdWVzdBIQCghlbGVjdGlvbhgBIAEoCRIWCg5hZnRlcl9yZXZpc2lvbhgCIAEoAyJgCg9PYnNlcnZlUmVzcG9uc2USKAoGbGVhZGVyGAEgASgLMhguZmVuY2Vwb3N0LnYxLkxlYWRlckluZm8SEAoIcmV2aXNpb24YAiABKAMSEQoJY29tcGFjdGVkGAMgASgIIj0KDFBlcm1pdEhvbGRlchIQCghsZWFzZV9pZBgBIAEoAxIMCgRzbG90GAIgASgFEg0KBXRva2VuGAMgASgDIoIBChRBY3F1aXJlUGVybWl0UmVxdWVzdBIMCgRuYW1lGAEgASgJEhAKCGxlYXNlX2lkGAIgASgDEg8KB3Blcm1pdHMYAyABKAUSDwoHd2FpdF9tcxgEIAEoAxIUCgx3YWl0X2ZvcmV2ZXIYBSABKAgSEgoKcmVxdWVzdF9pZBgGIAEoCSJzChVBY3F1aXJlUGVybWl0UmVzcG9uc2USEAoIYWNxdWlyZWQYASABKAgSDAoEc2xvdBgCIAEoBRINCgV0b2tlbhgDIAEoAxIrCgdob2xkZXJzGAQgAygLMhouZmVuY2Vwb3N0LnYxLlBlcm1pdEhvbGRlciJnChRSZWxlYXNlUGVybWl0UmVxdWVzdBIMCgRuYW1lGAEgASgJEhAKCGxlYXNlX2lkGAIgASgDEgwKBHNsb3QYAyABKAUSDQoFdG9rZW4YBCABKAMSEgoKcmVxdWVzdF9pZBgFIAEoCSI4ChVSZWxlYXNlUGVybWl0UmVzcG9uc2USEAoIcmV2aXNpb24YASABKAMSDQoFZm91bmQYAiABKAgiKAoYRGVzY3JpYmVTZW1hcGhvcmVSZXF1ZXN0EgwKBG5hbWUYASABKAkigQEKGURlc2NyaWJlU2VtYXBob3JlUmVzcG9uc2USDwoHcGVybWl0cxgBIAEoBRIrCgdob2xkZXJzGAIgAygLMhouZmVuY2Vwb3N0LnYxLlBlcm1pdEhvbGRlchIUCgx3YWl0ZXJfY291bnQYAyABKAMSEAoIcmV2aXNpb24YBCABKAMiKAoYQWRtaW5FbmRMb2NrRGVsYXlSZXF1ZXN0EgwKBG5hbWUYASABKAkiSwoZQWRtaW5FbmRMb2NrRGVsYXlSZXNwb25zZRINCgVlbmRlZBgBIAEoCBIfChdsb2NrX2RlbGF5X3JlbWFpbmluZ19tcxgCIAEoAyJuChdSZXBvcnRTdGFsZVdyaXRlUmVxdWVzdBIMCgRuYW1lGAEgASgJEg0KBXRva2VuGAIgASgDEhUKDWN1cnJlbnRfdG9rZW4YAyABKAMSDwoHc3RvcmFnZRgEIAEoCRIOCgZyZWNvcmQYBSABKAkiGgoYUmVwb3J0U3RhbGVXcml0ZVJlc3BvbnNlKvICCgtFcnJvclJlYXNvbhIcChhFUlJPUl9SRUFTT05fVU5TUEVDSUZJRUQQABIRCg1JTlZBTElEX0ZJRUxEEAESDgoKTk9UX0hPTERFUhACEg8KC1NUQUxFX1RPS0VOEAMSEQoNTEVBU0VfRVhQSVJFRBAEEhMKD0FDUVVJUkVfVElNRU9VVBAFEhQKEEVUQ0RfVU5BVkFJTEFCTEUQBhIUChBUT09fTUFOWV9XQUlURVJTEAcSEQoNU0hVVFRJTkdfRE9XThAIEhQKEFRPT19NQU5ZX1NUUkVBTVMQCRINCglEQVRBX0xPU1MQChIRCg1BQ0NFU1NfREVOSUVEEAsSEgoOTElNSVRfRVhDRUVERUQQDBITCg9OT1RfTEVBU0VfT1dORVIQDRIUChBQRVJNSVRTX01JU01BVENIEA4SFQoRUkVRVUVTVF9JRF9SRVVTRUQQDxIOCgpPVkVSTE9BREVEEBASDAoIRFJBSU5JTkcQESpjCghIb2xkS2luZBISCg5IT0xEX0tJTkRfTE9DSxAAEhYKEkhPTERfS0lORF9FTEVDVElPThABEhcKE0hPTERfS0lORF9TRU1BUEhPUkUQAhISCg5IT0xEX0tJTkRfUkVBRBADKjMKCExvY2tNb2RlEhMKD0xPQ0tfTU9ERV9XUklURRAAEhIKDkxPQ0tfTU9ERV9SRUFEEAEywA8KC0xvY2tTZXJ2aWNlEk8KCkxlYXNlR3JhbnQSHy5mZW5jZXBvc3QudjEuTGVhc2VHcmFudFJlcXVlc3QaIC5mZW5jZXBvc3QudjEuTGVhc2VHcmFudFJlc3BvbnNlElIKC0xlYXNlUmV2b2tlEiAuZmVuY2Vwb3N0LnYxLkxlYXNlUmV2b2tlUmVxdWVzdBohLmZlbmNlcG9zdC52MS5MZWFzZVJldm9rZVJlc3BvbnNlElsKDkxlYXNlS2VlcEFsaXZlEiMuZmVuY2Vwb3N0LnYxLkxlYXNlS2VlcEFsaXZlUmVxdWVzdBokLmZlbmNlcG9zdC52MS5MZWFzZUtlZXBBbGl2ZVJlc3BvbnNlEkYKB0FjcXVpcmUSHC5mZW5jZXBvc3QudjEuQWNxdWlyZVJlcXVlc3QaHS5mZW5jZXBvc3QudjEuQWNxdWlyZVJlc3BvbnNlEkYKB1JlbGVhc2USHC5mZW5jZXBvc3QudjEuUmVsZWFzZVJlcXVlc3QaHS5mZW5jZXBvc3QudjEuUmVsZWFzZVJlc3BvbnNlEkkKCFdpdGhkcmF3Eh0uZmVuY2Vwb3N0LnYxLldpdGhkcmF3UmVxdWVzdBoeLmZlbmNlcG9zdC52MS5XaXRoZHJhd1Jlc3BvbnNlElAKCUtlZXBBbGl2ZRIeLmZlbmNlcG9zdC52MS5LZWVwQWxpdmVSZXF1ZXN0Gh8uZmVuY2Vwb3N0LnYxLktlZXBBbGl2ZVJlc3BvbnNlKAEwARJJCghEZXNjcmliZRIdLmZlbmNlcG9zdC52MS5EZXNjcmliZVJlcXVlc3QaHi5mZW5jZXBvc3QudjEuRGVzY3JpYmVSZXNwb25zZRJMCglMaXN0TG9ja3MSHi5mZW5jZXBvc3QudjEuTGlzdExvY2tzUmVxdWVzdBofLmZlbmNlcG9zdC52MS5MaXN0TG9ja3NSZXNwb25zZRJPCgpTZXJ2ZXJJbmZvEh8uZmVuY2Vwb3N0LnYxLlNlcnZlckluZm9SZXF1ZXN0GiAuZmVuY2Vwb3N0LnYxLlNlcnZlckluZm9SZXNwb25zZRJSCgtBZG1pblJldm9rZRIgLmZlbmNlcG9zdC52MS5BZG1pblJldm9rZVJlcXVlc3QaIS5mZW5jZXBvc3QudjEuQWRtaW5SZXZva2VSZXNwb25zZRJVCgxMaXN0U2Vzc2lvbnMSIS5mZW5jZXBvc3QudjEuTGlzdFNlc3Npb25zUmVxdWVzdBoiLmZlbmNlcG9zdC52MS5MaXN0U2Vzc2lvbnNSZXNwb25zZRJJCghDYW1wYWlnbhIdLmZlbmNlcG9zdC52MS5DYW1wYWlnblJlcXVlc3QaHi5mZW5jZXBvc3QudjEuQ2FtcGFpZ25SZXNwb25zZRJJCghQcm9jbGFpbRIdLmZlbmNlcG9zdC52MS5Qcm9jbGFpbVJlcXVlc3QaHi5mZW5jZXBvc3QudjEuUHJvY2xhaW1SZXNwb25zZRJDCgZSZXNpZ24SGy5mZW5jZXBvc3QudjEuUmVzaWduUmVxdWVzdBocLmZlbmNlcG9zdC52MS5SZXNpZ25SZXNwb25zZRJDCgZMZWFkZXISGy5mZW5jZXBvc3QudjEuTGVhZGVyUmVxdWVzdBocLmZlbmNlcG9zdC52MS5MZWFkZXJSZXNwb25zZRJICgdPYnNlcnZlEhwuZmVuY2Vwb3N0LnYxLk9ic2VydmVSZXF1ZXN0Gh0uZmVuY2Vwb3N0LnYxLk9ic2VydmVSZXNwb25zZTABElgKDUFjcXVpcmVQZXJtaXQSIi5mZW5jZXBvc3QudjEuQWNxdWlyZVBlcm1pdFJlcXVlc3QaIy5mZW5jZXBvc3QudjEuQWNxdWlyZVBlcm1pdFJlc3BvbnNlElgKDVJlbGVhc2VQZXJtaXQSIi5mZW5jZXBvc3QudjEuUmVsZWFzZVBlcm1pdFJlcXVlc3QaIy5mZW5jZXBvc3QudjEuUmVsZWFzZVBlcm1pdFJlc3BvbnNlEmQKEURlc2NyaWJlU2VtYXBob3JlEiYuZmVuY2Vwb3N0LnYxLkRlc2NyaWJlU2VtYXBob3JlUmVxdWVzdBonLmZlbmNlcG9zdC52MS5EZXNjcmliZVNlbWFwaG9yZVJlc3BvbnNlEmQKEUFkbWluRW5kTG9ja0RlbGF5EiYuZmVuY2Vwb3N0LnYxLkFkbWluRW5kTG9ja0RlbGF5UmVxdWVzdBonLmZlbmNlcG9zdC52MS5BZG1pbkVuZExvY2tEZWxheVJlc3BvbnNlEmEKEFJlcG9ydFN0YWxlV3JpdGUSJS5mZW5jZXBvc3QudjEuUmVwb3J0U3RhbGVXcml0ZVJlcXVlc3QaJi5mZW5jZXBvc3QudjEuUmVwb3J0U3RhbGVXcml0ZVJlc3BvbnNlEk8KCkFjcXVpcmVBbGwSHy5mZW5jZXBvc3QudjEuQWNxdWlyZUFsbFJlcXVlc3QaIC5mZW5jZXBvc3QudjEuQWNxdWlyZUFsbFJlc3BvbnNlEk8KClJlbGVhc2VBbGwSHy5mZW5jZXBvc3QudjEuUmVsZWFzZUFsbFJlcXVlc3QaIC5mZW5jZXBvc3QudjEuUmVsZWFzZUFsbFJlc3BvbnNlYgZwcm90bzM");

/**
 * @generated from message fencepost.v1.LeaseGrantRequest
 */
export type LeaseGrantRequest = Message<"fencepost.v1.LeaseGrantRequest"> & {
  /**
   * ttl_seconds: requested lease TTL in whole seconds, 1 to 86400. etcd
   * raises TTLs below its minimum (about 2 s with default settings); the
   * granted TTL is returned and is never shorter than requested.
   *
   * @generated from field: int64 ttl_seconds = 1;
   */
  ttlSeconds: bigint;
};

/**
 * Describes the message fencepost.v1.LeaseGrantRequest.
 * Use `create(LeaseGrantRequestSchema)` to create a new message.
 */
export const LeaseGrantRequestSchema: GenMessage<LeaseGrantRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 0);

/**
 * @generated from message fencepost.v1.LeaseGrantResponse
 */
export type LeaseGrantResponse = Message<"fencepost.v1.LeaseGrantResponse"> & {
  /**
   * lease_id: the new lease's id (etcd lease id, > 0).
   *
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;

  /**
   * ttl_seconds: the TTL etcd granted, in seconds (>= the requested TTL).
   *
   * @generated from field: int64 ttl_seconds = 2;
   */
  ttlSeconds: bigint;

  /**
   * lease_secret: the lease's credential (43 characters of base64url, 256
   * random bits), returned only here and only once: present it with every
   * call naming this lease (metadata "fencepost-lease-secret", or
   * KeepAliveRequest.lease_secret). Valid on every replica until the lease
   * ends. The coordinator keeps only its SHA-256; Describe, ListLocks and
   * logs never show it. Treat it like a password: do not log it.
   *
   * @generated from field: string lease_secret = 3;
   */
  leaseSecret: string;
};

/**
 * Describes the message fencepost.v1.LeaseGrantResponse.
 * Use `create(LeaseGrantResponseSchema)` to create a new message.
 */
export const LeaseGrantResponseSchema: GenMessage<LeaseGrantResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 1);

/**
 * @generated from message fencepost.v1.LeaseRevokeRequest
 */
export type LeaseRevokeRequest = Message<"fencepost.v1.LeaseRevokeRequest"> & {
  /**
   * lease_id: the lease to end (> 0).
   *
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;
};

/**
 * Describes the message fencepost.v1.LeaseRevokeRequest.
 * Use `create(LeaseRevokeRequestSchema)` to create a new message.
 */
export const LeaseRevokeRequestSchema: GenMessage<LeaseRevokeRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 2);

/**
 * @generated from message fencepost.v1.LeaseRevokeResponse
 */
export type LeaseRevokeResponse = Message<"fencepost.v1.LeaseRevokeResponse"> & {
  /**
   * found: false when the lease had already expired or never existed.
   *
   * @generated from field: bool found = 1;
   */
  found: boolean;
};

/**
 * Describes the message fencepost.v1.LeaseRevokeResponse.
 * Use `create(LeaseRevokeResponseSchema)` to create a new message.
 */
export const LeaseRevokeResponseSchema: GenMessage<LeaseRevokeResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 3);

/**
 * @generated from message fencepost.v1.LeaseKeepAliveRequest
 */
export type LeaseKeepAliveRequest = Message<"fencepost.v1.LeaseKeepAliveRequest"> & {
  /**
   * lease_id: the lease to renew (> 0).
   *
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;
};

/**
 * Describes the message fencepost.v1.LeaseKeepAliveRequest.
 * Use `create(LeaseKeepAliveRequestSchema)` to create a new message.
 */
export const LeaseKeepAliveRequestSchema: GenMessage<LeaseKeepAliveRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 4);

/**
 * @generated from message fencepost.v1.LeaseKeepAliveResponse
 */
export type LeaseKeepAliveResponse = Message<"fencepost.v1.LeaseKeepAliveResponse"> & {
  /**
   * lease_id: the lease renewed.
   *
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;

  /**
   * ttl_seconds: the TTL etcd reset the lease to, in seconds (> 0).
   *
   * @generated from field: int64 ttl_seconds = 2;
   */
  ttlSeconds: bigint;
};

/**
 * Describes the message fencepost.v1.LeaseKeepAliveResponse.
 * Use `create(LeaseKeepAliveResponseSchema)` to create a new message.
 */
export const LeaseKeepAliveResponseSchema: GenMessage<LeaseKeepAliveResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 5);

/**
 * @generated from message fencepost.v1.AcquireRequest
 */
export type AcquireRequest = Message<"fencepost.v1.AcquireRequest"> & {
  /**
   * name: the lock name, 1 to 256 bytes of UTF-8 with no character of the
   * Unicode categories Cc, Cf, Zl or Zp (controls such as NUL or U+0085,
   * format characters such as U+200B or U+202E, U+2028, U+2029), else
   * INVALID_ARGUMENT naming the field. The same holds for every name and
   * election field below. Names are opaque: "a" and "a/b" are independent locks.
   *
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * lease_id: the lease that will hold the lock (from LeaseGrant, > 0).
   *
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * wait_ms: how long to wait for the lock, in milliseconds, 0 to 86400000.
   * 0 with wait_forever = false means try once.
   *
   * @generated from field: int64 wait_ms = 3;
   */
  waitMs: bigint;

  /**
   * wait_forever: wait until granted, the call is cancelled or its gRPC
   * deadline passes; wait_ms must then be 0.
   *
   * @generated from field: bool wait_forever = 4;
   */
  waitForever: boolean;

  /**
   * lock_delay_seconds: the lock-delay of this hold, 0 to 3600 whole
   * seconds (Chubby, Consul): if the hold ends because its lease expired
   * or was revoked (not by Release or Withdraw), the lock's next grant
   * comes no earlier than that end plus this delay, so that writes still
   * in flight from the lost holder land before the next holder starts.
   * A mitigation for storage that cannot check tokens, never a
   * replacement for fencing. Give the same value on every Acquire of a
   * lock. 0: none. The delay is kept in etcd (every replica honours it,
   * across restarts) and runs from when a contender saw the end: at once
   * if one waits, else from the next Acquire. Meanwhile a waiting Acquire
   * waits (within wait_ms) and a try-once Acquire answers acquired = false
   * with holder unset. etcd raises a delay below its minimum lease TTL
   * (about 2 s) to it and expires leases up to about 0.5 s late, so the
   * delay is a lower bound. Errors: INVALID_ARGUMENT (lock_delay_seconds).
   *
   * @generated from field: int64 lock_delay_seconds = 5;
   */
  lockDelaySeconds: bigint;

  /**
   * request_id: see "Retries" (Acquire is idempotent per (lease_id, name)
   * already; the id is checked and logged).
   *
   * @generated from field: string request_id = 6;
   */
  requestId: string;

  /**
   * mode: LOCK_MODE_WRITE (the default: exclusive) or LOCK_MODE_READ
   * (shared by readers, FIFO with writers). Idempotent per (lease_id, name,
   * mode). A read Acquire takes no lock_delay_seconds (INVALID_ARGUMENT,
   * field lock_delay_seconds); an unknown mode is INVALID_ARGUMENT (field
   * mode). There is no upgrade or downgrade: a lease that holds or waits
   * for a name in one mode and asks for it in the other is refused with
   * INVALID_ARGUMENT (field mode), at once when its own key is first, else
   * when its own key is next before the new one; nothing is left queued.
   *
   * @generated from field: fencepost.v1.LockMode mode = 7;
   */
  mode: LockMode;
};

/**
 * Describes the message fencepost.v1.AcquireRequest.
 * Use `create(AcquireRequestSchema)` to create a new message.
 */
export const AcquireRequestSchema: GenMessage<AcquireRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 6);

/**
 * @generated from message fencepost.v1.AcquireResponse
 */
export type AcquireResponse = Message<"fencepost.v1.AcquireResponse"> & {
  /**
   * acquired: true when the lock is now held by the request's lease. Only a
   * try-once Acquire returns false (and then nothing is queued).
   *
   * @generated from field: bool acquired = 1;
   */
  acquired: boolean;

  /**
   * token: the fencing token of this grant (> 0; the etcd create revision of
   * the holder's key plus the token floor) when acquired; valid until
   * Release or the lease's expiry.
   *
   * @generated from field: int64 token = 2;
   */
  token: bigint;

  /**
   * holder: the current holder when acquired = false (try-once only); unset
   * when the lock is free but the lock-delay of a holder that was lost has not
   * passed (see AcquireRequest.lock_delay_seconds).
   *
   * @generated from field: fencepost.v1.Holder holder = 3;
   */
  holder?: Holder | undefined;
};

/**
 * Describes the message fencepost.v1.AcquireResponse.
 * Use `create(AcquireResponseSchema)` to create a new message.
 */
export const AcquireResponseSchema: GenMessage<AcquireResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 7);

/**
 * @generated from message fencepost.v1.ReleaseRequest
 */
export type ReleaseRequest = Message<"fencepost.v1.ReleaseRequest"> & {
  /**
   * name: the lock name given to Acquire.
   *
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * lease_id: the lease that holds the lock.
   *
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * token: the fencing token of the grant being released (> 0).
   *
   * @generated from field: int64 token = 3;
   */
  token: bigint;

  /**
   * request_id: see "Retries": a retry of a Release that succeeded, with
   * the same request_id, answers as the first did.
   *
   * @generated from field: string request_id = 4;
   */
  requestId: string;

  /**
   * mode: the mode given to Acquire (a read hold is released with
   * LOCK_MODE_READ, else NOT_HOLDER).
   *
   * @generated from field: fencepost.v1.LockMode mode = 5;
   */
  mode: LockMode;
};

/**
 * Describes the message fencepost.v1.ReleaseRequest.
 * Use `create(ReleaseRequestSchema)` to create a new message.
 */
export const ReleaseRequestSchema: GenMessage<ReleaseRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 8);

/**
 * @generated from message fencepost.v1.ReleaseResponse
 */
export type ReleaseResponse = Message<"fencepost.v1.ReleaseResponse"> & {
  /**
   * revision: the etcd revision of the release.
   *
   * @generated from field: int64 revision = 1;
   */
  revision: bigint;
};

/**
 * Describes the message fencepost.v1.ReleaseResponse.
 * Use `create(ReleaseResponseSchema)` to create a new message.
 */
export const ReleaseResponseSchema: GenMessage<ReleaseResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 9);

/**
 * @generated from message fencepost.v1.AcquireAllRequest
 */
export type AcquireAllRequest = Message<"fencepost.v1.AcquireAllRequest"> & {
  /**
   * names: the locks to take together, 2 to 32 distinct lock names (each
   * as AcquireRequest.name), in any order.
   *
   * @generated from field: repeated string names = 1;
   */
  names: string[];

  /**
   * lease_id: the lease that will hold every lock (from LeaseGrant, > 0).
   *
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * wait_ms: as AcquireRequest.wait_ms; 0 with wait_forever = false means
   * try once (acquired = false, and no key left, unless every name is free).
   *
   * @generated from field: int64 wait_ms = 3;
   */
  waitMs: bigint;

  /**
   * wait_forever: as AcquireRequest.wait_forever.
   *
   * @generated from field: bool wait_forever = 4;
   */
  waitForever: boolean;

  /**
   * request_id: see "Retries" (AcquireAll is idempotent per (lease_id,
   * names) already; the id is checked and logged).
   *
   * @generated from field: string request_id = 5;
   */
  requestId: string;
};

/**
 * Describes the message fencepost.v1.AcquireAllRequest.
 * Use `create(AcquireAllRequestSchema)` to create a new message.
 */
export const AcquireAllRequestSchema: GenMessage<AcquireAllRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 10);

/**
 * @generated from message fencepost.v1.AcquireAllResponse
 */
export type AcquireAllResponse = Message<"fencepost.v1.AcquireAllResponse"> & {
  /**
   * acquired: true when every lock of `names` is now held by the lease.
   * Only a try-once call returns false (and then no key is left).
   *
   * @generated from field: bool acquired = 1;
   */
  acquired: boolean;

  /**
   * tokens: the fencing token of each name, in the order of
   * AcquireAllRequest.names, when acquired (all equal: the create revision
   * of the keys plus the token floor; each strictly larger than that name's
   * earlier tokens). Valid until ReleaseAll or the lease's expiry.
   *
   * @generated from field: repeated int64 tokens = 2;
   */
  tokens: bigint[];

  /**
   * holder: when acquired = false, the holder of the first name found held
   * (unset when it is free but a lock-delay holds it back).
   *
   * @generated from field: fencepost.v1.Holder holder = 3;
   */
  holder?: Holder | undefined;

  /**
   * held_name: the name `holder` holds, when acquired = false.
   *
   * @generated from field: string held_name = 4;
   */
  heldName: string;
};

/**
 * Describes the message fencepost.v1.AcquireAllResponse.
 * Use `create(AcquireAllResponseSchema)` to create a new message.
 */
export const AcquireAllResponseSchema: GenMessage<AcquireAllResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 11);

/**
 * @generated from message fencepost.v1.ReleaseAllRequest
 */
export type ReleaseAllRequest = Message<"fencepost.v1.ReleaseAllRequest"> & {
  /**
   * names: the names given to AcquireAll (any order).
   *
   * @generated from field: repeated string names = 1;
   */
  names: string[];

  /**
   * lease_id: the lease that holds them.
   *
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * token: the fencing token of the grant (AcquireAllResponse.tokens, all
   * equal); 0 deletes whatever keys the lease has in those locks.
   *
   * @generated from field: int64 token = 3;
   */
  token: bigint;

  /**
   * request_id: see "Retries".
   *
   * @generated from field: string request_id = 4;
   */
  requestId: string;
};

/**
 * Describes the message fencepost.v1.ReleaseAllRequest.
 * Use `create(ReleaseAllRequestSchema)` to create a new message.
 */
export const ReleaseAllRequestSchema: GenMessage<ReleaseAllRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 12);

/**
 * @generated from message fencepost.v1.ReleaseAllResponse
 */
export type ReleaseAllResponse = Message<"fencepost.v1.ReleaseAllResponse"> & {
  /**
   * revision: the etcd revision of the release.
   *
   * @generated from field: int64 revision = 1;
   */
  revision: bigint;

  /**
   * found: with token 0, how many of the names the lease had a key in.
   *
   * @generated from field: int32 found = 2;
   */
  found: number;
};

/**
 * Describes the message fencepost.v1.ReleaseAllResponse.
 * Use `create(ReleaseAllResponseSchema)` to create a new message.
 */
export const ReleaseAllResponseSchema: GenMessage<ReleaseAllResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 13);

/**
 * @generated from message fencepost.v1.WithdrawRequest
 */
export type WithdrawRequest = Message<"fencepost.v1.WithdrawRequest"> & {
  /**
   * name: the lock name given to Acquire.
   *
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * lease_id: the lease that asked for the lock.
   *
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * request_id: see "Retries" (Withdraw is idempotent already).
   *
   * @generated from field: string request_id = 3;
   */
  requestId: string;

  /**
   * mode: the mode given to the Acquire being withdrawn.
   *
   * @generated from field: fencepost.v1.LockMode mode = 4;
   */
  mode: LockMode;
};

/**
 * Describes the message fencepost.v1.WithdrawRequest.
 * Use `create(WithdrawRequestSchema)` to create a new message.
 */
export const WithdrawRequestSchema: GenMessage<WithdrawRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 14);

/**
 * @generated from message fencepost.v1.WithdrawResponse
 */
export type WithdrawResponse = Message<"fencepost.v1.WithdrawResponse"> & {
  /**
   * found: whether the lease had a key in the lock (now deleted).
   *
   * @generated from field: bool found = 1;
   */
  found: boolean;

  /**
   * held: whether that key was the holder's (the lock passed to the next waiter).
   *
   * @generated from field: bool held = 2;
   */
  held: boolean;

  /**
   * revision: the etcd revision of the deletion, or of the read that found no key.
   *
   * @generated from field: int64 revision = 3;
   */
  revision: bigint;
};

/**
 * Describes the message fencepost.v1.WithdrawResponse.
 * Use `create(WithdrawResponseSchema)` to create a new message.
 */
export const WithdrawResponseSchema: GenMessage<WithdrawResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 15);

/**
 * Holder describes the current holder of a lock.
 *
 * @generated from message fencepost.v1.Holder
 */
export type Holder = Message<"fencepost.v1.Holder"> & {
  /**
   * lease_id: the holder's lease id.
   *
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;

  /**
   * token: the holder's fencing token.
   *
   * @generated from field: int64 token = 2;
   */
  token: bigint;

  /**
   * read: this contender is a reader of a read-write lock (Acquire with
   * LOCK_MODE_READ); false for a writer or a plain lock's contender.
   *
   * @generated from field: bool read = 3;
   */
  read: boolean;
};

/**
 * Describes the message fencepost.v1.Holder.
 * Use `create(HolderSchema)` to create a new message.
 */
export const HolderSchema: GenMessage<Holder> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 16);

/**
 * @generated from message fencepost.v1.KeepAliveRequest
 */
export type KeepAliveRequest = Message<"fencepost.v1.KeepAliveRequest"> & {
  /**
   * @generated from oneof fencepost.v1.KeepAliveRequest.request
   */
  request: {
    /**
     * keepalive: renew one lease (`keepalives`: several in one message).
     *
     * @generated from field: fencepost.v1.LeaseKeepAlive keepalive = 1;
     */
    value: LeaseKeepAlive;
    case: "keepalive";
  } | {
    /**
     * watch: be told (HoldEnded) when a hold ends. Send once after each
     * grant, and again after reconnecting. If the hold already ended, the
     * HoldEnded event is sent at once.
     *
     * @generated from field: fencepost.v1.WatchHold watch = 2;
     */
    value: WatchHold;
    case: "watch";
  } | {
    /**
     * unwatch: stop reporting on a hold (for example after Release).
     *
     * @generated from field: fencepost.v1.WatchHold unwatch = 3;
     */
    value: WatchHold;
    case: "unwatch";
  } | {
    /**
     * acquire: an Acquire call on the stream (see KeepAlive).
     *
     * @generated from field: fencepost.v1.AcquireRequest acquire = 5;
     */
    value: AcquireRequest;
    case: "acquire";
  } | {
    /**
     * release: a Release call on the stream.
     *
     * @generated from field: fencepost.v1.ReleaseRequest release = 6;
     */
    value: ReleaseRequest;
    case: "release";
  } | {
    /**
     * withdraw: a Withdraw call on the stream.
     *
     * @generated from field: fencepost.v1.WithdrawRequest withdraw = 7;
     */
    value: WithdrawRequest;
    case: "withdraw";
  } | {
    /**
     * cancel: abandon the acquire sent with this request_id, still waiting.
     * Unanswered; the acquire is answered `failed` (CANCELLED) unless its
     * answer was already sent.
     *
     * @generated from field: fencepost.v1.CancelCall cancel = 8;
     */
    value: CancelCall;
    case: "cancel";
  } | {
    /**
     * keepalives: renew several leases in one message, each entry as a
     * `keepalive` of its own (see KeepAlive, "Batched keepalives"). Send it
     * only to a coordinator that lists `keepalives` in
     * `fencepost-stream-calls`: an older one ignores the message and renews
     * nothing. More than 500 entries end the stream with INVALID_ARGUMENT
     * (field `keepalives`), as a message that does not decode does; an
     * empty batch is answered with nothing.
     *
     * @generated from field: fencepost.v1.LeaseKeepAlives keepalives = 12;
     */
    value: LeaseKeepAlives;
    case: "keepalives";
  } | {
    /**
     * calls: several calls in one message, each entry as the single call
     * message it carries would be (see KeepAlive, "Batched calls"); the
     * fields below (lease_secret, request_id, timeout_ms, traceparent) are
     * ignored: each entry carries its own. Send it only to a coordinator
     * that lists `calls` in `fencepost-stream-calls`: an older one ignores
     * the message and answers nothing. More than 500 entries end the stream
     * with INVALID_ARGUMENT (field `calls`), as a message that does not
     * decode does; an empty batch is answered with nothing.
     *
     * @generated from field: fencepost.v1.StreamCalls calls = 15;
     */
    value: StreamCalls;
    case: "calls";
  } | { case: undefined; value?: undefined };

  /**
   * lease_secret: the secret (LeaseGrantResponse.lease_secret) of the lease
   * named by this keepalive or watch. Needed on the first message naming
   * that lease on a stream (the stream remembers the leases it verified);
   * may be sent on every one. Not needed when the caller's certificate
   * identity owns the lease. Ignored on unwatch. For `keepalives`: the
   * secret of each entry that carries none of its own
   * (LeaseKeepAlive.lease_secret).
   * For acquire, release and withdraw: the secret of the lease they name,
   * as the `fencepost-lease-secret` metadata entry is for the unary call.
   *
   * @generated from field: string lease_secret = 4;
   */
  leaseSecret: string;

  /**
   * request_id: for acquire, release and withdraw: chosen by the caller,
   * unique among its calls running on this stream, echoed in the answer.
   *
   * @generated from field: uint64 request_id = 9;
   */
  requestId: bigint;

  /**
   * timeout_ms: for acquire, release and withdraw: how long the caller
   * waits for the answer, in milliseconds, as a unary call's deadline (the
   * coordinator ends its etcd work for the call a little before it); 0: no
   * bound. An acquire with wait_forever waits until granted or cancelled.
   *
   * @generated from field: int64 timeout_ms = 10;
   */
  timeoutMs: bigint;

  /**
   * traceparent: for acquire, release and withdraw: the caller's W3C trace
   * context (https://www.w3.org/TR/trace-context/), as the `traceparent`
   * metadata entry of a unary call; "" for none.
   *
   * @generated from field: string traceparent = 11;
   */
  traceparent: string;

  /**
   * last_rtt_ms: for keepalive and keepalives: the round trip, in whole
   * milliseconds (at least 1), the caller measured for the last keepalive
   * acknowledged on this stream (from sending it to its ack); 0 when it
   * has none yet on this stream, or does not measure. The coordinator
   * takes the median of what its clients report as one sign that it is
   * past its capacity (ErrorReason OVERLOADED). Ignored on other messages.
   *
   * @generated from field: uint32 last_rtt_ms = 13;
   */
  lastRttMs: number;

  /**
   * sent_ms: for keepalive and keepalives: the caller's steady clock when
   * it sent this message, in whole milliseconds from any origin that stays
   * fixed for the stream (a monotonic clock; clocks of different hosts need
   * not agree); 0: not given. The coordinator subtracts it from its own
   * clock when it reads the message; the excess over the least such
   * difference seen on the stream is how long the message waited to be
   * read (in the network, in gRPC's buffers): its other sign of capacity.
   * Ignored on other messages.
   *
   * @generated from field: uint64 sent_ms = 14;
   */
  sentMs: bigint;
};

/**
 * Describes the message fencepost.v1.KeepAliveRequest.
 * Use `create(KeepAliveRequestSchema)` to create a new message.
 */
export const KeepAliveRequestSchema: GenMessage<KeepAliveRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 17);

/**
 * @generated from message fencepost.v1.CancelCall
 */
export type CancelCall = Message<"fencepost.v1.CancelCall"> & {
  /**
   * request_id: the request_id of the acquire to abandon.
   *
   * @generated from field: uint64 request_id = 1;
   */
  requestId: bigint;
};

/**
 * Describes the message fencepost.v1.CancelCall.
 * Use `create(CancelCallSchema)` to create a new message.
 */
export const CancelCallSchema: GenMessage<CancelCall> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 18);

/**
 * @generated from message fencepost.v1.StreamCall
 */
export type StreamCall = Message<"fencepost.v1.StreamCall"> & {
  /**
   * @generated from oneof fencepost.v1.StreamCall.call
   */
  call: {
    /**
     * acquire, release, withdraw: the call, as KeepAliveRequest.acquire/
     * .release/.withdraw; answered by a StreamAnswer (or a single
     * KeepAliveResponse) with this entry's request_id.
     *
     * @generated from field: fencepost.v1.AcquireRequest acquire = 1;
     */
    value: AcquireRequest;
    case: "acquire";
  } | {
    /**
     * @generated from field: fencepost.v1.ReleaseRequest release = 2;
     */
    value: ReleaseRequest;
    case: "release";
  } | {
    /**
     * @generated from field: fencepost.v1.WithdrawRequest withdraw = 3;
     */
    value: WithdrawRequest;
    case: "withdraw";
  } | {
    /**
     * cancel: abandon the acquire sent with cancel.request_id, still
     * waiting, as KeepAliveRequest.cancel (unanswered; the entry's own
     * request_id is ignored). It may follow that acquire in the same batch.
     *
     * @generated from field: fencepost.v1.CancelCall cancel = 4;
     */
    value: CancelCall;
    case: "cancel";
  } | { case: undefined; value?: undefined };

  /**
   * request_id, timeout_ms, traceparent, lease_secret: this call's, as
   * KeepAliveRequest's fields of the same names are for a single call.
   * An entry with no call is answered `failed` (INVALID_ARGUMENT, field
   * `call`).
   *
   * @generated from field: uint64 request_id = 5;
   */
  requestId: bigint;

  /**
   * @generated from field: int64 timeout_ms = 6;
   */
  timeoutMs: bigint;

  /**
   * @generated from field: string traceparent = 7;
   */
  traceparent: string;

  /**
   * @generated from field: string lease_secret = 8;
   */
  leaseSecret: string;
};

/**
 * Describes the message fencepost.v1.StreamCall.
 * Use `create(StreamCallSchema)` to create a new message.
 */
export const StreamCallSchema: GenMessage<StreamCall> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 19);

/**
 * @generated from message fencepost.v1.StreamCalls
 */
export type StreamCalls = Message<"fencepost.v1.StreamCalls"> & {
  /**
   * calls: the calls, at most 500 entries, served in this order (each
   * started as if sent alone; their answers come in any order). Each
   * request_id must be unique among the calls running on the stream, as
   * for single calls.
   *
   * @generated from field: repeated fencepost.v1.StreamCall calls = 1;
   */
  calls: StreamCall[];
};

/**
 * Describes the message fencepost.v1.StreamCalls.
 * Use `create(StreamCallsSchema)` to create a new message.
 */
export const StreamCallsSchema: GenMessage<StreamCalls> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 20);

/**
 * @generated from message fencepost.v1.StreamAnswer
 */
export type StreamAnswer = Message<"fencepost.v1.StreamAnswer"> & {
  /**
   * @generated from oneof fencepost.v1.StreamAnswer.response
   */
  response: {
    /**
     * acquired, released, withdrawn, failed: as the KeepAliveResponse
     * fields of the same names.
     *
     * @generated from field: fencepost.v1.AcquireResponse acquired = 1;
     */
    value: AcquireResponse;
    case: "acquired";
  } | {
    /**
     * @generated from field: fencepost.v1.ReleaseResponse released = 2;
     */
    value: ReleaseResponse;
    case: "released";
  } | {
    /**
     * @generated from field: fencepost.v1.WithdrawResponse withdrawn = 3;
     */
    value: WithdrawResponse;
    case: "withdrawn";
  } | {
    /**
     * @generated from field: fencepost.v1.CallFailed failed = 4;
     */
    value: CallFailed;
    case: "failed";
  } | { case: undefined; value?: undefined };

  /**
   * request_id: the request_id of the call answered.
   *
   * @generated from field: uint64 request_id = 5;
   */
  requestId: bigint;
};

/**
 * Describes the message fencepost.v1.StreamAnswer.
 * Use `create(StreamAnswerSchema)` to create a new message.
 */
export const StreamAnswerSchema: GenMessage<StreamAnswer> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 21);

/**
 * @generated from message fencepost.v1.StreamAnswers
 */
export type StreamAnswers = Message<"fencepost.v1.StreamAnswers"> & {
  /**
   * answers: two or more answers, in the order they became ready.
   *
   * @generated from field: repeated fencepost.v1.StreamAnswer answers = 1;
   */
  answers: StreamAnswer[];
};

/**
 * Describes the message fencepost.v1.StreamAnswers.
 * Use `create(StreamAnswersSchema)` to create a new message.
 */
export const StreamAnswersSchema: GenMessage<StreamAnswers> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 22);

/**
 * @generated from message fencepost.v1.LeaseKeepAlive
 */
export type LeaseKeepAlive = Message<"fencepost.v1.LeaseKeepAlive"> & {
  /**
   * lease_id: the lease to renew.
   *
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;

  /**
   * request_id: chosen by the caller and echoed in the answer, so that the
   * caller can match an answer to the time it sent the keepalive.
   *
   * @generated from field: uint64 request_id = 2;
   */
  requestId: bigint;

  /**
   * lease_secret: the secret of this entry's lease, inside a batch
   * (LeaseKeepAlives), as KeepAliveRequest.lease_secret is for a single
   * keepalive; "" falls back to KeepAliveRequest.lease_secret. A single
   * keepalive may carry it here or there.
   *
   * @generated from field: string lease_secret = 3;
   */
  leaseSecret: string;
};

/**
 * Describes the message fencepost.v1.LeaseKeepAlive.
 * Use `create(LeaseKeepAliveSchema)` to create a new message.
 */
export const LeaseKeepAliveSchema: GenMessage<LeaseKeepAlive> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 23);

/**
 * @generated from message fencepost.v1.LeaseKeepAlives
 */
export type LeaseKeepAlives = Message<"fencepost.v1.LeaseKeepAlives"> & {
  /**
   * keepalives: the leases to renew, at most 500 entries, each with its
   * own request_id (echoed in its own ack). Each entry is a keepalive of
   * its own: a lease the caller does not own ends the stream with
   * PERMISSION_DENIED/NOT_LEASE_OWNER as a single keepalive does, and a
   * lease that is gone is answered with ttl_seconds <= 0. A lease may
   * appear more than once: each entry is answered.
   *
   * @generated from field: repeated fencepost.v1.LeaseKeepAlive keepalives = 1;
   */
  keepalives: LeaseKeepAlive[];
};

/**
 * Describes the message fencepost.v1.LeaseKeepAlives.
 * Use `create(LeaseKeepAlivesSchema)` to create a new message.
 */
export const LeaseKeepAlivesSchema: GenMessage<LeaseKeepAlives> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 24);

/**
 * @generated from message fencepost.v1.WatchHold
 */
export type WatchHold = Message<"fencepost.v1.WatchHold"> & {
  /**
   * name: the lock name (the election's or semaphore's for those kinds).
   *
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * lease_id: the holder's lease.
   *
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * token: the fencing token of the grant.
   *
   * @generated from field: int64 token = 3;
   */
  token: bigint;

  /**
   * kind: what the hold is a grant of (a lock by default).
   *
   * @generated from field: fencepost.v1.HoldKind kind = 4;
   */
  kind: HoldKind;

  /**
   * slot: HOLD_KIND_SEMAPHORE: the permit's slot; 0 otherwise.
   *
   * @generated from field: int32 slot = 5;
   */
  slot: number;
};

/**
 * Describes the message fencepost.v1.WatchHold.
 * Use `create(WatchHoldSchema)` to create a new message.
 */
export const WatchHoldSchema: GenMessage<WatchHold> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 25);

/**
 * @generated from message fencepost.v1.KeepAliveResponse
 */
export type KeepAliveResponse = Message<"fencepost.v1.KeepAliveResponse"> & {
  /**
   * @generated from oneof fencepost.v1.KeepAliveResponse.response
   */
  response: {
    /**
     * keepalive: the answer to one LeaseKeepAlive, alone or of a batch
     * (several ready together on a stream that sent a batch: `keepalives`).
     *
     * @generated from field: fencepost.v1.LeaseKeepAliveAck keepalive = 1;
     */
    value: LeaseKeepAliveAck;
    case: "keepalive";
  } | {
    /**
     * hold_ended: a watched hold ended.
     *
     * @generated from field: fencepost.v1.HoldEnded hold_ended = 2;
     */
    value: HoldEnded;
    case: "holdEnded";
  } | {
    /**
     * acquired: the answer to an acquire sent on the stream.
     *
     * @generated from field: fencepost.v1.AcquireResponse acquired = 3;
     */
    value: AcquireResponse;
    case: "acquired";
  } | {
    /**
     * released: the answer to a release sent on the stream.
     *
     * @generated from field: fencepost.v1.ReleaseResponse released = 4;
     */
    value: ReleaseResponse;
    case: "released";
  } | {
    /**
     * withdrawn: the answer to a withdraw sent on the stream.
     *
     * @generated from field: fencepost.v1.WithdrawResponse withdrawn = 5;
     */
    value: WithdrawResponse;
    case: "withdrawn";
  } | {
    /**
     * failed: a call sent on the stream failed, with the status its unary
     * twin would have ended with.
     *
     * @generated from field: fencepost.v1.CallFailed failed = 6;
     */
    value: CallFailed;
    case: "failed";
  } | {
    /**
     * keepalives: the acks of several keepalives that were ready to be sent
     * at the same time, each the LeaseKeepAliveAck it would have been
     * alone. Only on a stream that has sent at least one batch
     * (KeepAliveRequest.keepalives); match each ack by its request_id.
     *
     * @generated from field: fencepost.v1.LeaseKeepAliveAcks keepalives = 8;
     */
    value: LeaseKeepAliveAcks;
    case: "keepalives";
  } | {
    /**
     * answers: the answers of several calls that were ready to be sent at
     * the same time, each what its KeepAliveResponse would have said alone.
     * Only on a stream that has sent at least one `calls` message (see
     * KeepAlive, "Batched calls"); match each answer by its request_id.
     *
     * @generated from field: fencepost.v1.StreamAnswers answers = 9;
     */
    value: StreamAnswers;
    case: "answers";
  } | { case: undefined; value?: undefined };

  /**
   * request_id: for acquired, released, withdrawn and failed: the
   * KeepAliveRequest.request_id of the call answered.
   *
   * @generated from field: uint64 request_id = 7;
   */
  requestId: bigint;
};

/**
 * Describes the message fencepost.v1.KeepAliveResponse.
 * Use `create(KeepAliveResponseSchema)` to create a new message.
 */
export const KeepAliveResponseSchema: GenMessage<KeepAliveResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 26);

/**
 * @generated from message fencepost.v1.CallFailed
 */
export type CallFailed = Message<"fencepost.v1.CallFailed"> & {
  /**
   * code: the gRPC status code (google.rpc.Code), never OK.
   *
   * @generated from field: int32 code = 1;
   */
  code: number;

  /**
   * message: the status message.
   *
   * @generated from field: string message = 2;
   */
  message: string;

  /**
   * status: a serialized google.rpc.Status with the ErrorInfo (and, for
   * UNAVAILABLE or a rate limit, RetryInfo) details: the same bytes a unary
   * call carries in its `grpc-status-details-bin` trailer.
   *
   * @generated from field: bytes status = 3;
   */
  status: Uint8Array;
};

/**
 * Describes the message fencepost.v1.CallFailed.
 * Use `create(CallFailedSchema)` to create a new message.
 */
export const CallFailedSchema: GenMessage<CallFailed> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 27);

/**
 * @generated from message fencepost.v1.LeaseKeepAliveAck
 */
export type LeaseKeepAliveAck = Message<"fencepost.v1.LeaseKeepAliveAck"> & {
  /**
   * lease_id: the lease renewed.
   *
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;

  /**
   * request_id: the LeaseKeepAlive.request_id this answers.
   *
   * @generated from field: uint64 request_id = 2;
   */
  requestId: bigint;

  /**
   * ttl_seconds: the TTL etcd reset the lease to, in seconds. <= 0 means the
   * lease is gone (expired or revoked): every hold under it is lost.
   *
   * @generated from field: int64 ttl_seconds = 3;
   */
  ttlSeconds: bigint;
};

/**
 * Describes the message fencepost.v1.LeaseKeepAliveAck.
 * Use `create(LeaseKeepAliveAckSchema)` to create a new message.
 */
export const LeaseKeepAliveAckSchema: GenMessage<LeaseKeepAliveAck> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 28);

/**
 * @generated from message fencepost.v1.LeaseKeepAliveAcks
 */
export type LeaseKeepAliveAcks = Message<"fencepost.v1.LeaseKeepAliveAcks"> & {
  /**
   * acks: two or more acks, in the order they became ready.
   *
   * @generated from field: repeated fencepost.v1.LeaseKeepAliveAck acks = 1;
   */
  acks: LeaseKeepAliveAck[];
};

/**
 * Describes the message fencepost.v1.LeaseKeepAliveAcks.
 * Use `create(LeaseKeepAliveAcksSchema)` to create a new message.
 */
export const LeaseKeepAliveAcksSchema: GenMessage<LeaseKeepAliveAcks> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 29);

/**
 * @generated from message fencepost.v1.HoldEnded
 */
export type HoldEnded = Message<"fencepost.v1.HoldEnded"> & {
  /**
   * name: the lock name.
   *
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * lease_id: the holder's lease.
   *
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * token: the fencing token of the hold that ended.
   *
   * @generated from field: int64 token = 3;
   */
  token: bigint;

  /**
   * reason: why: LEASE_EXPIRED (the lease is gone) or NOT_HOLDER (the
   * holder's key was deleted: released, revoked or deleted by an operator).
   *
   * @generated from field: fencepost.v1.ErrorReason reason = 5;
   */
  reason: ErrorReason;

  /**
   * kind, slot: as in the WatchHold that asked.
   *
   * @generated from field: fencepost.v1.HoldKind kind = 6;
   */
  kind: HoldKind;

  /**
   * @generated from field: int32 slot = 7;
   */
  slot: number;
};

/**
 * Describes the message fencepost.v1.HoldEnded.
 * Use `create(HoldEndedSchema)` to create a new message.
 */
export const HoldEndedSchema: GenMessage<HoldEnded> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 30);

/**
 * @generated from message fencepost.v1.DescribeRequest
 */
export type DescribeRequest = Message<"fencepost.v1.DescribeRequest"> & {
  /**
   * name: the lock name.
   *
   * @generated from field: string name = 1;
   */
  name: string;
};

/**
 * Describes the message fencepost.v1.DescribeRequest.
 * Use `create(DescribeRequestSchema)` to create a new message.
 */
export const DescribeRequestSchema: GenMessage<DescribeRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 31);

/**
 * @generated from message fencepost.v1.DescribeResponse
 */
export type DescribeResponse = Message<"fencepost.v1.DescribeResponse"> & {
  /**
   * held: whether anyone holds the lock.
   *
   * @generated from field: bool held = 1;
   */
  held: boolean;

  /**
   * holder: the current holder, when held.
   *
   * @generated from field: fencepost.v1.Holder holder = 2;
   */
  holder?: Holder | undefined;

  /**
   * ttl_remaining_seconds: seconds left on the holder's lease as etcd
   * reports it, -1 when not held. A lower bound only: etcd resets TTLs on
   * leader change.
   *
   * @generated from field: int64 ttl_remaining_seconds = 3;
   */
  ttlRemainingSeconds: bigint;

  /**
   * ttl_seconds: the holder lease's granted TTL in seconds, 0 when not held.
   *
   * @generated from field: int64 ttl_seconds = 4;
   */
  ttlSeconds: bigint;

  /**
   * waiter_count: how many contenders are queued behind the holders.
   *
   * @generated from field: int64 waiter_count = 5;
   */
  waiterCount: bigint;

  /**
   * waiters: the first (up to 100) queued contenders, in grant order; their
   * token fields hold the token each will be granted with (the revision of
   * its place in the queue plus the token floor).
   *
   * @generated from field: repeated fencepost.v1.Holder waiters = 6;
   */
  waiters: Holder[];

  /**
   * revision: the etcd revision of this snapshot.
   *
   * @generated from field: int64 revision = 7;
   */
  revision: bigint;

  /**
   * lock_delay_remaining_ms: when a lock-delay holds the lock back, the
   * milliseconds left on it as etcd reports its lease (a lower bound: etcd
   * may expire it up to about 0.5 s later); -1 when a hold ended uncleanly
   * and its delay (lock_delay_seconds) starts at the next Acquire; 0: none.
   *
   * @generated from field: int64 lock_delay_remaining_ms = 8;
   */
  lockDelayRemainingMs: bigint;

  /**
   * lock_delay_seconds: the lock-delay running or pending, in seconds; 0: none.
   *
   * @generated from field: int64 lock_delay_seconds = 9;
   */
  lockDelaySeconds: bigint;

  /**
   * holders: every contender holding the lock, in grant order, `holder`
   * first: the holder alone for a writer or a plain lock's holder; for a
   * read-write lock held by readers, each reader before its first writer
   * (docs/rwlocks.md), among the first 101 contenders. Empty when not held.
   * (A coordinator that predates this field leaves it empty.)
   *
   * @generated from field: repeated fencepost.v1.Holder holders = 10;
   */
  holders: Holder[];
};

/**
 * Describes the message fencepost.v1.DescribeResponse.
 * Use `create(DescribeResponseSchema)` to create a new message.
 */
export const DescribeResponseSchema: GenMessage<DescribeResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 32);

/**
 * @generated from message fencepost.v1.ListLocksRequest
 */
export type ListLocksRequest = Message<"fencepost.v1.ListLocksRequest"> & {
  /**
   * prefix: list only the locks whose names start with this string (UTF-8,
   * 0 to 256 bytes, no character of the categories Cc, Cf, Zl, Zp); empty lists every lock.
   *
   * @generated from field: string prefix = 1;
   */
  prefix: string;

  /**
   * page_size: most locks in one response, 0 to 1000; 0 means 100.
   *
   * @generated from field: int32 page_size = 2;
   */
  pageSize: number;

  /**
   * page_token: the next_page_token of the previous response of this
   * listing, with the same prefix; empty for the first page.
   *
   * @generated from field: string page_token = 3;
   */
  pageToken: string;
};

/**
 * Describes the message fencepost.v1.ListLocksRequest.
 * Use `create(ListLocksRequestSchema)` to create a new message.
 */
export const ListLocksRequestSchema: GenMessage<ListLocksRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 33);

/**
 * LockInfo is one lock in a ListLocks page: held, or held back by a
 * lock-delay (holder unset).
 *
 * @generated from message fencepost.v1.LockInfo
 */
export type LockInfo = Message<"fencepost.v1.LockInfo"> & {
  /**
   * name: the lock name.
   *
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * holder: the holder's lease id and fencing token; unset while a
   * lock-delay holds the lock back (lock_delay_seconds > 0).
   *
   * @generated from field: fencepost.v1.Holder holder = 2;
   */
  holder?: Holder | undefined;

  /**
   * ttl_remaining_seconds: seconds left on the holder's lease as etcd
   * reports it when the page is served; -1 when the lease ended since the
   * page's revision, or there is no holder. A lower bound only: etcd resets
   * TTLs on leader change.
   *
   * @generated from field: int64 ttl_remaining_seconds = 3;
   */
  ttlRemainingSeconds: bigint;

  /**
   * ttl_seconds: the holder lease's granted TTL in seconds; 0 when the lease
   * ended since the page's revision, or there is no holder.
   *
   * @generated from field: int64 ttl_seconds = 4;
   */
  ttlSeconds: bigint;

  /**
   * held_seconds: seconds since the grant, measured on the monotonic clock
   * of the coordinator that granted it; -1 when the serving coordinator did
   * not make the grant (another replica did, or it restarted since): etcd
   * keeps no time of grants.
   *
   * @generated from field: double held_seconds = 5;
   */
  heldSeconds: number;

  /**
   * waiter_count: how many contenders are queued behind the holders (every
   * contender while a lock-delay holds the lock back).
   *
   * @generated from field: int64 waiter_count = 6;
   */
  waiterCount: bigint;

  /**
   * lock_delay_remaining_ms: while a lock-delay holds the lock back (holder
   * unset), the milliseconds left on it as etcd reports them when the page
   * is served (whole seconds, at least 1000; AdminEndLockDelay ends it); -1
   * when it starts at the next Acquire (its holder was lost, nobody asked
   * since); 0 when it ended since the page's revision, and for a held lock.
   *
   * @generated from field: int64 lock_delay_remaining_ms = 7;
   */
  lockDelayRemainingMs: bigint;

  /**
   * lock_delay_seconds: the lock-delay holding the lock back, in seconds; 0
   * for a held lock.
   *
   * @generated from field: int64 lock_delay_seconds = 8;
   */
  lockDelaySeconds: bigint;

  /**
   * holder_count: how many contenders hold the lock together: 1 (the
   * holder), or for a read-write lock held by readers, the readers before
   * its first writer (holder is the first of them); 0 while a lock-delay
   * holds it back.
   *
   * @generated from field: int64 holder_count = 9;
   */
  holderCount: bigint;
};

/**
 * Describes the message fencepost.v1.LockInfo.
 * Use `create(LockInfoSchema)` to create a new message.
 */
export const LockInfoSchema: GenMessage<LockInfo> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 34);

/**
 * @generated from message fencepost.v1.ListLocksResponse
 */
export type ListLocksResponse = Message<"fencepost.v1.ListLocksResponse"> & {
  /**
   * locks: the locks of this page (at most page_size): the held ones and
   * those held back with contenders in key order, then those held back
   * without any.
   *
   * @generated from field: repeated fencepost.v1.LockInfo locks = 1;
   */
  locks: LockInfo[];

  /**
   * next_page_token: pass it as page_token for the next page; empty on the
   * last page. Opaque; valid until etcd compacts `revision`.
   *
   * @generated from field: string next_page_token = 2;
   */
  nextPageToken: string;

  /**
   * revision: the etcd revision every page of this listing is read at.
   *
   * @generated from field: int64 revision = 3;
   */
  revision: bigint;
};

/**
 * Describes the message fencepost.v1.ListLocksResponse.
 * Use `create(ListLocksResponseSchema)` to create a new message.
 */
export const ListLocksResponseSchema: GenMessage<ListLocksResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 35);

/**
 * @generated from message fencepost.v1.ServerInfoRequest
 */
export type ServerInfoRequest = Message<"fencepost.v1.ServerInfoRequest"> & {
};

/**
 * Describes the message fencepost.v1.ServerInfoRequest.
 * Use `create(ServerInfoRequestSchema)` to create a new message.
 */
export const ServerInfoRequestSchema: GenMessage<ServerInfoRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 36);

/**
 * EtcdInfo is the etcd a coordinator uses, as that coordinator sees it.
 *
 * @generated from message fencepost.v1.EtcdInfo
 */
export type EtcdInfo = Message<"fencepost.v1.EtcdInfo"> & {
  /**
   * endpoints: the etcd endpoints as the coordinator was configured with
   * them (`--etcd-endpoints`), without any user:password part. Never holds
   * credentials.
   *
   * @generated from field: repeated string endpoints = 1;
   */
  endpoints: string[];

  /**
   * embedded: whether the coordinator runs its own etcd (`fencepost serve`
   * without --etcd-endpoints).
   *
   * @generated from field: bool embedded = 2;
   */
  embedded: boolean;

  /**
   * available: whether etcd answered this call's linearizable read. When
   * false, every field below but `error` is zero or empty.
   *
   * @generated from field: bool available = 3;
   */
  available: boolean;

  /**
   * error: why etcd did not answer (or why the Status call below failed
   * while the read worked); empty when both answered.
   *
   * @generated from field: string error = 4;
   */
  error: string;

  /**
   * server_version: the etcd server version of the member that answered
   * (etcd's Maintenance.Status), e.g. "3.5.1"; empty when Status failed.
   *
   * @generated from field: string server_version = 5;
   */
  serverVersion: string;

  /**
   * cluster_id: the etcd cluster id.
   *
   * @generated from field: uint64 cluster_id = 6;
   */
  clusterId: bigint;

  /**
   * member_id: the id of the etcd member that answered.
   *
   * @generated from field: uint64 member_id = 7;
   */
  memberId: bigint;

  /**
   * revision: the etcd revision when the read was served. It grows with
   * every write to etcd (of any key, under any prefix).
   *
   * @generated from field: int64 revision = 8;
   */
  revision: bigint;

  /**
   * raft_term: the raft term the answering member is in.
   *
   * @generated from field: uint64 raft_term = 9;
   */
  raftTerm: bigint;

  /**
   * leader: the member id of the raft leader as the answering member sees
   * it; 0 when it has none, or Status failed.
   *
   * @generated from field: uint64 leader = 10;
   */
  leader: bigint;

  /**
   * raft_index: the answering member's raft log index; 0 when Status failed.
   *
   * @generated from field: uint64 raft_index = 11;
   */
  raftIndex: bigint;

  /**
   * db_size_bytes: the size of the answering member's database file, in
   * bytes; 0 when Status failed.
   *
   * @generated from field: int64 db_size_bytes = 12;
   */
  dbSizeBytes: bigint;
};

/**
 * Describes the message fencepost.v1.EtcdInfo.
 * Use `create(EtcdInfoSchema)` to create a new message.
 */
export const EtcdInfoSchema: GenMessage<EtcdInfo> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 37);

/**
 * @generated from message fencepost.v1.ServerInfoResponse
 */
export type ServerInfoResponse = Message<"fencepost.v1.ServerInfoResponse"> & {
  /**
   * version: the coordinator's version (the fencepost package version).
   *
   * @generated from field: string version = 1;
   */
  version: string;

  /**
   * instance_id: random hex chosen when this coordinator was made, new at
   * each process start: tells replicas behind one address apart, and shows
   * a restart.
   *
   * @generated from field: string instance_id = 2;
   */
  instanceId: string;

  /**
   * uptime_seconds: seconds since this coordinator started serving
   * (monotonic clock).
   *
   * @generated from field: double uptime_seconds = 3;
   */
  uptimeSeconds: number;

  /**
   * listen_address: where it serves LockService: HOST:PORT (the bound
   * port) or unix:/ABSOLUTE/PATH, as it bound it (a wildcard host stays
   * a wildcard).
   *
   * @generated from field: string listen_address = 4;
   */
  listenAddress: string;

  /**
   * health_address: its plaintext health-only listener
   * (`--health-listen`), same forms; empty when it has none.
   *
   * @generated from field: string health_address = 5;
   */
  healthAddress: string;

  /**
   * metrics_address: HOST:PORT of its Prometheus /metrics endpoint
   * (HTTP); empty when it has none.
   *
   * @generated from field: string metrics_address = 6;
   */
  metricsAddress: string;

  /**
   * http_address: where it serves the HTTP/JSON API and the lock board
   * (`--http-listen`): HOST:PORT (the bound port) or unix:/ABSOLUTE/PATH,
   * as it bound it; empty when it has none.
   *
   * @generated from field: string http_address = 17;
   */
  httpAddress: string;

  /**
   * key_prefix: the etcd key prefix of its locks.
   *
   * @generated from field: string key_prefix = 7;
   */
  keyPrefix: string;

  /**
   * serving: its readiness: true when grpc.health.v1 answers SERVING for
   * "" and fencepost.v1.LockService (etcd answered its last health read),
   * false for NOT_SERVING (etcd out of reach, or shutting down).
   *
   * @generated from field: bool serving = 8;
   */
  serving: boolean;

  /**
   * etcd: the etcd it uses.
   *
   * @generated from field: fencepost.v1.EtcdInfo etcd = 9;
   */
  etcd?: EtcdInfo | undefined;

  /**
   * keepalive_streams: this coordinator: KeepAlive streams open.
   *
   * @generated from field: int64 keepalive_streams = 10;
   */
  keepaliveStreams: bigint;

  /**
   * keepalive_leases: this coordinator: leases that have received
   * keepalives on the open KeepAlive streams (counted once per stream,
   * including leases that have ended since).
   *
   * @generated from field: int64 keepalive_leases = 11;
   */
  keepaliveLeases: bigint;

  /**
   * watched_holds: this coordinator: holds the open KeepAlive streams
   * watch for their end (the client library watches each hold it is
   * granted).
   *
   * @generated from field: int64 watched_holds = 12;
   */
  watchedHolds: bigint;

  /**
   * waiting_acquires: this coordinator: Acquire calls with a wait
   * (wait_ms > 0 or wait_forever) in progress; the Campaign and
   * AcquirePermit calls that wait count too (they wait as Acquire does).
   *
   * @generated from field: int64 waiting_acquires = 13;
   */
  waitingAcquires: bigint;

  /**
   * contender_keys: cluster-wide: the lock keys under the prefix, one per
   * holder and one per waiter, of locks only (not of elections'
   * candidates nor semaphores' holders and waiters, nor held_locks and
   * waiters below); -1 when etcd did not answer.
   *
   * @generated from field: int64 contender_keys = 14;
   */
  contenderKeys: bigint;

  /**
   * held_locks: cluster-wide: the locks that are held (each by one
   * holder, or by the readers before its first writer: a read-write
   * lock); -1 when etcd did not answer or when there are more than 1000
   * lock keys (they are then not read; contender_keys still counts).
   *
   * @generated from field: int64 held_locks = 15;
   */
  heldLocks: bigint;

  /**
   * waiters: cluster-wide: the contenders queued behind the holders
   * (contender_keys less the holders); -1 when held_locks is.
   *
   * @generated from field: int64 waiters = 16;
   */
  waiters: bigint;
};

/**
 * Describes the message fencepost.v1.ServerInfoResponse.
 * Use `create(ServerInfoResponseSchema)` to create a new message.
 */
export const ServerInfoResponseSchema: GenMessage<ServerInfoResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 38);

/**
 * @generated from message fencepost.v1.AdminRevokeRequest
 */
export type AdminRevokeRequest = Message<"fencepost.v1.AdminRevokeRequest"> & {
  /**
   * request_id: see "Retries": a retry of an AdminRevoke that revoked a
   * lease, with the same request_id, answers as the first did instead of
   * revoking the next holder.
   *
   * @generated from field: string request_id = 2;
   */
  requestId: string;

  /**
   * name: the lock (the election, the semaphore: see kind) whose holder's
   * lease is revoked (UTF-8, 1 to 256 bytes, no Cc, Cf, Zl or Zp character).
   *
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * kind: what `name` names: HOLD_KIND_LOCK (the default) revokes the lock's
   * holder (of a read-write lock held by readers: the first of them,
   * DescribeResponse.holder; call again for the next), HOLD_KIND_ELECTION
   * the election's leader, HOLD_KIND_SEMAPHORE the holder of permit `slot`.
   * Another value: INVALID_ARGUMENT (kind).
   * The access policy's `admin` action is checked on `name` for every kind.
   * A coordinator that predates this field ignores it and revokes the
   * holder of the LOCK `name`, if there is one (harmless to safety: that
   * holder is fenced like any other): in a rolling upgrade, send
   * ELECTION and SEMAPHORE revokes only once every coordinator has it.
   *
   * @generated from field: fencepost.v1.HoldKind kind = 3;
   */
  kind: HoldKind;

  /**
   * slot: HOLD_KIND_SEMAPHORE only: the permit slot whose holder is revoked,
   * 0 to the semaphore's permits - 1 (its slots, as DescribeSemaphore lists
   * them). Must be 0 for the other kinds. Out of range: INVALID_ARGUMENT
   * (slot); a semaphore never used (no permits record) has no holder to
   * revoke: revoked = false.
   *
   * @generated from field: int32 slot = 4;
   */
  slot: number;
};

/**
 * Describes the message fencepost.v1.AdminRevokeRequest.
 * Use `create(AdminRevokeRequestSchema)` to create a new message.
 */
export const AdminRevokeRequestSchema: GenMessage<AdminRevokeRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 39);

/**
 * @generated from message fencepost.v1.AdminRevokeResponse
 */
export type AdminRevokeResponse = Message<"fencepost.v1.AdminRevokeResponse"> & {
  /**
   * revoked: whether a lease was revoked; false when the lock (election,
   * permit slot) was free (or its holder's lease ended before the revoke).
   *
   * @generated from field: bool revoked = 1;
   */
  revoked: boolean;

  /**
   * lease_id: the revoked lease (the holder's); 0 when the lock was free.
   *
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * token: the fencing token of the hold that ended; 0 when the lock was free.
   *
   * @generated from field: int64 token = 3;
   */
  token: bigint;
};

/**
 * Describes the message fencepost.v1.AdminRevokeResponse.
 * Use `create(AdminRevokeResponseSchema)` to create a new message.
 */
export const AdminRevokeResponseSchema: GenMessage<AdminRevokeResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 40);

/**
 * @generated from message fencepost.v1.ListSessionsRequest
 */
export type ListSessionsRequest = Message<"fencepost.v1.ListSessionsRequest"> & {
  /**
   * page_size: most leases in one response, 0 to 1000; 0 means 100.
   *
   * @generated from field: int32 page_size = 1;
   */
  pageSize: number;

  /**
   * page_token: the next_page_token of the previous response of this
   * listing; empty for the first page.
   *
   * @generated from field: string page_token = 2;
   */
  pageToken: string;
};

/**
 * Describes the message fencepost.v1.ListSessionsRequest.
 * Use `create(ListSessionsRequestSchema)` to create a new message.
 */
export const ListSessionsRequestSchema: GenMessage<ListSessionsRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 41);

/**
 * SessionInfo is one live lease in a ListSessions page.
 *
 * @generated from message fencepost.v1.SessionInfo
 */
export type SessionInfo = Message<"fencepost.v1.SessionInfo"> & {
  /**
   * lease_id: the etcd lease id.
   *
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;

  /**
   * owner_identity: the certificate identity of the caller that granted
   * the lease; empty when it was granted without a client certificate.
   *
   * @generated from field: string owner_identity = 2;
   */
  ownerIdentity: string;

  /**
   * ttl_seconds: the lease's granted TTL in seconds.
   *
   * @generated from field: int64 ttl_seconds = 3;
   */
  ttlSeconds: bigint;

  /**
   * ttl_remaining_seconds: seconds left on the lease as etcd reports it when
   * the page is served. A lower bound only: etcd resets TTLs on leader change.
   *
   * @generated from field: int64 ttl_remaining_seconds = 4;
   */
  ttlRemainingSeconds: bigint;

  /**
   * holds: what this lease holds, sorted: lock names as they are, and
   * "election:E" for the leadership of election E, "semaphore:S#i" for slot
   * i of a permit of semaphore S. (A lock may be named like that too: use
   * Describe, Leader or DescribeSemaphore to tell.)
   *
   * @generated from field: repeated string holds = 5;
   */
  holds: string[];

  /**
   * waits: what this lease waits for, sorted: lock names, "election:E" for
   * a candidacy of election E that does not lead, "semaphore:S" for a place
   * in the queue of semaphore S without a permit.
   *
   * @generated from field: repeated string waits = 6;
   */
  waits: string[];
};

/**
 * Describes the message fencepost.v1.SessionInfo.
 * Use `create(SessionInfoSchema)` to create a new message.
 */
export const SessionInfoSchema: GenMessage<SessionInfo> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 42);

/**
 * @generated from message fencepost.v1.ListSessionsResponse
 */
export type ListSessionsResponse = Message<"fencepost.v1.ListSessionsResponse"> & {
  /**
   * sessions: the live leases of this page, in lease id order (at most
   * page_size; fewer when leases ended since the listing's revision).
   *
   * @generated from field: repeated fencepost.v1.SessionInfo sessions = 1;
   */
  sessions: SessionInfo[];

  /**
   * next_page_token: pass it as page_token for the next page; empty on the
   * last page. Opaque; valid until etcd compacts `revision`.
   *
   * @generated from field: string next_page_token = 2;
   */
  nextPageToken: string;

  /**
   * revision: the etcd revision the ownership records are read at.
   *
   * @generated from field: int64 revision = 3;
   */
  revision: bigint;
};

/**
 * Describes the message fencepost.v1.ListSessionsResponse.
 * Use `create(ListSessionsResponseSchema)` to create a new message.
 */
export const ListSessionsResponseSchema: GenMessage<ListSessionsResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 43);

/**
 * LeaderInfo is one leadership of an election.
 *
 * @generated from message fencepost.v1.LeaderInfo
 */
export type LeaderInfo = Message<"fencepost.v1.LeaderInfo"> & {
  /**
   * lease_id: the leader's lease.
   *
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;

  /**
   * token: the leadership's fencing token.
   *
   * @generated from field: int64 token = 2;
   */
  token: bigint;

  /**
   * value: the leader's value (Campaign, then Proclaim), 0 to 32768 bytes.
   *
   * @generated from field: bytes value = 3;
   */
  value: Uint8Array;
};

/**
 * Describes the message fencepost.v1.LeaderInfo.
 * Use `create(LeaderInfoSchema)` to create a new message.
 */
export const LeaderInfoSchema: GenMessage<LeaderInfo> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 44);

/**
 * @generated from message fencepost.v1.CampaignRequest
 */
export type CampaignRequest = Message<"fencepost.v1.CampaignRequest"> & {
  /**
   * election: the election's name, as a lock name.
   *
   * @generated from field: string election = 1;
   */
  election: string;

  /**
   * lease_id: the candidate's lease.
   *
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * value: what the candidate publishes as leader (an address, an id), 0
   * to 32768 bytes.
   *
   * @generated from field: bytes value = 3;
   */
  value: Uint8Array;

  /**
   * wait_ms, wait_forever: as AcquireRequest's.
   *
   * @generated from field: int64 wait_ms = 4;
   */
  waitMs: bigint;

  /**
   * @generated from field: bool wait_forever = 5;
   */
  waitForever: boolean;

  /**
   * request_id: see "Retries".
   *
   * @generated from field: string request_id = 6;
   */
  requestId: string;
};

/**
 * Describes the message fencepost.v1.CampaignRequest.
 * Use `create(CampaignRequestSchema)` to create a new message.
 */
export const CampaignRequestSchema: GenMessage<CampaignRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 45);

/**
 * @generated from message fencepost.v1.CampaignResponse
 */
export type CampaignResponse = Message<"fencepost.v1.CampaignResponse"> & {
  /**
   * elected: true when the lease now leads. Only a try-once Campaign
   * returns false (and then nothing is queued).
   *
   * @generated from field: bool elected = 1;
   */
  elected: boolean;

  /**
   * token: the leadership's fencing token when elected.
   *
   * @generated from field: int64 token = 2;
   */
  token: bigint;

  /**
   * leader: the current leader when elected = false (unset: none).
   *
   * @generated from field: fencepost.v1.LeaderInfo leader = 3;
   */
  leader?: LeaderInfo | undefined;
};

/**
 * Describes the message fencepost.v1.CampaignResponse.
 * Use `create(CampaignResponseSchema)` to create a new message.
 */
export const CampaignResponseSchema: GenMessage<CampaignResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 46);

/**
 * @generated from message fencepost.v1.ProclaimRequest
 */
export type ProclaimRequest = Message<"fencepost.v1.ProclaimRequest"> & {
  /**
   * @generated from field: string election = 1;
   */
  election: string;

  /**
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * token: the leadership's token (> 0).
   *
   * @generated from field: int64 token = 3;
   */
  token: bigint;

  /**
   * value: the new value, 0 to 32768 bytes.
   *
   * @generated from field: bytes value = 4;
   */
  value: Uint8Array;
};

/**
 * Describes the message fencepost.v1.ProclaimRequest.
 * Use `create(ProclaimRequestSchema)` to create a new message.
 */
export const ProclaimRequestSchema: GenMessage<ProclaimRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 47);

/**
 * @generated from message fencepost.v1.ProclaimResponse
 */
export type ProclaimResponse = Message<"fencepost.v1.ProclaimResponse"> & {
  /**
   * revision: the etcd revision of the update.
   *
   * @generated from field: int64 revision = 1;
   */
  revision: bigint;
};

/**
 * Describes the message fencepost.v1.ProclaimResponse.
 * Use `create(ProclaimResponseSchema)` to create a new message.
 */
export const ProclaimResponseSchema: GenMessage<ProclaimResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 48);

/**
 * @generated from message fencepost.v1.ResignRequest
 */
export type ResignRequest = Message<"fencepost.v1.ResignRequest"> & {
  /**
   * @generated from field: string election = 1;
   */
  election: string;

  /**
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * token: the leadership's token; 0: withdraw the candidacy whatever its state.
   *
   * @generated from field: int64 token = 3;
   */
  token: bigint;

  /**
   * request_id: see "Retries".
   *
   * @generated from field: string request_id = 4;
   */
  requestId: string;
};

/**
 * Describes the message fencepost.v1.ResignRequest.
 * Use `create(ResignRequestSchema)` to create a new message.
 */
export const ResignRequestSchema: GenMessage<ResignRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 49);

/**
 * @generated from message fencepost.v1.ResignResponse
 */
export type ResignResponse = Message<"fencepost.v1.ResignResponse"> & {
  /**
   * revision: the etcd revision of the resignation.
   *
   * @generated from field: int64 revision = 1;
   */
  revision: bigint;

  /**
   * found: token = 0 only: whether the lease had a candidacy there.
   *
   * @generated from field: bool found = 2;
   */
  found: boolean;
};

/**
 * Describes the message fencepost.v1.ResignResponse.
 * Use `create(ResignResponseSchema)` to create a new message.
 */
export const ResignResponseSchema: GenMessage<ResignResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 50);

/**
 * @generated from message fencepost.v1.LeaderRequest
 */
export type LeaderRequest = Message<"fencepost.v1.LeaderRequest"> & {
  /**
   * @generated from field: string election = 1;
   */
  election: string;
};

/**
 * Describes the message fencepost.v1.LeaderRequest.
 * Use `create(LeaderRequestSchema)` to create a new message.
 */
export const LeaderRequestSchema: GenMessage<LeaderRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 51);

/**
 * @generated from message fencepost.v1.LeaderResponse
 */
export type LeaderResponse = Message<"fencepost.v1.LeaderResponse"> & {
  /**
   * leader: unset when the election has no leader.
   *
   * @generated from field: fencepost.v1.LeaderInfo leader = 1;
   */
  leader?: LeaderInfo | undefined;

  /**
   * revision: the etcd revision read.
   *
   * @generated from field: int64 revision = 2;
   */
  revision: bigint;
};

/**
 * Describes the message fencepost.v1.LeaderResponse.
 * Use `create(LeaderResponseSchema)` to create a new message.
 */
export const LeaderResponseSchema: GenMessage<LeaderResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 52);

/**
 * @generated from message fencepost.v1.ObserveRequest
 */
export type ObserveRequest = Message<"fencepost.v1.ObserveRequest"> & {
  /**
   * @generated from field: string election = 1;
   */
  election: string;

  /**
   * after_revision: 0 to start at the current state, else the revision of
   * the last ObserveResponse received (see Observe).
   *
   * @generated from field: int64 after_revision = 2;
   */
  afterRevision: bigint;
};

/**
 * Describes the message fencepost.v1.ObserveRequest.
 * Use `create(ObserveRequestSchema)` to create a new message.
 */
export const ObserveRequestSchema: GenMessage<ObserveRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 53);

/**
 * @generated from message fencepost.v1.ObserveResponse
 */
export type ObserveResponse = Message<"fencepost.v1.ObserveResponse"> & {
  /**
   * leader: the leader from `revision` on; unset: none.
   *
   * @generated from field: fencepost.v1.LeaderInfo leader = 1;
   */
  leader?: LeaderInfo | undefined;

  /**
   * revision: the etcd revision of the change (of the read, for the first
   * message). Pass it as after_revision to resume.
   *
   * @generated from field: int64 revision = 2;
   */
  revision: bigint;

  /**
   * compacted: the resumed-from revision was compacted: changes between it
   * and this message are unknown.
   *
   * @generated from field: bool compacted = 3;
   */
  compacted: boolean;
};

/**
 * Describes the message fencepost.v1.ObserveResponse.
 * Use `create(ObserveResponseSchema)` to create a new message.
 */
export const ObserveResponseSchema: GenMessage<ObserveResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 54);

/**
 * PermitHolder is one granted permit of a semaphore.
 *
 * @generated from message fencepost.v1.PermitHolder
 */
export type PermitHolder = Message<"fencepost.v1.PermitHolder"> & {
  /**
   * @generated from field: int64 lease_id = 1;
   */
  leaseId: bigint;

  /**
   * slot: 0 .. permits-1.
   *
   * @generated from field: int32 slot = 2;
   */
  slot: number;

  /**
   * token: the permit's fencing token, ordered per slot.
   *
   * @generated from field: int64 token = 3;
   */
  token: bigint;
};

/**
 * Describes the message fencepost.v1.PermitHolder.
 * Use `create(PermitHolderSchema)` to create a new message.
 */
export const PermitHolderSchema: GenMessage<PermitHolder> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 55);

/**
 * @generated from message fencepost.v1.AcquirePermitRequest
 */
export type AcquirePermitRequest = Message<"fencepost.v1.AcquirePermitRequest"> & {
  /**
   * name: the semaphore's name, as a lock name.
   *
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * permits: the semaphore's number of permits, 1 to 1000.
   *
   * @generated from field: int32 permits = 3;
   */
  permits: number;

  /**
   * wait_ms, wait_forever: as AcquireRequest's.
   *
   * @generated from field: int64 wait_ms = 4;
   */
  waitMs: bigint;

  /**
   * @generated from field: bool wait_forever = 5;
   */
  waitForever: boolean;

  /**
   * request_id: see "Retries".
   *
   * @generated from field: string request_id = 6;
   */
  requestId: string;
};

/**
 * Describes the message fencepost.v1.AcquirePermitRequest.
 * Use `create(AcquirePermitRequestSchema)` to create a new message.
 */
export const AcquirePermitRequestSchema: GenMessage<AcquirePermitRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 56);

/**
 * @generated from message fencepost.v1.AcquirePermitResponse
 */
export type AcquirePermitResponse = Message<"fencepost.v1.AcquirePermitResponse"> & {
  /**
   * acquired: true when the lease now holds a permit (try once only: false).
   *
   * @generated from field: bool acquired = 1;
   */
  acquired: boolean;

  /**
   * slot, token: of the permit, when acquired.
   *
   * @generated from field: int32 slot = 2;
   */
  slot: number;

  /**
   * @generated from field: int64 token = 3;
   */
  token: bigint;

  /**
   * holders: when acquired = false, the permits' holders.
   *
   * @generated from field: repeated fencepost.v1.PermitHolder holders = 4;
   */
  holders: PermitHolder[];
};

/**
 * Describes the message fencepost.v1.AcquirePermitResponse.
 * Use `create(AcquirePermitResponseSchema)` to create a new message.
 */
export const AcquirePermitResponseSchema: GenMessage<AcquirePermitResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 57);

/**
 * @generated from message fencepost.v1.ReleasePermitRequest
 */
export type ReleasePermitRequest = Message<"fencepost.v1.ReleasePermitRequest"> & {
  /**
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * @generated from field: int64 lease_id = 2;
   */
  leaseId: bigint;

  /**
   * slot, token: the permit's; token 0: withdraw whatever the lease has there.
   *
   * @generated from field: int32 slot = 3;
   */
  slot: number;

  /**
   * @generated from field: int64 token = 4;
   */
  token: bigint;

  /**
   * request_id: see "Retries".
   *
   * @generated from field: string request_id = 5;
   */
  requestId: string;
};

/**
 * Describes the message fencepost.v1.ReleasePermitRequest.
 * Use `create(ReleasePermitRequestSchema)` to create a new message.
 */
export const ReleasePermitRequestSchema: GenMessage<ReleasePermitRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 58);

/**
 * @generated from message fencepost.v1.ReleasePermitResponse
 */
export type ReleasePermitResponse = Message<"fencepost.v1.ReleasePermitResponse"> & {
  /**
   * revision: the etcd revision of the release.
   *
   * @generated from field: int64 revision = 1;
   */
  revision: bigint;

  /**
   * found: token = 0 only: whether the lease had a permit or a place there.
   *
   * @generated from field: bool found = 2;
   */
  found: boolean;
};

/**
 * Describes the message fencepost.v1.ReleasePermitResponse.
 * Use `create(ReleasePermitResponseSchema)` to create a new message.
 */
export const ReleasePermitResponseSchema: GenMessage<ReleasePermitResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 59);

/**
 * @generated from message fencepost.v1.DescribeSemaphoreRequest
 */
export type DescribeSemaphoreRequest = Message<"fencepost.v1.DescribeSemaphoreRequest"> & {
  /**
   * @generated from field: string name = 1;
   */
  name: string;
};

/**
 * Describes the message fencepost.v1.DescribeSemaphoreRequest.
 * Use `create(DescribeSemaphoreRequestSchema)` to create a new message.
 */
export const DescribeSemaphoreRequestSchema: GenMessage<DescribeSemaphoreRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 60);

/**
 * @generated from message fencepost.v1.DescribeSemaphoreResponse
 */
export type DescribeSemaphoreResponse = Message<"fencepost.v1.DescribeSemaphoreResponse"> & {
  /**
   * permits: the semaphore's number of permits; 0 if never used.
   *
   * @generated from field: int32 permits = 1;
   */
  permits: number;

  /**
   * holders: in slot order.
   *
   * @generated from field: repeated fencepost.v1.PermitHolder holders = 2;
   */
  holders: PermitHolder[];

  /**
   * waiter_count: contenders queued behind the holders.
   *
   * @generated from field: int64 waiter_count = 3;
   */
  waiterCount: bigint;

  /**
   * revision: the etcd revision read.
   *
   * @generated from field: int64 revision = 4;
   */
  revision: bigint;
};

/**
 * Describes the message fencepost.v1.DescribeSemaphoreResponse.
 * Use `create(DescribeSemaphoreResponseSchema)` to create a new message.
 */
export const DescribeSemaphoreResponseSchema: GenMessage<DescribeSemaphoreResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 61);

/**
 * @generated from message fencepost.v1.AdminEndLockDelayRequest
 */
export type AdminEndLockDelayRequest = Message<"fencepost.v1.AdminEndLockDelayRequest"> & {
  /**
   * name: the lock whose lock-delay ends.
   *
   * @generated from field: string name = 1;
   */
  name: string;
};

/**
 * Describes the message fencepost.v1.AdminEndLockDelayRequest.
 * Use `create(AdminEndLockDelayRequestSchema)` to create a new message.
 */
export const AdminEndLockDelayRequestSchema: GenMessage<AdminEndLockDelayRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 62);

/**
 * @generated from message fencepost.v1.AdminEndLockDelayResponse
 */
export type AdminEndLockDelayResponse = Message<"fencepost.v1.AdminEndLockDelayResponse"> & {
  /**
   * ended: whether a running delay or a pending one (the record of a hold
   * that ended uncleanly) was there and is now gone.
   *
   * @generated from field: bool ended = 1;
   */
  ended: boolean;

  /**
   * lock_delay_remaining_ms: the milliseconds that were left on the running
   * delay (0 when none ran).
   *
   * @generated from field: int64 lock_delay_remaining_ms = 2;
   */
  lockDelayRemainingMs: bigint;
};

/**
 * Describes the message fencepost.v1.AdminEndLockDelayResponse.
 * Use `create(AdminEndLockDelayResponseSchema)` to create a new message.
 */
export const AdminEndLockDelayResponseSchema: GenMessage<AdminEndLockDelayResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 63);

/**
 * @generated from message fencepost.v1.ReportStaleWriteRequest
 */
export type ReportStaleWriteRequest = Message<"fencepost.v1.ReportStaleWriteRequest"> & {
  /**
   * name: the lock whose token the refused write carried, as lock names
   * are written (1 to 256 bytes); "" when the guard was given a bare token
   * and the lock is not known.
   *
   * @generated from field: string name = 1;
   */
  name: string;

  /**
   * token: the fencing token the refused write carried (> 0).
   *
   * @generated from field: int64 token = 2;
   */
  token: bigint;

  /**
   * current_token: the token the record had accepted, which refused the
   * write (>= 0); 0 when not known (a malformed stored token).
   *
   * @generated from field: int64 current_token = 3;
   */
  currentToken: bigint;

  /**
   * storage: the kind of storage that refused it, the guard's `storage`
   * metrics label: 1 to 32 of a-z, 0-9 and _, starting with a letter
   * (`postgresql`, `sqlite`, `mysql`, `redis`, `etcd`, `dynamodb`, `s3`).
   * Another kind is counted under storage="other".
   *
   * @generated from field: string storage = 4;
   */
  storage: string;

  /**
   * record: a short label of the refused record (its key), for people:
   * at most 128 bytes of UTF-8, no control characters; "" for none. Never
   * a record's contents.
   *
   * @generated from field: string record = 5;
   */
  record: string;
};

/**
 * Describes the message fencepost.v1.ReportStaleWriteRequest.
 * Use `create(ReportStaleWriteRequestSchema)` to create a new message.
 */
export const ReportStaleWriteRequestSchema: GenMessage<ReportStaleWriteRequest> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 64);

/**
 * @generated from message fencepost.v1.ReportStaleWriteResponse
 */
export type ReportStaleWriteResponse = Message<"fencepost.v1.ReportStaleWriteResponse"> & {
};

/**
 * Describes the message fencepost.v1.ReportStaleWriteResponse.
 * Use `create(ReportStaleWriteResponseSchema)` to create a new message.
 */
export const ReportStaleWriteResponseSchema: GenMessage<ReportStaleWriteResponse> = /*@__PURE__*/
  messageDesc(file_fencepost_v1_lock, 65);

/**
 * ErrorReason is why a call failed (its name is the ErrorInfo.reason of the
 * failed call's status) or why a hold ended (HoldEnded.reason).
 *
 * @generated from enum fencepost.v1.ErrorReason
 */
export enum ErrorReason {
  /**
   * ERROR_REASON_UNSPECIFIED is never sent.
   *
   * @generated from enum value: ERROR_REASON_UNSPECIFIED = 0;
   */
  ERROR_REASON_UNSPECIFIED = 0,

  /**
   * INVALID_FIELD: a request field is out of range; metadata["field"] names it.
   * Also a request that is no protobuf of its type at all (bytes that cannot
   * be parsed); metadata["field"] is then absent. Status INVALID_ARGUMENT.
   *
   * @generated from enum value: INVALID_FIELD = 1;
   */
  INVALID_FIELD = 1,

  /**
   * NOT_HOLDER: the lease does not hold the lock (released, lost, never
   * held), or (HoldEnded) the holder's key was deleted: released, its lease
   * revoked or expired, or deleted by an operator. Status FAILED_PRECONDITION.
   *
   * @generated from enum value: NOT_HOLDER = 2;
   */
  NOT_HOLDER = 2,

  /**
   * STALE_TOKEN: the lease holds the lock, but under a newer token
   * (metadata["current_token"]). Status FAILED_PRECONDITION.
   *
   * @generated from enum value: STALE_TOKEN = 3;
   */
  STALE_TOKEN = 3,

  /**
   * LEASE_EXPIRED: the lease expired, was revoked or never existed.
   * Status FAILED_PRECONDITION.
   *
   * @generated from enum value: LEASE_EXPIRED = 4;
   */
  LEASE_EXPIRED = 4,

  /**
   * ACQUIRE_TIMEOUT: a blocking Acquire ran out of wait_ms. Status DEADLINE_EXCEEDED.
   *
   * @generated from enum value: ACQUIRE_TIMEOUT = 5;
   */
  ACQUIRE_TIMEOUT = 5,

  /**
   * ETCD_UNAVAILABLE: etcd is unreachable or has no quorum, or refused the
   * coordinator's credentials or permissions. Status UNAVAILABLE.
   *
   * @generated from enum value: ETCD_UNAVAILABLE = 6;
   */
  ETCD_UNAVAILABLE = 6,

  /**
   * TOO_MANY_WAITERS: the coordinator's limit on queued Acquire calls.
   * Status RESOURCE_EXHAUSTED.
   *
   * @generated from enum value: TOO_MANY_WAITERS = 7;
   */
  TOO_MANY_WAITERS = 7,

  /**
   * SHUTTING_DOWN: the coordinator is stopping; reconnect to another one.
   * Status UNAVAILABLE.
   *
   * @generated from enum value: SHUTTING_DOWN = 8;
   */
  SHUTTING_DOWN = 8,

  /**
   * TOO_MANY_STREAMS: the coordinator's limit on KeepAlive and Observe streams.
   * Status RESOURCE_EXHAUSTED.
   *
   * @generated from enum value: TOO_MANY_STREAMS = 9;
   */
  TOO_MANY_STREAMS = 9,

  /**
   * DATA_LOSS: etcd's revisions went back (etcd was restored from an older
   * snapshot, or replaced by an older copy of its data, or by another
   * cluster), so a new grant could carry a fencing token at or below one
   * already handed out. The coordinator refuses every call that grants,
   * checks or reports a token (and LeaseGrant), with health NOT_SERVING,
   * until an operator runs `fencepost admin recover-tokens` (docs/deploy.md,
   * "Restoring etcd from a snapshot"); KeepAlive streams, LeaseRevoke and
   * Withdraw are still served. Status UNAVAILABLE (+ RetryInfo).
   *
   * @generated from enum value: DATA_LOSS = 10;
   */
  DATA_LOSS = 10,

  /**
   * ACCESS_DENIED: the coordinator's access policy (`fencepost serve
   * --policy`) does not let the caller's identity (its client certificate's
   * SPIFFE ID, URI SAN, DNS SAN or subject CN) take this action on this
   * lock name; metadata["action"] and metadata["name"] say which (name is
   * absent for a call that names no lock: LeaseGrant, LeaseRevoke,
   * LeaseKeepAlive, KeepAlive, ServerInfo). Retrying does not help until
   * the policy changes. Status PERMISSION_DENIED.
   *
   * @generated from enum value: ACCESS_DENIED = 11;
   */
  ACCESS_DENIED = 11,

  /**
   * LIMIT_EXCEEDED: one of the coordinator's limits on a caller (its
   * certificate identity with mTLS, else its connection) or on a lease was
   * reached: leases per caller, holds and waits per lease, KeepAlive streams
   * per caller, the coordinator's total of leases, or the rate of LeaseGrant
   * or Acquire calls per caller. metadata["limit"] names the limit as its
   * `fencepost serve` flag without dashes ("max-leases-per-caller"),
   * metadata["value"] its configured value. A rate limit's refusal carries a
   * google.rpc.RetryInfo (when the next call would be allowed); the others
   * last until the caller releases, revokes or closes something. Nothing was
   * done: the call may be sent again as it was. Limits are per coordinator
   * replica. Status RESOURCE_EXHAUSTED.
   *
   * @generated from enum value: LIMIT_EXCEEDED = 12;
   */
  LIMIT_EXCEEDED = 12,

  /**
   * NOT_LEASE_OWNER: the call names a live lease that is not the caller's:
   * its certificate identity is not the lease owner's and it presented no
   * (or a wrong) lease secret (see "Ownership" above); metadata["lease_id"]
   * names the lease. Nothing was changed. Status PERMISSION_DENIED.
   *
   * @generated from enum value: NOT_LEASE_OWNER = 13;
   */
  NOT_LEASE_OWNER = 13,

  /**
   * PERMITS_MISMATCH: AcquirePermit asked for a number of permits other
   * than the semaphore's (fixed at its first use); metadata["permits"] is
   * the semaphore's. Status FAILED_PRECONDITION.
   *
   * @generated from enum value: PERMITS_MISMATCH = 14;
   */
  PERMITS_MISMATCH = 14,

  /**
   * REQUEST_ID_REUSED: a request_id came with a call other than the one it
   * was first used for (another method, name, lease or token): ids must be
   * unique per call. metadata["request_id"]. Status INVALID_ARGUMENT.
   *
   * @generated from enum value: REQUEST_ID_REUSED = 15;
   */
  REQUEST_ID_REUSED = 15,

  /**
   * OVERLOADED: this coordinator is past its capacity (its event loop
   * saturated, its clients' keepalive round trips or its lag above its
   * limits, see `fencepost serve --max-loop-busy`, `--max-client-rtt`,
   * `--max-lag`), so it refuses newcomers to keep serving what it admitted:
   * new leases (LeaseGrant), new KeepAlive streams and calls that would
   * wait (Acquire, AcquirePermit and Campaign with a wait). Keepalives,
   * releases, withdrawals, revokes, try-once calls and watches are always
   * served. Nothing was done: send the call again after the RetryInfo's
   * delay, or at once to another replica. Status RESOURCE_EXHAUSTED (+
   * RetryInfo 1 s).
   *
   * @generated from enum value: OVERLOADED = 16;
   */
  OVERLOADED = 16,

  /**
   * DRAINING: this coordinator is stopping (it got SIGTERM) and drains for
   * `fencepost serve --drain-seconds` before it stops: it refuses newcomers
   * (LeaseGrant, new KeepAlive streams, Acquire, AcquirePermit and
   * Campaign, also try-once) while it keeps answering what ends or keeps
   * state (Release, ReleasePermit, Resign, Withdraw, LeaseRevoke,
   * keepalives on open streams, the waits already queued). Nothing was
   * done: send the call at once to another replica, or here again after
   * the RetryInfo's delay (until the drain ends). Status UNAVAILABLE (+
   * RetryInfo 1 s).
   *
   * @generated from enum value: DRAINING = 17;
   */
  DRAINING = 17,
}

/**
 * Describes the enum fencepost.v1.ErrorReason.
 */
export const ErrorReasonSchema: GenEnum<ErrorReason> = /*@__PURE__*/
  enumDesc(file_fencepost_v1_lock, 0);

/**
 * HoldKind says what a hold (WatchHold, HoldEnded, AdminRevoke) is a grant of.
 *
 * @generated from enum fencepost.v1.HoldKind
 */
export enum HoldKind {
  /**
   * HOLD_KIND_LOCK: a lock (Acquire). The default.
   *
   * @generated from enum value: HOLD_KIND_LOCK = 0;
   */
  LOCK = 0,

  /**
   * HOLD_KIND_ELECTION: the leadership of an election (Campaign).
   *
   * @generated from enum value: HOLD_KIND_ELECTION = 1;
   */
  ELECTION = 1,

  /**
   * HOLD_KIND_SEMAPHORE: a permit of a semaphore (AcquirePermit), with its slot.
   *
   * @generated from enum value: HOLD_KIND_SEMAPHORE = 2;
   */
  SEMAPHORE = 2,

  /**
   * HOLD_KIND_READ: a read hold of a read-write lock (Acquire with mode
   * LOCK_MODE_READ), named by the lock name. WatchHold and HoldEnded only:
   * AdminRevoke refuses it (INVALID_ARGUMENT, field kind).
   *
   * @generated from enum value: HOLD_KIND_READ = 3;
   */
  READ = 3,
}

/**
 * Describes the enum fencepost.v1.HoldKind.
 */
export const HoldKindSchema: GenEnum<HoldKind> = /*@__PURE__*/
  enumDesc(file_fencepost_v1_lock, 1);

/**
 * LockMode says how an Acquire, Release or Withdraw takes its lock
 * (docs/rwlocks.md). A plain Acquire is a writer: older clients are unaffected.
 *
 * @generated from enum fencepost.v1.LockMode
 */
export enum LockMode {
  /**
   * LOCK_MODE_WRITE: exclusive. Granted when no contender of the name, reader
   * or writer, queued before it. The default.
   *
   * @generated from enum value: LOCK_MODE_WRITE = 0;
   */
  WRITE = 0,

  /**
   * LOCK_MODE_READ: shared with other readers. Granted when no writer queued
   * before it (a waiting writer blocks later readers). Its token is its own
   * key's create revision plus the token floor; a later writer's token is
   * larger than every reader's granted before it.
   *
   * @generated from enum value: LOCK_MODE_READ = 1;
   */
  READ = 1,
}

/**
 * Describes the enum fencepost.v1.LockMode.
 */
export const LockModeSchema: GenEnum<LockMode> = /*@__PURE__*/
  enumDesc(file_fencepost_v1_lock, 2);

/**
 * LockService grants leases and locks with fencing tokens. Any coordinator
 * replica serves any call: all state lives in etcd.
 *
 * @generated from service fencepost.v1.LockService
 */
export const LockService: GenService<{
  /**
   * LeaseGrant creates a lease with a TTL in whole seconds.
   * The lease lives until LeaseRevoke, or until ttl_seconds pass without a
   * keepalive on a KeepAlive stream. Not idempotent: each call creates a new
   * lease. The lease belongs to the caller (see "Ownership" above): keep
   * lease_secret and present it with every call naming the lease. A lease
   * whose ownership record cannot be written is revoked and the call fails.
   * Errors: INVALID_ARGUMENT (ttl_seconds), RESOURCE_EXHAUSTED/
   * LIMIT_EXCEEDED (the caller's leases or LeaseGrant rate on this
   * coordinator, or its total of leases), RESOURCE_EXHAUSTED/OVERLOADED
   * (this coordinator is past its capacity: retry later or on another
   * replica), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.LeaseGrant
   */
  leaseGrant: {
    methodKind: "unary";
    input: typeof LeaseGrantRequestSchema;
    output: typeof LeaseGrantResponseSchema;
  },
  /**
   * LeaseRevoke ends a lease at once and releases every lock it holds and
   * every wait it is queued in (holders on a KeepAlive stream receive a
   * HoldEnded event). Idempotent: revoking an unknown or expired lease
   * succeeds with found = false. Errors: INVALID_ARGUMENT (lease_id),
   * PERMISSION_DENIED/NOT_LEASE_OWNER (a live lease of another owner),
   * UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.LeaseRevoke
   */
  leaseRevoke: {
    methodKind: "unary";
    input: typeof LeaseRevokeRequestSchema;
    output: typeof LeaseRevokeResponseSchema;
  },
  /**
   * LeaseKeepAlive renews lease `lease_id` once, as one keepalive on a
   * KeepAlive stream does: the coordinator forwards it to etcd and answers
   * with the TTL etcd reset the lease to. It is for callers without a
   * stream (the HTTP API, scripts, grpcurl): call it about every TTL/3, and
   * stop trusting the lease's holds when no call has succeeded for a TTL;
   * the coordinator never renews a lease on its own. Idempotent. Served
   * like a keepalive on an open stream: also while the coordinator is past
   * its capacity or drains. A lease that is gone (expired or revoked) fails
   * with LEASE_EXPIRED: every hold under it is lost.
   * Errors: INVALID_ARGUMENT (lease_id), FAILED_PRECONDITION/LEASE_EXPIRED,
   * PERMISSION_DENIED/NOT_LEASE_OWNER (the lease is another caller's),
   * UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.LeaseKeepAlive
   */
  leaseKeepAlive: {
    methodKind: "unary";
    input: typeof LeaseKeepAliveRequestSchema;
    output: typeof LeaseKeepAliveResponseSchema;
  },
  /**
   * Acquire asks for the lock `name` on behalf of lease `lease_id`.
   * With wait_ms = 0 and wait_forever = false it tries once: if the lock is
   * free it is granted, otherwise the response has acquired = false with
   * the current holder, and nothing is left queued in etcd. Otherwise the
   * caller queues behind earlier contenders (first come, first served) and
   * is granted when every earlier one has left, or gets DEADLINE_EXCEEDED
   * when wait_ms passes (its place in the queue is removed). An Acquire
   * that ends without an answer (cancelled, its connection broken, the
   * caller's deadline) keeps its place for 2 s: the same lease calling
   * Acquire again for the same name, on any replica, keeps its key, its
   * revision and its place; after that the place is removed. A caller that
   * gives up calls Withdraw, which removes it at once (and a grant it may
   * have missed).
   * Idempotent per (lease_id, name): if that lease already holds the lock,
   * the same fencing token is returned again. Locks are not counted
   * re-entrantly: one Release ends the hold. Do not run two Acquire calls
   * for the same (lease_id, name) at once. While the lock-delay of a lost
   * holder runs (AcquireRequest.lock_delay_seconds), a free lock is granted
   * to nobody: a waiting Acquire waits, a try-once one gets acquired = false
   * with no holder.
   * Errors: INVALID_ARGUMENT (name, lease_id, wait_ms, lock_delay_seconds,
   * request_id), DEADLINE_EXCEEDED, FAILED_PRECONDITION/LEASE_EXPIRED (the
   * lease is gone, or its place in the queue was deleted while waiting),
   * RESOURCE_EXHAUSTED (too many waiters on this coordinator;
   * LIMIT_EXCEEDED: the lease's holds and waits or the caller's Acquire
   * rate; OVERLOADED: a call that would wait, refused while this
   * coordinator is past its capacity; a try-once call is still served),
   * PERMISSION_DENIED/NOT_LEASE_OWNER (the lease is another
   * caller's), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.Acquire
   */
  acquire: {
    methodKind: "unary";
    input: typeof AcquireRequestSchema;
    output: typeof AcquireResponseSchema;
  },
  /**
   * Release ends the hold of `name` by `lease_id` whose grant carried
   * `token`. The check and the delete are one etcd transaction. The lease
   * itself stays alive. Not idempotent: releasing a lock that is no longer
   * held by this grant fails with FAILED_PRECONDITION, unless the call is a
   * retry, with the same request_id, of a Release that succeeded: that
   * answers OK with the first revision (see "Retries").
   * Errors: INVALID_ARGUMENT (name, lease_id, token, request_id;
   * REQUEST_ID_REUSED: the request_id was used for another call),
   * FAILED_PRECONDITION/NOT_HOLDER (the lease holds no such lock),
   * FAILED_PRECONDITION/STALE_TOKEN (the lease holds the lock under a newer
   * token), FAILED_PRECONDITION/LEASE_EXPIRED (the lease is gone),
   * PERMISSION_DENIED/NOT_LEASE_OWNER (the lease is another caller's),
   * UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.Release
   */
  release: {
    methodKind: "unary";
    input: typeof ReleaseRequestSchema;
    output: typeof ReleaseResponseSchema;
  },
  /**
   * Withdraw deletes the key of lease `lease_id` in lock `name`, whatever
   * its token: a hold or a place in the queue. It is for a caller that gave
   * up an Acquire whose outcome it does not know (cancelled, timed out, its
   * answer lost): the grant or the queued wait it may have left is removed,
   * and the next waiter is granted. Idempotent: found = false when the lease
   * has no key there. Do not withdraw while another Acquire for the same
   * (lease_id, name) is running: that wait is ended too (LEASE_EXPIRED).
   * Errors: INVALID_ARGUMENT (name, lease_id, request_id), PERMISSION_DENIED/
   * NOT_LEASE_OWNER (the lease is another caller's), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.Withdraw
   */
  withdraw: {
    methodKind: "unary";
    input: typeof WithdrawRequestSchema;
    output: typeof WithdrawResponseSchema;
  },
  /**
   * KeepAlive is one bidirectional stream per client carrying keepalives
   * for all of its leases, and every event that ends one of its holds.
   * The coordinator forwards each keepalive to etcd and answers it; it never
   * renews a lease on its own. The stream lives until either side closes
   * it; on a broken stream, reconnect (to any replica), resend keepalives
   * and Watch messages: leases and tokens live in etcd and are unchanged.
   * Errors on the stream itself: UNAVAILABLE (coordinator shutting down),
   * RESOURCE_EXHAUSTED (too many streams; LIMIT_EXCEEDED: the caller's
   * streams on this coordinator; OVERLOADED: a new stream refused while
   * this coordinator is past its capacity, an open one is served on),
   * INVALID_ARGUMENT (name: a
   * watch or unwatch whose name is not valid UTF-8; no field: a message
   * that is no KeepAliveRequest at all; keepalives, calls: a batch of more
   * than 500 entries; the stream ends),
   * PERMISSION_DENIED/NOT_LEASE_OWNER (a keepalive, an entry of a batch or
   * a watch for a live lease the caller does not own; the stream ends,
   * nothing is renewed for that lease).
   *
   * Calls on the stream: Acquire, Release and Withdraw may also be sent as
   * messages on this stream (KeepAliveRequest.acquire/.release/.withdraw
   * with a request_id), answered by one KeepAliveResponse with the same
   * request_id: `acquired`/`released`/`withdrawn`, or `failed` with the
   * status the unary call would have ended with. Same semantics, checks
   * (access policy, ownership, limits) and errors as the unary calls, one
   * gRPC message each way instead of a call: the fast path under load. A
   * coordinator that serves them says so in the stream's initial metadata
   * (`fencepost-stream-calls: acquire,release,withdraw,keepalives,calls`: the
   * KeepAliveRequest fields it serves beyond keepalive, watch and unwatch,
   * comma-separated; ignore words you do not know); a client that does not
   * see a call there uses the unary call. Answers come in any order.
   * A grant on the stream is watched on that stream at once, as if a
   * `watch` had followed it (its end is told by HoldEnded), and a release
   * on the stream that succeeds drops that watch: no watch or unwatch
   * message is needed (after a reconnect, send `watch` again as usual).
   * A `cancel` abandons a waiting acquire as a cancelled unary Acquire would be (its
   * key is kept for a moment for a retry, then deleted; Withdraw removes it
   * at once); a stream that ends cancels every call still running on it.
   * An invalid call (a bad field, a request_id in use) is answered `failed`
   * (INVALID_ARGUMENT naming the field), and the stream goes on; a message
   * protobuf cannot decode (a string that is not UTF-8) ends the stream
   * with INVALID_ARGUMENT, as for a keepalive or watch.
   *
   * Batched keepalives: `keepalives` renews several leases in one message
   * (LeaseKeepAlives, at most 500 entries), each entry served exactly as a
   * `keepalive` of its own would be (ownership, limits, forwarding to etcd)
   * and answered by its own LeaseKeepAliveAck. A coordinator that serves
   * them lists `keepalives` in `fencepost-stream-calls`; a client that does
   * not see it sends one `keepalive` per lease. Acks that are ready at the
   * same time are sent together, as one LeaseKeepAliveAcks
   * (KeepAliveResponse.keepalives), but only on a stream that has sent at
   * least one batch: older clients, and clients that never batch (the
   * TypeScript client), keep getting one LeaseKeepAliveAck per message. No
   * ack is held back to wait for another, so how many go together depends
   * on how etcd's answers arrive: few on an idle coordinator, more under
   * load. Cost: a batch of N leases is one client message instead of N
   * (each gRPC message costs the coordinator about as much CPU as the rest
   * of a keepalive), and between 1 and N answers; etcd still gets one
   * keepalive per lease, each way, on the coordinator's shared
   * LeaseKeepAlive stream.
   *
   * Batched calls: `calls` carries several calls in one message
   * (StreamCalls, at most 500 entries), each entry (StreamCall) an
   * acquire, release, withdraw or cancel with the request_id, timeout_ms,
   * traceparent and lease_secret that KeepAliveRequest carries for a single
   * call, and served exactly as that single call would be (same checks,
   * access policy, ownership, limits, errors, logs, metrics and trace
   * spans; an invalid entry is answered `failed`, the others go on). A
   * coordinator that serves them lists `calls` in `fencepost-stream-calls`;
   * a client that does not see it sends one message per call. Answers that
   * are ready at the same time go together, as one StreamAnswers
   * (KeepAliveResponse.answers), but only on a stream that has sent at
   * least one `calls` message; elsewhere each answer is a message of its
   * own, as above. Answers come in any order, whichever message carried
   * the call: match each by its request_id. No call or answer is held back
   * to wait for another. Cost: a batch of N calls is one client message
   * instead of N, and between 1 and N answers (each gRPC message costs the
   * coordinator about as much CPU as the rest of a call's work); etcd
   * still gets one Txn per call (concurrent ones share an etcd Txn as
   * single calls do).
   *
   * @generated from rpc fencepost.v1.LockService.KeepAlive
   */
  keepAlive: {
    methodKind: "bidi_streaming";
    input: typeof KeepAliveRequestSchema;
    output: typeof KeepAliveResponseSchema;
  },
  /**
   * Describe reports the holder, fencing token, waiters and TTL left for one
   * lock name. Read-only; a snapshot at one etcd revision. While the
   * lock-delay of a lost holder runs, the lock has no holder (held = false)
   * and every contender is a waiter (ListLocks lists it so, with the
   * delay's time left).
   * Errors: INVALID_ARGUMENT (name), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.Describe
   */
  describe: {
    methodKind: "unary";
    input: typeof DescribeRequestSchema;
    output: typeof DescribeResponseSchema;
  },
  /**
   * ListLocks lists the held locks whose names start with `prefix`, in the
   * order of their etcd keys (percent-encoded names), one page at a time:
   * holder, fencing token, TTL left, how long held and waiters of each.
   * Elections and semaphores are not listed (Leader, DescribeSemaphore).
   * A lock that a lock-delay holds back (its holder was lost) is listed too,
   * with `holder` unset and the delay's time left (lock_delay_remaining_ms):
   * among the held locks when it has contenders (all of them waiters), and
   * after every lock with contenders when it has none, so that a name a
   * delay hides never goes unseen.
   * Read-only. Every page of one listing is read at the etcd revision of its
   * first page (carried in the page token), so the pages together are one
   * snapshot; only the TTLs and held_seconds are read when each page is
   * served. A page token stops working when etcd compacts that revision
   * (start again without one). Idempotent. With an access policy, a page
   * shows only the locks the caller may describe, so it may hold fewer than
   * page_size locks (even none) while next_page_token is set; a caller that
   * may describe no name under the prefix gets PERMISSION_DENIED.
   * Errors: INVALID_ARGUMENT (prefix, page_size, page_token: a token that
   * is malformed, from another prefix, or for a compacted revision),
   * UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.ListLocks
   */
  listLocks: {
    methodKind: "unary";
    input: typeof ListLocksRequestSchema;
    output: typeof ListLocksResponseSchema;
  },
  /**
   * ServerInfo reports on the coordinator that answers (not on the cluster
   * of replicas): its version, instance id, uptime, addresses and key
   * prefix, its readiness, the etcd it uses (endpoints, server version,
   * cluster and member ids, revision, raft leader and term), counts of its
   * own KeepAlive streams, leases, watched holds and waiting Acquire calls,
   * and counts of the lock keys under the prefix in the whole cluster.
   * Read-only and idempotent; for operators (`fencepost status`), not for
   * the lock protocol. It answers also when etcd does not: the etcd part is
   * then marked unavailable (etcd.available = false, etcd.error says why)
   * and the cluster-wide counts are -1. Its etcd reads end before the
   * call's gRPC deadline, and within 2 s without one.
   * Errors: none of its own (etcd failures are in the response). A
   * coordinator older than this RPC, or a server that is not a coordinator,
   * answers UNIMPLEMENTED.
   *
   * @generated from rpc fencepost.v1.LockService.ServerInfo
   */
  serverInfo: {
    methodKind: "unary";
    input: typeof ServerInfoRequestSchema;
    output: typeof ServerInfoResponseSchema;
  },
  /**
   * AdminRevoke ends the hold of lock `name` by revoking its holder's lease
   * in etcd (an operator's action: `fencepost admin revoke NAME`); with
   * `kind`, the leadership of election `name` (its leader's lease: `fencepost
   * admin revoke NAME --election`) or permit `slot` of semaphore `name` (that
   * permit holder's lease: `--semaphore --slot N`), the same way. The lease
   * ends with every key attached to it: this hold, the lease's other holds
   * and waits, and its ownership record. The holder hears it on its
   * KeepAlive stream at once (HoldEnded, reason NOT_HOLDER: its key was
   * deleted; LEASE_EXPIRED when a keepalive found the lease gone first), its
   * later keepalives answer ttl_seconds <= 0 (the lease is gone), and the
   * next waiter (the next candidate, the next semaphore waiter) is granted
   * with a larger fencing token. The ownership of the lease is not checked: this is
   * the one call that acts on a lease it does not own. The holder is read
   * just before the revoke (etcd cannot revoke a lease inside a Txn): if the
   * lock changed hands in between, the lease that held it is revoked all the
   * same, and the response names that lease and its token. A lock that is free
   * (an election without a leader, a free permit slot, a semaphore never
   * used) answers revoked = false and changes nothing. Without a request_id,
   * retrying after success revokes the next holder (NOT idempotent); with
   * one, a retry answers as the first attempt did, naming the lease it
   * revoked, and revokes nothing else (see "Retries"). Needs the `admin`
   * action on `name` in the access policy; without a policy (`--policy`)
   * every AdminRevoke is refused. Each call is logged (event `admin`, level
   * WARNING).
   * Errors: INVALID_ARGUMENT (name, request_id; REQUEST_ID_REUSED; kind:
   * not a HoldKind; slot: negative, not 0 for a lock or an election, or not
   * below the semaphore's number of permits), PERMISSION_DENIED/ACCESS_DENIED (not
   * allowed `admin` on the name, or no access policy), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.AdminRevoke
   */
  adminRevoke: {
    methodKind: "unary";
    input: typeof AdminRevokeRequestSchema;
    output: typeof AdminRevokeResponseSchema;
  },
  /**
   * ListSessions lists the live leases granted by the coordinators (those
   * with an ownership record), one page at a time in lease id order: owner
   * identity, granted TTL, TTL left, and the locks each holds and waits for.
   * Read-only and idempotent. The records are read at the etcd revision of
   * the listing's first page (carried in the page token); TTLs, holds and
   * waits when each page is served. A lease that ended since is left out.
   * Needs the `admin` action on every name (a rule with names = ["*"]), since
   * it shows leases of every lock; without an access policy every
   * ListSessions is refused. Each call is logged (event `admin`, level INFO).
   * Errors: INVALID_ARGUMENT (page_size, page_token),
   * PERMISSION_DENIED/ACCESS_DENIED, UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.ListSessions
   */
  listSessions: {
    methodKind: "unary";
    input: typeof ListSessionsRequestSchema;
    output: typeof ListSessionsResponseSchema;
  },
  /**
   * Campaign enters lease `lease_id` as a candidate of `election` with
   * `value` and waits until it leads (wait_ms / wait_forever as for
   * Acquire; try once with neither). Idempotent per (lease_id, election):
   * a lease that already leads gets the same token again (its value is set
   * to `value`). A campaign that ends without an answer keeps its place for
   * 2 s, as an Acquire does; Resign with token 0 removes it at once.
   * Errors: as Acquire, and INVALID_ARGUMENT (election, value, request_id).
   *
   * @generated from rpc fencepost.v1.LockService.Campaign
   */
  campaign: {
    methodKind: "unary";
    input: typeof CampaignRequestSchema;
    output: typeof CampaignResponseSchema;
  },
  /**
   * Proclaim sets the value of the leadership (election, lease_id, token)
   * without a new election (the token is unchanged). Idempotent.
   * Errors: INVALID_ARGUMENT (election, lease_id, token, value),
   * FAILED_PRECONDITION/NOT_HOLDER (not the leader under that token),
   * STALE_TOKEN, LEASE_EXPIRED, PERMISSION_DENIED/NOT_LEASE_OWNER, UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.Proclaim
   */
  proclaim: {
    methodKind: "unary";
    input: typeof ProclaimRequestSchema;
    output: typeof ProclaimResponseSchema;
  },
  /**
   * Resign ends the leadership (election, lease_id, token), as Release
   * ends a hold; the next candidate leads. With token = 0 it removes the
   * lease's candidacy whatever its state (leading or waiting), as Withdraw
   * does for a lock, and is idempotent. A retry with the request_id of a
   * Resign that succeeded answers as the first did (see "Retries").
   * Errors: as Release (NOT_HOLDER: not the leader under that token).
   *
   * @generated from rpc fencepost.v1.LockService.Resign
   */
  resign: {
    methodKind: "unary";
    input: typeof ResignRequestSchema;
    output: typeof ResignResponseSchema;
  },
  /**
   * Leader reports the current leader of `election`: its lease, token and
   * value, at one etcd revision. Read-only.
   * Errors: INVALID_ARGUMENT (election), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.Leader
   */
  leader: {
    methodKind: "unary";
    input: typeof LeaderRequestSchema;
    output: typeof LeaderResponseSchema;
  },
  /**
   * Observe streams the leader of `election` each time it changes: a new
   * leader (larger token), a new value (Proclaim), or no leader. The first
   * message is the state at the start: the current one, or, with
   * after_revision = R > 0 (the revision of the last message a previous
   * Observe delivered), nothing for R itself and every change after R, so
   * that an observer that reconnects (to any replica) misses and repeats
   * nothing. If etcd compacted R away, the first message is the current
   * state with `compacted` = true (leaders in between cannot be known).
   * An Observe stream holds an etcd watch: it counts as a stream for the
   * coordinator's stream limits. Once its first etcd read succeeded, the
   * coordinator sends initial metadata `fencepost-observe-accepted: 1`
   * (a resumed Observe may send no message for a long time: this says it
   * is up); an Observe refused before (etcd unreachable) has none.
   * Errors: INVALID_ARGUMENT (election, after_revision), RESOURCE_EXHAUSTED
   * (TOO_MANY_STREAMS; LIMIT_EXCEEDED: max-streams-per-caller), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.Observe
   */
  observe: {
    methodKind: "server_streaming";
    input: typeof ObserveRequestSchema;
    output: typeof ObserveResponseSchema;
  },
  /**
   * AcquirePermit asks for one permit of semaphore `name` of `permits`
   * permits for lease `lease_id`; waiting as for Acquire (try once with
   * neither wait_ms nor wait_forever: acquired = false and nothing queued
   * when all permits are held). Idempotent per (lease_id, name): a lease
   * that holds a permit gets the same slot and token again (one permit per
   * lease per semaphore).
   * Errors: as Acquire, and INVALID_ARGUMENT (permits: 1 to 1000,
   * request_id), FAILED_PRECONDITION/PERMITS_MISMATCH (metadata "permits":
   * the semaphore's number of permits).
   *
   * @generated from rpc fencepost.v1.LockService.AcquirePermit
   */
  acquirePermit: {
    methodKind: "unary";
    input: typeof AcquirePermitRequestSchema;
    output: typeof AcquirePermitResponseSchema;
  },
  /**
   * ReleasePermit ends the permit (name, lease_id, slot, token); the next
   * waiter is granted. With token = 0 it removes the lease's permit or
   * place in the queue, whatever its state, and is idempotent (as
   * Withdraw). A retry with the request_id of a ReleasePermit that
   * succeeded answers as the first did.
   * Errors: as Release, and INVALID_ARGUMENT (slot: negative or above the
   * largest number of permits; and, when a release is refused, not below the
   * semaphore's own number of permits: no such permit can exist).
   *
   * @generated from rpc fencepost.v1.LockService.ReleasePermit
   */
  releasePermit: {
    methodKind: "unary";
    input: typeof ReleasePermitRequestSchema;
    output: typeof ReleasePermitResponseSchema;
  },
  /**
   * DescribeSemaphore reports the permits, holders (slot, lease, token)
   * and waiters of semaphore `name` at one etcd revision. Read-only.
   * Errors: INVALID_ARGUMENT (name), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.DescribeSemaphore
   */
  describeSemaphore: {
    methodKind: "unary";
    input: typeof DescribeSemaphoreRequestSchema;
    output: typeof DescribeSemaphoreResponseSchema;
  },
  /**
   * AdminEndLockDelay ends the lock-delay of lock `name` (an operator's
   * action: `fencepost admin end-lock-delay NAME`): a running delay (see
   * AcquireRequest.lock_delay_seconds) is ended and its waiters are granted
   * at once, and the record of a hold that ended uncleanly (its delay not
   * started yet) is dropped. The record of a hold that is still held stays:
   * its own later end still delays. Idempotent: a lock with no delay to end
   * answers ended = false and changes nothing. Needs the `admin` action on
   * `name` in the access policy; without a policy every call is refused.
   * Each call is logged (event `admin`, action `end_lock_delay`, level
   * WARNING).
   * Errors: INVALID_ARGUMENT (name), PERMISSION_DENIED/ACCESS_DENIED (not
   * allowed `admin` on the name, or no access policy), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.AdminEndLockDelay
   */
  adminEndLockDelay: {
    methodKind: "unary";
    input: typeof AdminEndLockDelayRequestSchema;
    output: typeof AdminEndLockDelayResponseSchema;
  },
  /**
   * ReportStaleWrite tells the coordinator that a fencing guard refused a
   * write whose fencing token was lower than the record's (an opt-in report
   * from the application's process, where the guard runs: the Python
   * client's `stale_write_reporter()` as a guard's `on_reject`). The
   * coordinator counts it in `fencepost_stale_writes_reported_total{storage}`,
   * logs it (event `stale_write`, level WARNING) and shows it on the lock
   * board's timeline of the coordinator that received it; it changes no lock
   * and no record. Best effort and cheap: nothing is written to etcd; at most
   * 20 reports a second are taken per coordinator process (a burst of 100),
   * past which a report is refused. Not idempotent: a retry counts twice.
   * With `name`, needs the `acquire` action on it (who may take the lock may
   * report its stale writes); without, a caller the policy lets acquire
   * some name (as LeaseGrant).
   * Errors: INVALID_ARGUMENT (name, token, current_token, storage, record),
   * PERMISSION_DENIED/ACCESS_DENIED, RESOURCE_EXHAUSTED/LIMIT_EXCEEDED (the
   * rate; RetryInfo says when to try again).
   *
   * @generated from rpc fencepost.v1.LockService.ReportStaleWrite
   */
  reportStaleWrite: {
    methodKind: "unary";
    input: typeof ReportStaleWriteRequestSchema;
    output: typeof ReportStaleWriteResponseSchema;
  },
  /**
   * AcquireAll takes every lock of `names` for lease `lease_id`, or none
   * (a multi-lock: a transfer between two accounts). One etcd transaction
   * puts the contender keys of all names together, so every key gets the
   * same create revision R; the call then waits until each key is first in
   * its own lock's queue. No deadlock whatever order callers give the
   * names: each queue is ordered by create revision and all of one call's
   * keys share one, so any two AcquireAll calls are ordered the same way on
   * every name they share. Every name's token is R + the token floor,
   * strictly larger than that name's earlier tokens. Waiting and try once
   * as Acquire; a try-once call that cannot take every name at once, a
   * wait that times out, and a call that fails leave no key of any name
   * (one transaction deletes them all); so does a call cancelled while it
   * waits, at once (unlike Acquire, no place is kept for a caller that
   * reconnects: it queues again). A client that gives up a call whose
   * outcome it does not know calls ReleaseAll with token 0. Idempotent per
   * (lease_id, names): a lease that holds them all gets the same tokens.
   * Do not mix AcquireAll and Acquire of one name under one lease.
   * Errors: INVALID_ARGUMENT (names: fewer than 2, more than 32, a
   * duplicate, or a name that is not a lock name; lease_id, wait_ms,
   * request_id), DEADLINE_EXCEEDED/ACQUIRE_TIMEOUT,
   * FAILED_PRECONDITION/LEASE_EXPIRED (the lease is gone, or one of its
   * keys was deleted while waiting), RESOURCE_EXHAUSTED (as Acquire),
   * PERMISSION_DENIED (ACCESS_DENIED: not allowed `acquire` on one of the
   * names; NOT_LEASE_OWNER), UNAVAILABLE.
   *
   * @generated from rpc fencepost.v1.LockService.AcquireAll
   */
  acquireAll: {
    methodKind: "unary";
    input: typeof AcquireAllRequestSchema;
    output: typeof AcquireAllResponseSchema;
  },
  /**
   * ReleaseAll ends the multi-lock of `names` by `lease_id` granted with
   * `token`: one etcd transaction deletes every key, only if each was
   * created at the token's revision (else nothing is deleted). A retry with
   * the request_id of a ReleaseAll that succeeded answers as the first did.
   * With token = 0 it deletes whatever keys the lease has in those locks (a
   * hold or a wait: for a caller that gave up an AcquireAll) and is
   * idempotent (as Withdraw).
   * Errors: as Release (NOT_HOLDER, STALE_TOKEN, LEASE_EXPIRED name the
   * first name not held), and INVALID_ARGUMENT (names as AcquireAll).
   *
   * @generated from rpc fencepost.v1.LockService.ReleaseAll
   */
  releaseAll: {
    methodKind: "unary";
    input: typeof ReleaseAllRequestSchema;
    output: typeof ReleaseAllResponseSchema;
  },
}> = /*@__PURE__*/
  serviceDesc(file_fencepost_v1_lock, 0);

