// A run's steps as a waterfall: time across, one lane per timeline row, one bar per attempt
// (failed attempts in red), every wide fan as ONE band spanning its first start to its last
// end with its members' counts by status (from the fan summary: members are never loaded),
// and each wait (sleep, signal, event, update, child) as a labelled gap. Plain DOM positioned
// in percent of the run's span; past MAX_LANES lanes the rest are counted, not drawn.
import { h, ms, millis, num, when, runLink } from "./dom.js";

export const MAX_LANES = 150;
const STEPS = new Set(["local_step", "in_process_step", "remote_step", "side_effect", "recorded_time", "compensation"]);
const WAITS = new Set(["sleep", "signal_wait", "event_wait", "update_wait", "webhook_wait", "breakpoint", "child", "on_error_handoff"]);
const FAN_ORDER = ["completed", "failed", "running", "pending"];
const LIVE = ["pending", "running"];

/** What a wait waited for, in words (the server's `row.waitsFor`: a signal's token, an
 *  event's or an update's name). */
function waitedFor(cp) {
  const row = cp.row || {};
  if (row.kind === "sleep" || row.kind === "breakpoint") return row.kind;
  const what = { event_wait: "event", update_wait: "update", webhook_wait: "webhook" }[row.kind] || "signal";
  return `${what} ${row.waitsFor ?? cp.name}`;
}

/** Lanes in seq order: {seq, label, bars:[{from, to, cls, title, attempt}], wait?, fan?, cp?}. */
export function lanes(detail, now) {
  // An engine row (a wait's deadline) is left out when its wait has a row; one whose wait
  // has none yet stays: it is the only trace of a wait still open (or ended by its timeout).
  const seqs = new Set((detail.timeline || []).map((cp) => cp.seq));
  const rows = (detail.timeline || []).filter((cp) => !(cp.row && cp.row.engine && cp.row.owner != null && seqs.has(cp.row.owner)));
  const items = rows.map((cp) => ({ seq: cp.seq, cp })).concat((detail.fans || []).map((f) => ({ seq: f.firstSeq, fan: f })));
  items.sort((a, b) => a.seq - b.seq || (a.fan ? -1 : 1));
  let cursor = ms(detail.run.createdAt); // where the previous lane ended: a wait began there
  const out = [];
  for (const it of items) {
    const lane = it.fan ? fanLane(it.fan, now) : rowLane(it.cp, cursor, now);
    if (!lane) continue;
    out.push(lane);
    const end = Math.max(...lane.bars.map((b) => b.to));
    if (Number.isFinite(end) && end > cursor) cursor = end;
  }
  // A suspended run whose wait has no row (a signal, event or child wait without a
  // timeout is written when it ends): a trailing gap from the last lane to now.
  if (detail.run.status === "suspended" && !out.some((l) => l.wait && l.wait.live)) {
    out.push({ seq: null, label: "suspended · waiting", wait: { live: true }, bars: [{ from: Math.min(cursor, now), to: now,
      cls: "wait", title: "the run is suspended: waiting since the last row (what for is on the run list)" }] });
  }
  return out;
}

function fanLane(f, now) {
  const total = f.total ?? f.size;
  const from = ms(f.startedAt), to = f.finishedAt ? ms(f.finishedAt) : now;
  if (from == null) return null;
  const counts = f.counts || {};
  const words = FAN_ORDER.filter((s) => counts[s]).map((s) => `${s} ${num(counts[s])}`);
  if (f.notStarted) words.push(`not started ${num(f.notStarted)}`);
  return { seq: f.firstSeq, label: `${f.label || f.group} ×${num(total)}`, fan: f, counts, total,
    bars: [{ from, to, cls: "fan", title: `fan of ${num(total)}: ${words.join(", ")}; ${f.finishedAt ? millis(to - from) : "in flight"}` }] };
}

function rowLane(cp, cursor, now) {
  const row = cp.row || {};
  const kind = row.kind || cp.kind;
  const start = ms(cp.startedAt), end = ms(cp.finishedAt);
  const live = LIVE.includes(cp.status);
  const lane = { seq: cp.seq, cp, label: cp.name, bars: [] };
  if (STEPS.has(kind) || kind === "folded_fan") {
    const spans = row.attemptSpans;
    if (spans && spans.length) {
      lane.gaps = [];
      for (const s of spans) {
        const from = ms(s.startedAt), to = s.endedAt ? ms(s.endedAt) : now;
        const before = lane.bars[lane.bars.length - 1];
        // a retry's backoff, where the next attempt's start is known to come later
        if (before && from > before.to) lane.gaps.push({ from: before.to, to: from, title: `waited ${millis(from - before.to)} before attempt ${s.attempt}` });
        lane.bars.push({ from, to, attempt: s.attempt, status: s.status, cls: s.status,
          title: `attempt ${s.attempt} ${s.status}` + (s.message ? `: ${s.message}` : "") +
            (s.startKnown ? "" : " (began after the previous attempt failed; its start is not stored)") +
            (s.omittedBefore ? ` — ${num(s.omittedBefore)} earlier attempts not kept` : "") });
      }
    } else {
      lane.bars.push({ from: start, to: live ? now : end, attempt: cp.attempts || 1, status: cp.status, cls: cp.status,
        title: `${row.label || kind} ${cp.status}` + (row.durationMs != null ? ` in ${millis(row.durationMs)}` : "") });
    }
    if (kind === "folded_fan") lane.label = `${cp.name} (${num(cp.output && cp.output.count)} folded)`;
    return lane;
  }
  if (kind === "timeout") {
    // a deadline written as its wait began: the wait is open (armed) or ended by it (fired)
    const due = row.dueAt ? ms(row.dueAt) : now;
    const open = row.state === "armed";
    const to = open ? now : due;
    lane.wait = { what: row.label, live: open };
    lane.label = `${(row.label || "").replace(/^timeout of /, "")} · ${open ? "waiting" : "timed out"}`;
    lane.bars.push({ from: start, to, cls: "wait" + (open ? "" : " failed"),
      title: `${row.label}: ${open ? `waiting, times out at ${when(row.dueAt)}` : `timed out after ${millis(Math.max(0, due - start))}`}` });
    return lane;
  }
  if (WAITS.has(kind)) {
    let from, to;
    if (kind === "sleep") { from = start; to = row.dueAt ? ms(row.dueAt) : end; }
    else if (live) { from = Math.min(cursor, now); to = now; }
    else {
      // A delivered wait's row is written when it arrives: it began where the previous lane
      // ended, unless its deadline row says exactly how long it waited.
      to = end;
      from = row.durationMs != null ? end - row.durationMs : Math.min(cursor, end);
    }
    const child = kind === "child" || kind === "on_error_handoff" ? row.waitsFor : null;
    const childFailed = child && cp.output && cp.output.ok === false;
    lane.wait = { child, what: waitedFor(cp), live };
    lane.label = `${child ? "child" : waitedFor(cp)} · ${live ? "waiting" : millis(Math.max(0, to - from))}`;
    lane.bars.push({ from, to, cls: "wait" + (childFailed ? " failed" : ""),
      title: `${live ? "waiting for" : "waited for"} ${child ? "child run " + child : waitedFor(cp)} · ${millis(Math.max(0, to - from))}` });
    return lane;
  }
  // instants: a child started, an event set, a patch marker
  lane.bars.push({ from: start, to: start, cls: "mark", title: `${row.label || kind} at ${when(cp.startedAt)}` });
  return lane;
}

/** The waterfall element of a run detail; `select(cp)` opens a row's step detail. */
export function waterfall(detail, select) {
  const run = detail.run;
  const now = Date.now();
  const all = lanes(detail, now);
  const shown = all.slice(0, MAX_LANES);
  const t0 = ms(run.createdAt);
  let t1 = ["completed", "failed", "cancelled", "dead"].includes(run.status) ? ms(run.updatedAt) : now;
  for (const l of all) for (const b of l.bars) if (b.to > t1) t1 = b.to;
  const span = Math.max(1, t1 - t0);
  const pct = (t) => `${(100 * Math.min(Math.max(t - t0, 0), span)) / span}%`;
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) =>
    h("span.wf-tick", { style: { left: `${100 * f}%` } }, "+" + millis(Math.round(span * f))));
  const body = shown.map((l) => {
    const gaps = (l.gaps || []).map((g) => h("span.wf-gap", { title: g.title,
      style: { left: pct(g.from), width: `calc(${pct(g.to)} - ${pct(g.from)})` } }));
    const track = h("div.wf-track", {}, gaps, l.bars.map((b, i) => h("span.wf-bar.wf-" + b.cls.split(" ").join(".wf-"), {
      testid: l.fan ? "wf-fan" : l.wait ? "wf-wait" : "wf-bar",
      "data-seq": l.seq, "data-index": i, "data-attempt": b.attempt ?? null, "data-status": b.status ?? (l.cp && l.cp.status) ?? null,
      "data-total": l.fan ? l.total : null, title: b.title,
      style: { left: pct(b.from), width: `max(3px, calc(${pct(b.to)} - ${pct(b.from)}))` } },
    l.fan ? FAN_ORDER.map((s) => l.counts[s] ? h("span.seg.s-" + s, { style: { width: `${(100 * l.counts[s]) / Math.max(l.total, 1)}%` } }) : null) : null)));
    const name = l.wait && l.wait.child ? [h("span.muted", {}, "child → "), runLink(l.wait.child, "wf-child-link"),
      h("span.muted", {}, l.label.slice(5))]
      : l.fan ? [h("strong", {}, l.label), " ", h("span.muted.small", { testid: "wf-fan-counts" },
        FAN_ORDER.filter((s) => l.counts[s]).map((s) => `${s} ${num(l.counts[s])}`).join(" · "))]
      : l.wait ? h("span.muted", {}, l.label) : l.label;
    return h("div.wf-lane" + (l.fan ? ".wf-fanlane" : ""), { testid: "wf-lane", "data-seq": l.seq ?? "open",
      onclick: (e) => { if (l.cp && !e.target.closest("a")) select(l.cp); } },
    h("div.wf-name", { title: l.fan ? `#${l.fan.firstSeq}–${l.fan.lastSeq}` : l.seq == null ? "" : `#${l.seq}` }, h("span.mono.muted", {}, l.seq == null ? "" : `${l.seq} `), name),
    track);
  });
  const more = all.length - shown.length;
  return h("div.wf", { testid: "waterfall", "data-lanes": all.length },
    h("div.wf-lane.wf-axis", {}, h("div.wf-name.muted.small", {}, when(run.createdAt).slice(11)), h("div.wf-track", {}, ticks)),
    body.length ? body : h("p.muted", {}, "No steps yet."),
    more > 0 ? h("p.muted.small", { testid: "wf-more" }, `${num(more)} more steps not drawn (the timeline below lists them all)`) : null,
    h("p.muted.small.wf-key", {}, h("span.wf-bar.wf-completed.key", {}), " step ", h("span.wf-bar.wf-failed.key", {}), " failed attempt ",
      h("span.wf-bar.wf-fan.key", {}), " fan (one band) ", h("span.wf-bar.wf-wait.key", {}), " wait"));
}
