// The Fencepost lock board: one EventSource on /board/events, rendered into plain tables (no framework).
"use strict";
(function () {
  const rows = new Map();      // internal lock name -> entry (see coordinator/http/board_feed.py)
  let timeline = [];           // newest first
  let skew = 0;                // the coordinator's monotonic clock - this wall clock, ms
  let source = null;
  let pending = false;
  let mayRevoke = false;       // the access policy lets this caller revoke (an "access" event says)
  const $ = (id) => document.getElementById(id);
  const MAX_TIMELINE = 500;

  function seconds(ms) {
    if (ms === null || ms === undefined) return "?";
    const s = Math.max(0, Math.round(ms / 1000));
    return s < 120 ? s + " s" : s < 7200 ? Math.floor(s / 60) + " min" : Math.floor(s / 3600) + " h";
  }
  function now() { return Date.now() + skew; }
  function cell(tr, text, cls) {
    const td = tr.insertCell();
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }
  function heldFor(h) { return h.sinceMs ? seconds(now() - h.sinceMs) : "?"; }
  function ttlCell(tr, h) {
    if (h.expiresMs === null) return cell(tr, "?");
    const left = h.expiresMs - now();
    return cell(tr, seconds(left) + " / " + h.ttl + " s", left < 1000 * Math.min(3, h.ttl / 3) ? "low" : "");
  }
  function queue(waiters) { return waiters.map((w) => w.lease + "/" + w.token + (w.read ? " r" : "")).join(", "); }
  // A lock held by readers: every reader's lease and token, marked "(read)".
  function leases(e) { return [e.holder, ...(e.readers || [])].map((h) => h.lease).join(", ") + (e.holder.read ? " (read)" : ""); }
  function tokens(e) { return [e.holder, ...(e.readers || [])].map((h) => h.token).join(", "); }
  function tbody(id) {
    const body = $(id).tBodies[0];
    body.textContent = "";
    return body;
  }

  function render() {
    pending = false;
    const entries = [...rows.values()].sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : a.slot - b.slot);
    const locks = tbody("locks"), elections = tbody("elections"), semaphores = tbody("semaphores");
    const counts = { lock: 0, election: 0, semaphore: new Set() };
    for (const e of entries) {
      const h = e.holder;
      let tr;
      if (e.kind === "lock") {
        counts.lock++;
        tr = locks.insertRow();
        cell(tr, e.name); cell(tr, leases(e)); cell(tr, tokens(e), "token"); cell(tr, heldFor(h)); ttlCell(tr, h);
        cell(tr, queue(e.waiters));
      } else if (e.kind === "election") {
        counts.election++;
        tr = elections.insertRow();
        cell(tr, e.name); cell(tr, h.lease); cell(tr, h.token, "token"); cell(tr, h.value); cell(tr, heldFor(h));
        ttlCell(tr, h); cell(tr, queue(e.waiters));
      } else {
        counts.semaphore.add(e.name);
        tr = semaphores.insertRow();
        if (e.slot < 0) {  // the semaphore's queue: its first contenders hold permits, the others wait
          cell(tr, e.name); cell(tr, "queue"); cell(tr, queue([h, ...e.waiters])); cell(tr, ""); cell(tr, "");
          cell(tr, "");
        } else {
          cell(tr, e.name); cell(tr, String(e.slot)); cell(tr, h.lease); cell(tr, h.token, "token");
          cell(tr, heldFor(h)); ttlCell(tr, h);
        }
      }
      tr.dataset.key = e.key;
      if (mayRevoke && e.slot >= 0) revokeButton(tr, e);
    }
    $("lock-count").textContent = "(" + counts.lock + ")";
    $("election-count").textContent = "(" + counts.election + ")";
    $("semaphore-count").textContent = "(" + counts.semaphore.size + ")";
  }
  function revokeButton(tr, e) {
    const button = document.createElement("button");
    button.textContent = "Revoke";
    button.className = "revoke";
    button.onclick = async () => {
      const what = e.kind + " " + e.name + (e.kind === "semaphore" ? " slot " + e.slot : "");
      if (!confirm("Revoke " + what + "? Its holder (lease " + e.holder.lease + ", token " + e.holder.token +
                   ") loses it: its lease is revoked.")) return;
      const answer = await fetch("/v1/" + e.kind + "s/" + encodeURIComponent(e.name) + ":revoke", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(e.kind === "semaphore" ? { slot: e.slot } : {}) });
      if (!answer.ok) alert("Revoke refused: " + ((await answer.json()).message || answer.status));
    };
    tr.insertCell().append(button);
  }
  function later() {
    if (!pending) { pending = true; requestAnimationFrame(render); }
  }

  // Why a hold ended, as the coordinator knows it ("revoked by AdminRevoke") or infers it ("expired, inferred").
  function ended(t) {
    if (!t.reason) return "?";
    return t.reason + (t.by ? " by " + t.by : "") + (t.exact === false ? ", inferred" : "");
  }

  function told(items) {
    const list = $("timeline");
    for (const t of items) {
      const li = document.createElement("li");
      li.className = "t-" + t.what;
      if (t.reason) li.dataset.reason = t.reason;
      if (t.exact !== null && t.exact !== undefined) li.dataset.exact = t.exact;
      const at = document.createElement("time");
      at.textContent = new Date(t.atMs - skew).toLocaleTimeString();
      const what = document.createElement("b");
      what.textContent = t.what === "ended" ? "ended (" + ended(t) + ")" : t.what;
      const slot = t.kind === "semaphore" ? (t.slot < 0 ? " queue" : " slot " + t.slot) : "";
      if (t.what === "stale_write") {  // a guard refused a write: its token below the record's
        what.textContent = "stale write refused";
        li.append(at, what, " " + t.storage + (t.record ? " record " + t.record : "") + (t.name ? " lock " + t.name : "") +
          " token " + t.token + " < " + (t.currentToken === "0" ? "?" : t.currentToken));
      } else {
        li.append(at, what, " " + t.kind + " " + t.name + slot + (t.read ? " (read)" : "") + " lease " + t.lease + " token " + t.token);
      }
      list.prepend(li);
      timeline.unshift(t);
    }
    while (timeline.length > MAX_TIMELINE) { timeline.pop(); list.lastChild.remove(); }
  }

  function connect() {
    if (source) source.close();
    const prefix = $("prefix").value;
    source = new EventSource("/board/events?prefix=" + encodeURIComponent(prefix));
    source.addEventListener("access", (ev) => { mayRevoke = JSON.parse(ev.data).mayRevoke; later(); });
    source.addEventListener("snapshot", (ev) => {
      const data = JSON.parse(ev.data);
      skew = data.nowMs - Date.now();
      rows.clear();
      for (const e of data.locks) rows.set(e.key, e);
      timeline = [];
      $("timeline").textContent = "";
      told(data.timeline);
      later();
    });
    source.addEventListener("change", (ev) => {
      const data = JSON.parse(ev.data);
      skew = data.nowMs - Date.now();
      for (const [key, e] of Object.entries(data.locks)) {
        if (e === null) rows.delete(key); else rows.set(key, e);
      }
      told(data.timeline);
      later();
    });
    source.onopen = () => { $("status").textContent = "live"; $("status").className = "status live"; };
    source.onerror = () => { $("status").textContent = "reconnecting…"; $("status").className = "status down"; };
  }

  const params = new URLSearchParams(location.search);
  $("prefix").value = params.get("prefix") || "";
  let typing = null;
  $("prefix").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      const url = new URL(location.href);
      url.searchParams.set("prefix", $("prefix").value);
      history.replaceState(null, "", url);
      connect();
    }, 300);
  });
  setInterval(later, 1000);  // held for and TTL left count on between events
  connect();
})();
