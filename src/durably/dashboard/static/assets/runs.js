// The run list: status/origin chips with whole-set counts (runs/facets), tag / workflow /
// namespace / attribute filters (pickers from runs/values), a chart of runs over time
// (activity.js), server-side paging.
import { getJson, toParams } from "./api.js";
import { h, clear, badge, when, ago, num, runLink } from "./dom.js";
import { navigate } from "./nav.js";
import { activityChart } from "./activity.js";

const STATUSES = ["pending", "running", "suspended", "cancelling", "blocked", "completed", "failed", "cancelled", "dead"];
const PAGE_SIZES = [25, 50, 100, 200];
const MULTI = ["status", "origin", "tag", "workflow", "namespace", "attr"];

function readFilters(params) {
  const f = {};
  for (const k of MULTI) f[k] = params.getAll(k);
  f.unattributed = params.get("unattributed") === "true";
  f.offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  f.limit = PAGE_SIZES.includes(+params.get("limit")) ? +params.get("limit") : 50;
  return f;
}

function hashOf(f) {
  const q = toParams({ ...Object.fromEntries(MULTI.map((k) => [k, f[k]])),
    unattributed: f.unattributed ? "true" : null, offset: f.offset || null, limit: f.limit !== 50 ? f.limit : null });
  const s = q.toString();
  return "#/runs" + (s ? "?" + s : "");
}

/** The run-list API's query filters of the list state. */
function apiFilters(f, { page = false, drop = [] } = {}) {
  const out = {};
  for (const k of MULTI) if (!drop.includes(k)) out[k] = f[k];
  if (!drop.includes("origin") && f.unattributed) out.unattributed = "true";
  if (page) { out.limit = f.limit + 1; out.offset = f.offset; }
  return toParams(out);
}

export function runList(root, params) {
  const f = readFilters(params);
  const ctl = new AbortController();
  const go = (patch) => { location.hash = hashOf({ ...f, offset: 0, ...patch }); };
  const toggle = (key, value) => {
    const list = f[key].includes(value) ? f[key].filter((v) => v !== value) : [...f[key], value];
    go({ [key]: list });
  };

  const statusChips = h("div.chips", { testid: "status-chips" });
  const originChips = h("div.chips", { testid: "origin-chips" });
  const active = h("div.chips.active", { testid: "active-filters" });
  const tbody = h("tbody", { testid: "run-rows" });
  const pager = h("div.pager", { testid: "pager" });
  const note = h("span.muted", { testid: "run-count" });

  // ---- pickers (values come from runs/values, scoped by the other filters)
  const lists = {};
  const datalist = (id) => (lists[id] = h("datalist", { id }));
  const field = (name, label, listId, testid) => h("label.pick", {}, label,
    h("input", { name, list: listId, placeholder: "any", testid, autocomplete: "off",
      onfocus: () => fillValues(name, listId) }));
  const form = h("form.filters", { testid: "filters", onsubmit: (e) => {
    e.preventDefault();
    const patch = {};
    for (const k of ["tag", "workflow", "namespace"]) {
      const v = form[k].value.trim();
      if (v && !f[k].includes(v)) patch[k] = [...f[k], v];
    }
    const key = form.attrKey.value.trim();
    if (key) patch.attr = [...f.attr, `${key}:${form.attrOp.value}:${form.attrValue.value}`];
    go(patch);
  } },
  field("tag", "Tag", "dl-tag", "filter-tag"), field("workflow", "Workflow", "dl-workflow", "filter-workflow"),
  field("namespace", "Namespace", "dl-namespace", "filter-namespace"),
  h("label.pick", {}, "Attribute",
    h("span.row", {},
      h("input", { name: "attrKey", list: "dl-attrKey", placeholder: "key", size: 10, testid: "filter-attr-key",
        autocomplete: "off", onfocus: () => fillValues("attributeKey", "dl-attrKey") }),
      h("select", { name: "attrOp", testid: "filter-attr-op" },
        ["eq", "ne", "gt", "gte", "lt", "lte"].map((o) => h("option", { value: o }, o))),
      h("input", { name: "attrValue", list: "dl-attrValue", placeholder: "value", size: 10, testid: "filter-attr-value",
        autocomplete: "off", onfocus: () => form.attrKey.value && fillValues("attr." + form.attrKey.value.trim(), "dl-attrValue") }))),
  h("button", { type: "submit", testid: "filter-apply" }, "Add filter"),
  ["dl-tag", "dl-workflow", "dl-namespace", "dl-attrKey", "dl-attrValue"].map(datalist));

  const loaded = {};
  async function fillValues(fieldName, listId) {
    const key = fieldName + "|" + listId;
    if (loaded[key]) return;
    loaded[key] = true;
    try {
      const q = apiFilters(f);
      q.set("field", fieldName);
      q.set("limit", "100");
      const rows = await getJson("runs/values", q, ctl.signal);
      clear(lists[listId], rows.filter((r) => r.value != null)
        .map((r) => h("option", { value: r.value }, `${r.value} (${num(r.count)})`)));
    } catch { loaded[key] = false; }
  }

  // runs over time for the same filters (the status chips excepted: its series are statuses)
  const chart = activityChart(apiFilters(f, { drop: ["status"] }), ctl.signal);
  root.append(
    h("section.card", {},
      h("div.head", {}, h("h2", {}, "Runs"), note,
        h("button", { testid: "refresh", onclick: () => { load(); facets(); chart.load(); } }, "Refresh")),
      h("div.chiprow", {}, h("span.lbl", {}, "Status"), statusChips),
      h("div.chiprow", {}, h("span.lbl", {}, "Origin"), originChips),
      form, active),
    chart.el,
    h("section.card", {},
      h("table.runs", { testid: "run-table" },
        h("thead", {}, h("tr", {}, ["Status", "Run", "Workflow", "Tags", "Origin", "Created", "Updated"].map((c) => h("th", {}, c)))),
        tbody), pager));

  // ---- active filters
  for (const k of ["tag", "workflow", "namespace", "attr"]) {
    for (const v of f[k]) {
      active.append(h("button.chip.on", { testid: "active-filter", "data-key": k, "data-value": v,
        title: "Remove filter", onclick: () => toggle(k, v) }, `${k}: ${v} ×`));
    }
  }

  // ---- whole-set counts: facets ignore status/origin, so each chip row cross-filters the other
  async function facets() {
    let rows;
    try { rows = await getJson("runs/facets", apiFilters(f, { drop: ["status", "origin"] }), ctl.signal); } catch { return; }
    const originOk = (o) => (!f.origin.length && !f.unattributed) || (o == null ? f.unattributed : f.origin.includes(o));
    const statusOk = (s) => !f.status.length || f.status.includes(s);
    const byStatus = {}, byOrigin = new Map();
    let total = 0;
    for (const r of rows) {
      if (originOk(r.origin)) byStatus[r.status] = (byStatus[r.status] || 0) + r.count;
      if (statusOk(r.status)) byOrigin.set(r.origin, (byOrigin.get(r.origin) || 0) + r.count);
      if (originOk(r.origin) && statusOk(r.status)) total += r.count;
    }
    clear(statusChips, STATUSES.filter((s) => byStatus[s] || f.status.includes(s)).map((s) =>
      h("button.chip.s-" + s + (f.status.includes(s) ? ".on" : ""), { testid: "status-chip", "data-status": s,
        "aria-pressed": String(f.status.includes(s)), onclick: () => toggle("status", s) },
      s, h("span.n", { testid: "chip-count" }, num(byStatus[s] || 0)))));
    if (!statusChips.children.length) statusChips.append(h("span.muted", {}, "no runs"));
    clear(originChips, [...byOrigin.entries()].sort((a, b) => b[1] - a[1]).map(([o, n]) => {
      const on = o == null ? f.unattributed : f.origin.includes(o);
      return h("button.chip" + (on ? ".on" : ""), { testid: "origin-chip", "data-origin": o ?? "", "aria-pressed": String(on),
        onclick: () => (o == null ? go({ unattributed: !f.unattributed }) : toggle("origin", o)) },
      o ?? "(unattributed)", h("span.n", { testid: "chip-count" }, num(n)));
    }));
    note.dataset.total = String(total);
    note.textContent = `${num(total)} matching run${total === 1 ? "" : "s"}`;
    renderPager(null, total);
  }

  let lastRows = 0;
  function renderPager(count, total) {
    if (count != null) lastRows = count;
    const first = lastRows ? f.offset + 1 : 0;
    const hasMore = lastRows > f.limit;
    const shown = Math.min(lastRows, f.limit);
    clear(pager,
      h("button", { testid: "pager-prev", disabled: f.offset === 0, onclick: () => go({ ...f, offset: Math.max(0, f.offset - f.limit) }) }, "‹ Prev"),
      h("span.muted", { testid: "pager-range" }, `${num(first)}–${num(f.offset + shown)}` + (total != null ? ` of ${num(total)}` : "")),
      h("button", { testid: "pager-next", disabled: !hasMore, onclick: () => go({ ...f, offset: f.offset + f.limit }) }, "Next ›"),
      h("label.muted", {}, " per page ", h("select", { testid: "page-size", onchange: (e) => go({ ...f, limit: +e.target.value }) },
        PAGE_SIZES.map((n) => h("option", { value: String(n), selected: n === f.limit }, String(n))))));
  }

  async function load() {
    let rows;
    try {
      rows = await getJson("runs", apiFilters(f, { page: true }), ctl.signal);
    } catch (e) {
      if (e.name !== "AbortError") clear(tbody, h("tr", {}, h("td.err", { colspan: 7 }, e.message)));
      return;
    }
    renderPager(rows.length, note.dataset.total ? +note.dataset.total : null);
    if (!rows.length) return clear(tbody, h("tr", {}, h("td.muted", { colspan: 7, testid: "no-runs" }, "No runs match.")));
    clear(tbody, rows.slice(0, f.limit).map((r) => h("tr", { testid: "run-row", "data-run-id": r.id, "data-status": r.status,
      onclick: (e) => { if (!e.target.closest("a,button")) navigate("runs/" + encodeURIComponent(r.id)); } },
    h("td", {}, badge(r.status, "run-status"), r.waiting ? h("div.muted.small", { testid: "run-waiting" }, `waits on ${r.waiting.on}: ${r.waiting.name}` + (r.waiting.detail ? ` — ${r.waiting.detail}` : "")) : null,
      // a blocked run says why (no worker serves its workflow, or none offers what a step requires)
      r.blockedReason ? h("div.muted.small", { testid: "run-reason", title: r.blockedReason.code || "" }, r.blockedReason.message) : null),
    h("td", {}, runLink(r.id)),
    h("td", {}, r.workflow, h("span.muted", {}, r.workflowVersion ? " v" + r.workflowVersion : "")),
    h("td", {}, (r.tags || []).slice(0, 6).map((t) => h("button.tag", { title: "Filter by tag", onclick: () => toggle("tag", t) }, t))),
    h("td", {}, r.origin || h("span.muted", {}, "—")),
    h("td", { title: when(r.createdAt) }, ago(r.createdAt)),
    h("td", { title: when(r.updatedAt) }, ago(r.updatedAt)))));
  }

  facets();
  load();
  return { dispose: () => ctl.abort() };
}
