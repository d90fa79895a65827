// The run detail: header, relations (parent / children / onError handlers), controls, the
// waterfall (waterfall.js), the timeline with every wide fan as ONE node (expanding into
// paged members), the step detail
// and live updates over server-sent events (refetching with If-None-Match).
// Each row's `row` (from the server) says what it stands for: its kind in words, its real
// duration, and whether the engine wrote it for itself (hidden unless asked for).
import { get, getJson, post, remove, url, enc, state, onReadOnly } from "./api.js";
import { h, clear, badge, when, duration, millis, num, json, jsonBlock, errorBlock, runLink, flash } from "./dom.js";
import { confirmAction } from "./confirm.js";
import { waterfall } from "./waterfall.js";

const SUMMARIZE_OVER = 50;
const MEMBER_PAGE = 50;
const REFRESH_MS = 1000;
const TERMINAL = ["completed", "failed", "cancelled", "dead"];
const FAN_ORDER = ["completed", "failed", "running", "pending"];
const CHILD = "signal:child:";
// A fork is tagged `forked-from:<original>@<step>` and `forked-from:<original>`.
const FORKED = "forked-from:";
const FORK_LIMIT = 50;

export function runDetail(root, runId) {
  const path = "runs/" + enc(runId);
  const view = { etag: null, detail: null, selected: null, fans: new Map(), events: [], closed: false, engineRows: false, forks: [] };
  const top = h("section.card", { testid: "run-header" }, h("p.muted", {}, "Loading run…"));
  const controls = h("div.controls", { testid: "controls" });
  const relations = h("section.card", { testid: "relations", hidden: true });
  const wfBox = h("div", { testid: "waterfall-box" });
  const timeline = h("tbody", { testid: "timeline" });
  const stepPane = h("aside.card.step", { testid: "step-detail", hidden: true });
  const eventsList = h("ol.events", { testid: "event-log" });
  const live = h("span.live", { testid: "live-indicator", "data-state": "connecting" }, "connecting");
  const engineCount = h("span.muted", { testid: "engine-row-count" });
  const engineToggle = h("label.small.toggle", { title: "Rows the engine writes for itself, e.g. the deadline of a wait with a timeout" },
    h("input", { type: "checkbox", testid: "engine-rows-toggle",
      onchange: (e) => { view.engineRows = e.target.checked; if (view.detail) render(); } }),
    " show engine rows ", engineCount);
  root.append(top, relations,
    h("section.card", {}, h("details", { open: true, testid: "waterfall-panel" }, h("summary", {}, h("strong", {}, "Waterfall")), wfBox)),
    h("div.split", {},
      h("section.card.grow", {},
        h("div.head", {}, h("h3", {}, "Timeline"), engineToggle, live),
        h("table.timeline", {}, h("thead", {}, h("tr", {}, ["#", "Step", "Kind", "Status", "Attempts", "Duration", "Started"].map((c) => h("th", {}, c)))), timeline)),
      stepPane),
    h("section.card", {}, h("details", { testid: "events-panel" }, h("summary", {}, "Live events & setEvent values"),
      eventLookup(), eventsList)));

  // ------------------------------------------------------------------ loading
  async function load() {
    let res;
    try {
      res = await get(path, { summarizeFansOver: SUMMARIZE_OVER }, view.etag);
    } catch (e) {
      if (!view.detail) clear(top, h("h2", {}, "Run ", h("code", {}, runId)), h("p.err", { testid: "load-error" }, e.message),
        h("a", { href: "#/runs" }, "← Runs"));
      return;
    }
    const shown = res.status === 304 ? view.detail : res.body;
    const forks = shown && TERMINAL.includes(shown.run.status) ? await loadForks() : view.forks;
    if (view.closed) return;
    const forksChanged = forks.join("\n") !== view.forks.join("\n");
    view.forks = forks;
    if (res.status === 304) {
      if (forksChanged && view.detail) renderRelations(view.detail.run, view.detail.timeline, view.detail.children || [], view.detail.childCount);
      return;
    }
    view.etag = res.etag;
    view.detail = res.body;
    render();
  }

  // The runs forked from this one. Only a settled run is forked, and a settled run's detail
  // never changes (it answers 304), so they are read on their own, by the link tag every
  // fork carries, each time the page loads it.
  async function loadForks() {
    try {
      const rows = await getJson("runs", { tag: FORKED + runId, limit: FORK_LIMIT });
      return rows.map((r) => r.id);
    } catch {
      return view.forks;
    }
  }

  let timer = 0, last = 0;
  function refreshSoon() {
    if (timer) return;
    const wait = Math.max(0, REFRESH_MS - (Date.now() - last));
    timer = setTimeout(async () => {
      last = Date.now();
      await load();
      for (const fan of view.fans.values()) if (fan.open) fan.load();
      timer = 0;
    }, wait);
  }

  let source = null;
  function connect() {
    if (typeof EventSource === "undefined") return;
    source = new EventSource(url(path + "/stream"), { withCredentials: true });
    source.onopen = () => { live.dataset.state = "live"; live.textContent = "live"; };
    source.onerror = () => { live.dataset.state = "reconnecting"; live.textContent = "reconnecting"; };
    source.onmessage = (m) => {
      let ev;
      try { ev = JSON.parse(m.data); } catch { return; }
      view.events.unshift(ev);
      if (view.events.length > 200) view.events.pop();
      eventsList.prepend(h("li", { testid: "event-row" }, h("code", {}, when(ev.at)), " ", h("strong", {}, ev.type),
        ev.seq != null ? ` #${ev.seq}` : "", ev.name ? ` ${ev.name}` : "", ev.error ? h("span.err", {}, " " + (ev.error.message || "")) : ""));
      while (eventsList.children.length > 200) eventsList.lastChild.remove();
      refreshSoon();
    };
  }

  // ------------------------------------------------------------------ rendering
  function render() {
    const { run, timeline: rows, children = [], fans = [], childCount } = view.detail;
    document.title = `${run.id} · durably`;
    renderHeader(run);
    renderRelations(run, rows, children, childCount);
    renderTimeline(rows, fans);
    // a picture that cannot be drawn says so; it must not stop the page's live updates
    try { clear(wfBox, waterfall(view.detail, (cp) => select(cp, null))); }
    catch (e) { clear(wfBox, h("p.err.small", { testid: "waterfall-error" }, `The waterfall could not be drawn: ${e.message}`)); }
    if (view.selected) {
      const s = view.selected;
      const fresh = rows.find((cp) => cp.seq === s.seq) || s;
      showStep(fresh);
    }
  }

  function renderHeader(run) {
    clear(top,
      h("div.head", {}, h("a.muted", { href: "#/runs" }, "← Runs"),
        h("h2", {}, h("code", { testid: "run-id" }, run.id)), badge(run.status, "status-badge")),
      h("dl.meta", {},
        meta("Workflow", `${run.workflow}${run.workflowVersion ? " v" + run.workflowVersion : ""}`, "run-workflow"),
        meta("Namespace", run.namespace), meta("Origin", run.origin),
        meta("Created", when(run.createdAt)), meta("Updated", when(run.updatedAt)),
        meta("Elapsed", duration(run.createdAt, TERMINAL.includes(run.status) ? run.updatedAt : Date.now())),
        run.wakeAt ? meta("Wakes", when(run.wakeAt)) : null,
        run.priority != null ? meta("Priority", run.priority) : null,
        run.recoveryAttempts ? meta("Recoveries", run.recoveryAttempts) : null,
        run.tags && run.tags.length ? meta("Tags", run.tags.map(tagView)) : null,
        run.searchAttributes ? meta("Attributes", Object.entries(run.searchAttributes).map(([k, v]) =>
          h("a.tag", { href: "#/runs?attr=" + enc(`${k}:eq:${v}`) }, `${k}=${v}`))) : null),
      errorBlock(run.error, "run-error"),
      h("div.io", {}, jsonBlock("input", run.input, "run-input"), run.output !== undefined ? jsonBlock("output", run.output, "run-output") : null),
      controls);
    renderControls(run);
  }

  const meta = (k, v, testid) => (v == null || v === "" ? null : [h("dt", {}, k), h("dd", { testid }, v)]);
  function tagView(t) {
    if (t.startsWith("durable:parent:")) return h("a.tag", { href: "#/runs/" + enc(t.slice(15)), testid: "parent-tag" }, t);
    return h("a.tag", { href: "#/runs?tag=" + enc(t) }, t);
  }

  function renderRelations(run, rows, children, childCount) {
    const parents = (run.tags || []).filter((t) => t.startsWith("durable:parent:")).map((t) => t.slice(15));
    const handlerOf = /^(.*)\.onError\.\d+$/.exec(run.id);
    const handlers = [];
    for (const cp of rows) {
      const id = cp.name.startsWith(CHILD) ? cp.name.slice(CHILD.length) : cp.name.startsWith("handoff:retired:") ? cp.name.slice(16) : null;
      if (id && /\.onError\.\d+$/.test(id) && !handlers.includes(id)) handlers.push(id);
    }
    const kids = children.filter((c) => !handlers.includes(c));
    const parts = [];
    if (handlerOf && !parents.includes(handlerOf[1])) parts.push(rel("onError handler of", [handlerOf[1]], "rel-handled"));
    // Dead letters: the handler's id is `dlq:<deadRunId>`; the dead run's error names it.
    if (run.id.startsWith("dlq:")) parts.push(rel("Dead-letter handler of", [run.id.slice(4)], "rel-dead-run"));
    const dlq = run.error && run.error.details && run.error.details.deadLetterRun;
    if (typeof dlq === "string") parts.push(rel("Dead-letter run", [dlq], "rel-dead-letter"));
    const origin = forkOrigin(run.tags || []);
    if (origin) parts.push(rel("Forked from", [origin.runId], "rel-forked-from", h("span.muted", { testid: "fork-step" }, ` at step #${origin.seq}`)));
    if (view.forks.length) {
      const more = view.forks.length >= FORK_LIMIT ? h("a.muted", { href: "#/runs?tag=" + enc(FORKED + run.id) }, " (all forks)") : null;
      parts.push(rel(`Forks (${num(view.forks.length)}${more ? "+" : ""})`, view.forks, "rel-fork", more));
    }
    if (parents.length) parts.push(rel("Parent", parents, "rel-parent"));
    if (handlers.length) parts.push(rel("onError handlers", handlers, "rel-handler"));
    if (kids.length) {
      const more = childCount != null && childCount > children.length ? h("span.muted", {}, ` (${num(childCount)} in all; fan members below)`) : null;
      parts.push(rel(`Children (${num(childCount ?? kids.length)})`, kids.slice(0, 200), "rel-child", more));
    }
    relations.hidden = !parts.length;
    clear(relations, parts);
  }
  // The original a fork was made from, and the step: the `@<step>` link whose run id is also
  // tagged on its own (a run id may itself contain "@"); a lone `@<step>` link otherwise.
  function forkOrigin(tags) {
    const links = tags.filter((t) => t.startsWith(FORKED)).map((t) => t.slice(FORKED.length));
    let lone = null;
    for (const link of links) {
      const at = link.lastIndexOf("@");
      if (at <= 0 || !/^\d+$/.test(link.slice(at + 1))) continue;
      const found = { runId: link.slice(0, at), seq: Number(link.slice(at + 1)) };
      if (links.includes(found.runId)) return found;
      lone = lone || found;
    }
    return lone;
  }
  const rel = (label, ids, testid, extra) => h("div.rel", {}, h("span.lbl", {}, label),
    h("span.ids", {}, ids.map((id) => runLink(id, testid))), extra);

  // ---- timeline rows and fan nodes, merged in seq order
  function renderTimeline(rows, fans) {
    // An engine row folds into the row it belongs to (a wait shows its timeout) unless asked
    // for; one whose owner has no row yet (a wait still open, or one that timed out) stays:
    // it is the only trace of that wait.
    const seqs = new Set(rows.map((cp) => cp.seq));
    const engine = rows.filter((cp) => cp.row && cp.row.engine);
    const folded = engine.filter((cp) => cp.row.owner != null && seqs.has(cp.row.owner));
    engineCount.textContent = `(${num(engine.length)})`;
    const hidden = new Set(view.engineRows ? [] : folded.map((cp) => cp.seq));
    const shown = rows.filter((cp) => !hidden.has(cp.seq));
    const items = shown.map((cp) => ({ seq: cp.seq, cp })).concat(fans.map((f) => ({ seq: f.firstSeq, fan: f })));
    items.sort((a, b) => a.seq - b.seq || (a.fan ? -1 : 1));
    const seen = new Set();
    const out = [];
    for (const it of items) {
      if (it.cp) { out.push(stepRow(it.cp)); continue; }
      seen.add(it.fan.group);
      let node = view.fans.get(it.fan.group);
      if (!node) view.fans.set(it.fan.group, (node = fanNode(it.fan)));
      else node.update(it.fan);
      out.push(node.row, node.body);
    }
    for (const g of [...view.fans.keys()]) if (!seen.has(g)) view.fans.delete(g);
    if (!out.length) out.push(h("tr", {}, h("td.muted", { colspan: 7 }, "No steps yet.")));
    clear(timeline, out);
  }

  function stepRow(cp, testid = "timeline-row") {
    const child = cp.name.startsWith(CHILD) ? cp.name.slice(CHILD.length) : null;
    const failed = cp.status === "failed" || (child && cp.output && cp.output.ok === false);
    const row = cp.row || {};
    const tr = h("tr.step" + (row.engine ? ".engine" : "") + (view.selected && view.selected.seq === cp.seq ? ".sel" : ""),
      { testid, "data-seq": cp.seq, "data-status": cp.status, "data-kind": row.kind || cp.kind, "data-engine": row.engine ? "1" : null,
        onclick: (e) => { if (!e.target.closest("a")) select(cp, tr); } },
      h("td.mono", {}, cp.seq),
      h("td", {}, row.engine ? h("span.muted", {}, "↳ ") : null,
        child ? [h("span.muted", {}, /\.onError\.\d+$/.test(child) ? "onError → " : "child → "), runLink(child, "child-link")]
        : cp.name.startsWith("fan:") ? [cp.name, h("span.muted", {}, ` (${num(cp.output && cp.output.count)} folded)`)] : cp.name,
      failed && cp.status !== "failed" ? h("span.badge.s-failed", {}, "child failed") : null),
      h("td.muted", { testid: "step-kind" }, row.label || cp.kind || "",
        row.timeoutMs != null ? h("span.small", { testid: "step-timeout" }, ` · timeout ${millis(row.timeoutMs)}`) : null),
      h("td", {}, row.state ? h("span.badge.s-" + row.state, { testid: "step-status", "data-status": row.state }, row.state.replace("_", " "))
        : badge(cp.status, "step-status")),
      h("td", {}, cp.attempts ?? ""), h("td", { testid: "step-duration", title: durationNote(cp) }, rowDuration(cp)),
      h("td", { title: when(cp.startedAt) }, when(cp.startedAt).slice(11)));
    return tr;
  }

  // The duration the server read from the row; none where the store does not keep it.
  function rowDuration(cp) {
    const row = cp.row;
    if (!row) return duration(cp.startedAt, cp.finishedAt);
    if (row.durationMs != null) return millis(row.durationMs);
    return cp.status === "pending" || cp.status === "running" ? "…" : "—";
  }
  function durationNote(cp) {
    const row = cp.row || {};
    if (row.dueAt) return `scheduled ${when(cp.startedAt)}, due ${when(row.dueAt)}`;
    if (row.durationMs == null && cp.status === "completed") return "the store records when this arrived, not when the wait began";
    return "";
  }

  function select(cp, tr) {
    for (const el of root.querySelectorAll("tr.sel")) el.classList.remove("sel");
    if (tr) tr.classList.add("sel");
    view.selected = cp;
    showStep(cp);
  }

  function showStep(cp) {
    stepPane.hidden = false;
    const evs = view.events.filter((e) => e.seq === cp.seq);
    clear(stepPane,
      h("div.head", {}, h("h3", {}, `#${cp.seq} ${cp.name}`),
        h("button.link", { testid: "step-close", onclick: () => { stepPane.hidden = true; view.selected = null; } }, "close")),
      badge(cp.status, "step-detail-status"),
      h("dl.meta", {}, meta("Kind", cp.row ? cp.row.label : cp.kind, "step-detail-kind"), meta("Stored kind", cp.kind),
        cp.row && cp.row.engine ? meta("Written by", "the engine" + (cp.row.owner != null ? ` (for #${cp.row.owner})` : "")) : null,
        meta("Step id", cp.stepId), meta("Attempts", cp.attempts), meta("Worker group", cp.workerGroup),
        meta("Group", cp.parallelGroup), meta("Enqueued", when(cp.enqueuedAt)), meta("Started", when(cp.startedAt)),
        meta("Finished", when(cp.finishedAt)), cp.row && cp.row.dueAt ? meta("Due", when(cp.row.dueAt)) : null,
        cp.row && cp.row.timeoutMs != null ? meta("Timeout", millis(cp.row.timeoutMs)) : null,
        meta("Duration", rowDuration(cp))),
      forkButton(cp),
      errorBlock(cp.error, "step-error"),
      attemptList(cp),
      cp.output && cp.output.ok === false ? errorBlock({ message: cp.output.error, code: cp.output.code, details: cp.output.details }, "child-error") : null,
      jsonBlock("input", cp.input, "step-input"),
      jsonBlock("output", cp.output, "step-output"),
      h("div.kv", {}, h("h4", {}, "events"), evs.length
        ? h("ol.events", { testid: "step-events" }, evs.map((e) => h("li", {}, h("code", {}, when(e.at)), " ", e.type,
          e.attempt ? ` (attempt ${e.attempt})` : "", e.durationMs != null ? ` ${Math.round(e.durationMs)} ms` : "",
          e.error ? h("span.err", {}, " " + e.error.message) : "")))
        : h("p.muted.small", { testid: "step-events" }, "No live events for this step since the page opened.")));
  }

  // "Fork from here": a new run reusing the steps before this one (a settled run only; the
  // original is not changed). The server refuses what it cannot fork; the button only hides.
  function forkButton(cp) {
    const run = view.detail && view.detail.run;
    if (!run || !TERMINAL.includes(run.status) || cp.seq == null) return null;
    return h("button.ctl", { testid: "step-fork", "data-mutates": "", disabled: state.readOnly,
      title: state.readOnly ? "read-only console" : `steps before #${cp.seq} are reused, not run again`,
      onclick: () => confirmAction({ title: "Fork from here",
        text: `Start a new run that reuses the results of steps #0–#${cp.seq - 1} and executes from #${cp.seq} with the code deployed now. Its input:`,
        json: run.input,
        run: ({ json: input }) => post(path + "/fork", null, { fromSeq: cp.seq, input }),
        done: (res) => { flash(`Forked from #${cp.seq} → new run ${res.runId}`); location.hash = "#/runs/" + enc(res.runId); } }) },
      "Fork from here");
  }

  // every failed attempt, oldest first; a long history keeps the first 5 and the last ones
  function attemptList(cp) {
    const list = cp.attemptErrors || [], gap = cp.attemptErrorsOmitted;
    if (!list.length) return null;
    return h("div.kv", {}, h("h4", {}, "failed attempts"), h("ol.events", { testid: "step-attempts" }, list.map((e, i) => [
      gap && i === 5 ? h("li.muted", {}, `… ${num(gap)} more not kept`) : null,
      h("li", { testid: "step-attempt", "data-attempt": e.attempt }, h("code", {}, `#${e.attempt} ${when(e.at)}`), " ",
        e.code ? h("code.code", {}, e.code) : null, h("span.err", {}, " " + e.message))])));
  }

  // ---- a fan node: one row, expanding into paged members
  function fanNode(fan) {
    const node = { fan, open: false, failedOnly: false, offset: 0, etag: null, page: null };
    node.row = h("tr.fan", { testid: "fan-node", "data-group": fan.group });
    node.body = h("tr.fanbody", { hidden: true, testid: "fan-members", "data-group": fan.group });
    node.update = (f) => { node.fan = f; drawHead(); };

    function drawHead() {
      const f = node.fan;
      const total = f.total ?? f.size;
      const counts = f.counts || {};
      const done = (counts.completed || 0) + (counts.failed || 0);
      const bar = h("div.bar", { testid: "fan-progress", title: `${num(done)} / ${num(total)} settled` },
        FAN_ORDER.map((s) => counts[s] ? h("span.seg.s-" + s, { style: { width: `${(100 * counts[s]) / Math.max(total, 1)}%` } }) : null));
      clear(node.row, h("td.mono", {}, `${f.firstSeq}–${f.lastSeq}`),
        h("td", { colspan: 6 },
          h("div.fanhead", {},
            h("button.expand", { testid: "fan-expand", "aria-expanded": String(node.open), onclick: toggle }, node.open ? "▾" : "▸"),
            h("strong", { testid: "fan-label" }, f.label), h("span.muted", {}, ` fan of ${num(total)}`),
            f.failFast ? h("span.badge", {}, "fail-fast") : null,
            h("span.counts", { testid: "fan-counts" }, Object.entries(counts).map(([s, n]) =>
              h("span.badge.s-" + s, { "data-status": s, testid: "fan-count" }, `${s} ${num(n)}`)),
            f.notStarted ? h("span.badge", { testid: "fan-count", "data-status": "notStarted" }, `not started ${num(f.notStarted)}`) : null),
            h("span.muted.small", {}, f.finishedAt ? duration(f.startedAt, f.finishedAt) : "in flight")),
          bar,
          f.failures && f.failures.length ? h("div.failures", { testid: "fan-failures" }, h("span.lbl", {}, "First failures"),
            f.failures.slice(0, 5).map((cp) => h("button.failure", { testid: "fan-failure", "data-seq": cp.seq,
              onclick: () => select(cp, null) }, `#${cp.seq} `, cp.error ? (cp.error.code ? `[${cp.error.code}] ` : "") + (cp.error.message || "") : cp.name)),
            f.failures.length > 5 ? h("span.muted", {}, ` +${f.failures.length - 5} more`) : null) : null));
    }

    function toggle() {
      node.open = !node.open;
      node.body.hidden = !node.open;
      drawHead();
      if (node.open) { drawBody(); node.load(); }
    }

    const failedSwitch = h("input", { type: "checkbox", testid: "fan-failed-only",
      onchange: (e) => { node.failedOnly = e.target.checked; node.offset = 0; node.etag = null; node.load(); } });
    const list = h("tbody", { testid: "fan-member-rows" });
    const range = h("span.muted", { testid: "fan-range" });
    const prev = h("button", { testid: "fan-prev", onclick: () => { node.offset = Math.max(0, node.offset - MEMBER_PAGE); node.etag = null; node.load(); } }, "‹ Prev");
    const next = h("button", { testid: "fan-next", onclick: () => { node.offset += MEMBER_PAGE; node.etag = null; node.load(); } }, "Next ›");
    function drawBody() {
      if (node.body.firstChild) return;
      node.body.append(h("td", { colspan: 7 }, h("div.members", {},
        h("div.pager", {}, h("label", {}, failedSwitch, " failed only"), prev, range, next),
        h("table.timeline.inner", {}, list))));
    }

    node.load = async () => {
      let res;
      try {
        res = await get(`${path}/fans/${enc(node.fan.group)}`,
          { offset: node.offset, limit: MEMBER_PAGE, failedOnly: node.failedOnly ? "true" : null }, node.etag);
      } catch (e) { clear(list, h("tr", {}, h("td.err", { colspan: 7 }, e.message))); return; }
      if (res.status === 304) return;
      node.etag = res.etag;
      const { items, total } = res.body;
      if (!items.length && total && node.offset >= total) { node.offset = Math.max(0, total - MEMBER_PAGE); node.etag = null; return node.load(); }
      range.textContent = total ? `${num(node.offset + 1)}–${num(node.offset + items.length)} of ${num(total)}` : "no members";
      range.dataset.total = String(total);
      prev.disabled = node.offset === 0;
      next.disabled = node.offset + items.length >= total;
      clear(list, items.length ? items.map((cp) => stepRow(cp, "fan-member-row")) : h("tr", {}, h("td.muted", { colspan: 7 }, node.failedOnly ? "No failed members." : "No members yet.")));
    };

    drawHead();
    return node;
  }

  // ---- controls
  function renderControls(run) {
    const st = run.status;
    const active = !TERMINAL.includes(st);
    const waiting = (view.detail.timeline || []).some((cp) => cp.status === "pending" && cp.name.startsWith("breakpoint"));
    const defs = [
      ["cancel", "Cancel", active, "Cancel this run? Running steps finish; no compensations run.", () => post(path + "/cancel")],
      ["cancel-compensate", "Cancel + compensate", active, "Cancel this run and run its compensations (saga unwind)?", () => post(path + "/cancel", { compensate: "true" })],
      ["retry", "Retry", st === "failed" || st === "dead" || st === "cancelled", "Retry this run from its last checkpoint?", () => post(path + "/retry")],
      ["retry-input", "Retry with new input…", TERMINAL.includes(st), "Start a new run of this workflow with the input below:", retryWithInput, { json: run.input }],
      ["continue", "Continue", waiting || st === "suspended", "Release the run's breakpoint?", () => post(path + "/continue")],
      ["redispatch", "Redispatch", active, "Re-send this run's dispatched but unsettled steps?", () => post(path + "/redispatch")],
      ["signal", "Signal…", active, "Deliver a signal (webhook token and JSON payload):", signal, { json: null, token: true }],
      ["delete", "Delete…", !active, "Delete this run, its checkpoints and its child runs? This cannot be undone.", () => remove(path)],
    ];
    clear(controls, defs.map(([id, label, ok, text, act, extra]) => {
      const b = h("button.ctl" + (id === "delete" ? ".danger" : ""), { testid: "control-" + id, "data-mutates": "", "data-off": ok ? "0" : "1",
        disabled: state.readOnly || !ok, title: state.readOnly ? "read-only console" : "",
        onclick: () => confirmAction({ title: label.replace("…", ""), text, ...extra, run: act, done: (res) => {
          const other = res && res.runId && res.runId !== runId ? res.runId : null;
          if (id === "delete") {
            flash(`Deleted ${runId}` + (res && res.deleted > 1 ? ` and ${num(res.deleted - 1)} child run(s)` : ""));
            view.closed = true;
            if (source) source.close();
            location.hash = "#/runs";
            return;
          }
          flash(`${label.replace("…", "")}: done` + (other ? ` → new run ${other}` : res && res.status ? ` (${res.status})` : ""));
          if (other) location.hash = "#/runs/" + enc(other);
          else { view.etag = null; refreshSoon(); }
        } }) }, label);
      return b;
    }), state.readOnly ? h("span.muted.small", { testid: "controls-read-only" }, "read-only: controls are disabled") : null);
  }
  function retryWithInput({ json: input }) { return post(path + "/retry-with-input", null, { input }); }
  function signal({ json: payload, token }) {
    if (!token) throw new Error("A webhook token is required.");
    return post("webhooks/" + enc(token), null, payload === undefined ? null : payload);
  }
  onReadOnly(() => { if (view.detail && !view.closed) renderControls(view.detail.run); });

  // ---- setEvent lookup (runs/<id>/events/<key>)
  function eventLookup() {
    const out = h("pre.json", { testid: "event-value", hidden: true });
    const input = h("input", { placeholder: "event key", testid: "event-key" });
    return h("form.row", { onsubmit: async (e) => {
      e.preventDefault();
      out.hidden = false;
      try { out.textContent = json(await getJson(`${path}/events/${enc(input.value)}`)); } catch (err) { out.textContent = err.message; }
    } }, input, h("button", { testid: "event-read" }, "Read setEvent value"), out);
  }

  load().then(connect);
  return {
    dispose() {
      view.closed = true;
      clearTimeout(timer);
      if (source) source.close();
    },
  };
}
