// The workers panel: GET workers (GroupHealth[]), GET workers/directory (the workflows the
// live workers announce, with their disagreements) and GET queues (the flow-control queues:
// slots held, waiters, rate window, admitted/denied, why they turn steps away), refreshed
// every few seconds.
import { getJson } from "./api.js";
import { h, clear, ago, num } from "./dom.js";

const EVERY_MS = 5000;
const heads = (cols) => h("thead", {}, h("tr", {}, cols.map((c) => h("th", {}, c))));
const list = (k, xs) => (xs && xs.length ? k + ": " + xs.join(", ") : null);

export function workersPanel(root) {
  const body = h("div", { testid: "workers" }, h("p.muted", {}, "Loading workers…"));
  const stamp = h("span.muted.small", { testid: "workers-updated" });
  root.append(h("section.card", {}, h("div.head", {}, h("h2", {}, "Workers"), stamp), body));
  let timer = 0, closed = false;
  const ctl = new AbortController();

  async function load() {
    try {
      const [groups, dir, queues] = await Promise.all([getJson("workers", null, ctl.signal), getJson("workers/directory", null, ctl.signal),
        getJson("queues", null, ctl.signal)]);
      if (closed) return;
      stamp.textContent = "updated " + new Date().toLocaleTimeString();
      clear(body, !groups.length ? h("p.muted", { testid: "no-workers" }, "No worker groups (the transport reports no health).")
        : h("table.workers", {}, heads(["Group", "Kind", "From", "Queue depth", "Live workers", ""]), h("tbody", {}, groups.map(group))),
        flowQueues(queues), directory(dir));
    } catch (e) {
      if (e.name !== "AbortError") clear(body, h("p.err", {}, e.message));
    }
    if (!closed) timer = setTimeout(load, EVERY_MS);
  }

  function group(g) {
    const alert = g.depth > 0 && !g.liveWorkers.length;
    return [
      h("tr" + (alert ? ".alert" : ""), { testid: "worker-group", "data-group": g.group, "data-alert": String(alert) },
        h("td.mono", {}, g.group), h("td", {}, g.kind || "—"), h("td", {}, g.transport || "store"), h("td", {}, num(g.depth)),
        h("td", {}, num(g.liveWorkers.length)), h("td", {}, alert ? h("span.badge.s-failed", {}, "backlog, no workers") : null)),
      g.liveWorkers.length ? h("tr.sub", {}, h("td", { colspan: 6 }, h("table.inner", {},
        heads(["Instance", "Last beat", "Runtime", "SDK", "Concurrency", "In flight", "RSS", "CPU", "Throughput/min", "p95", "Serves"]),
        h("tbody", {}, g.liveWorkers.map(worker))))) : null,
    ];
  }

  function worker(w) {
    const s = w.status || {}, d = w.descriptor;
    const c = s.concurrency || {};
    const adj = s.lastAdjust ? ` · ${s.lastAdjust.reason} ${s.lastAdjust.from}→${s.lastAdjust.to}` : "";
    const conc = c.mode ? `${c.mode} ${c.limit ?? ""}` + (c.min != null ? ` (${c.min}–${c.max})` : "") + adj : "—";
    const rss = s.rssBytes != null ? `${(s.rssBytes / 1048576).toFixed(0)} MiB` + (s.rssPct != null ? ` (${Math.round(s.rssPct)}%)` : "") : "—";
    const serves = d ? [list("steps", d.steps), list("workflows", d.workflows), list("capabilities", d.capabilities)].filter(Boolean).join(" · ") : "";
    return h("tr", { testid: "worker-row", "data-instance": w.instanceId },
      h("td.mono", {}, w.instanceId), h("td", {}, ago(w.lastBeatAt)), h("td", {}, s.runtime || (d && d.runtime) || "—"),
      h("td", { testid: "worker-sdk" }, d ? `${d.sdk} ${d.sdkVersion}` : "—"), h("td", {}, conc),
      h("td", { testid: "worker-in-flight" }, s.inFlight != null ? `${s.inFlight} / ${c.limit ?? "—"}` : "—"), h("td", {}, rss),
      h("td", {}, s.cpuPct != null ? Math.round(s.cpuPct) + "%" : "—"),
      h("td", {}, s.throughputPerMin != null ? num(Math.round(s.throughputPerMin)) : "—"), h("td", {}, s.p95Ms != null ? Math.round(s.p95Ms) + " ms" : "—"),
      h("td.small", { testid: "worker-serves" }, serves || "—"));
  }

  // Flow-control queues. "In flight" and "Waiting" come from the admission backend (the whole
  // fleet when it is shared); "Admitted" and "Denied" are this engine's answers since it started.
  function flowQueues(qs) {
    if (!qs.length) return null;
    const limits = (q) => [q.concurrency != null ? `${q.concurrency} at once` : null,
      q.rate ? `${q.rate.limit} per ${q.rate.periodMs} ms` : null].filter(Boolean).join(", ") || "unbounded";
    const blocked = (q) => q.blocked === "concurrency" ? "every slot held" : q.blocked === "rate" ? "rate window used up" : null;
    return h("div", { testid: "flow-queues" }, h("h3", {}, "Flow-control queues"),
      h("table.workers", {}, heads(["Queue", "Limits", "Backend", "In flight", "Waiting", "This window", "Admitted", "Denied", "Blocked"]),
        h("tbody", {}, qs.map((q) => h("tr" + (q.blocked ? ".alert" : ""), { testid: "flow-queue", "data-queue": q.queue, "data-blocked": q.blocked || "" },
          h("td.mono", {}, q.queue), h("td", {}, limits(q)), h("td", {}, q.backend),
          h("td", { testid: "queue-in-flight" }, num(q.inFlight)), h("td", { testid: "queue-waiting" }, num(q.waiting)),
          h("td", {}, q.rate ? `${num(q.windowCount)} / ${num(q.rate.limit)}` : "—"),
          h("td", { testid: "queue-admitted" }, num(q.admitted)), h("td", { testid: "queue-denied" }, num(q.denied)),
          h("td", { testid: "queue-blocked" }, blocked(q) ? h("span.badge.s-failed", {}, blocked(q)) : "—"))))));
  }

  function directory(dir) {
    const routes = (rs) => rs.map((r) => (r.code || "*") + " → " + r.workflow).join(", ") || "none";
    return h("div", { testid: "workflow-directory" }, h("h3", {}, "Announced workflows"), h("p.muted", { testid: "directory-detail" }, dir.detail),
      dir.workflows.length ? h("table.workers", {}, heads(["Workflow", "Evidence", "Groups", "Workers", "onError"]),
        h("tbody", {}, dir.workflows.map((w) => h("tr" + (w.disagreements.length ? ".alert" : ""), { testid: "announced-workflow", "data-key": w.key },
          h("td.mono", {}, w.key), h("td", {}, w.evidence), h("td.mono", {}, w.groups.join(", ") || "—"),
          h("td", {}, num(w.instances.length)), h("td.mono", {}, w.onError.map(routes).join(" | ") || "—"))))) : null,
      dir.workflows.map((w) => w.disagreements.map((x) => h("p.err", { testid: "disagreement", "data-key": w.key },
        `${w.key}: the workers disagree on ${x.axis}: ${x.values.join(" | ")}`))));
  }

  load();
  return { dispose() { closed = true; clearTimeout(timer); ctl.abort(); } };
}
