// The workers panel: GET workers (GroupHealth[]), refreshed every few seconds.
import { getJson } from "./api.js";
import { h, clear, ago, num } from "./dom.js";

const EVERY_MS = 5000;

export function workersPanel(root) {
  const body = h("div", { testid: "workers" }, h("p.muted", {}, "Loading workers…"));
  const stamp = h("span.muted.small", { testid: "workers-updated" });
  root.append(h("section.card", {}, h("div.head", {}, h("h2", {}, "Workers"), stamp), body));
  let timer = 0, closed = false;
  const ctl = new AbortController();

  async function load() {
    try {
      const groups = await getJson("workers", null, ctl.signal);
      if (closed) return;
      stamp.textContent = "updated " + new Date().toLocaleTimeString();
      if (!groups.length) clear(body, h("p.muted", { testid: "no-workers" }, "No worker groups (the transport reports no health)."));
      else clear(body, h("table.workers", {}, h("thead", {}, h("tr", {}, ["Group", "Kind", "Queue depth", "Live workers", ""].map((c) => h("th", {}, c)))),
        h("tbody", {}, groups.map(group))));
    } catch (e) {
      if (e.name !== "AbortError") clear(body, h("p.err", {}, e.message));
    }
    if (!closed) timer = setTimeout(load, EVERY_MS);
  }

  function group(g) {
    const alert = g.depth > 0 && !g.liveWorkers.length;
    return [
      h("tr" + (alert ? ".alert" : ""), { testid: "worker-group", "data-group": g.group, "data-alert": String(alert) },
        h("td.mono", {}, g.group), h("td", {}, g.kind || "—"), h("td", {}, num(g.depth)),
        h("td", {}, num(g.liveWorkers.length)), h("td", {}, alert ? h("span.badge.s-failed", {}, "backlog, no workers") : null)),
      g.liveWorkers.length ? h("tr.sub", {}, h("td", { colspan: 5 }, h("table.inner", {},
        h("thead", {}, h("tr", {}, ["Instance", "Last beat", "Runtime", "Concurrency", "In flight", "RSS", "CPU", "Throughput/min", "p95"].map((c) => h("th", {}, c)))),
        h("tbody", {}, g.liveWorkers.map(worker))))) : null,
    ];
  }

  function worker(w) {
    const s = w.status || {};
    const c = s.concurrency || {};
    const conc = c.mode ? `${c.mode} ${c.limit ?? ""}` + (c.min != null ? ` (${c.min}–${c.max})` : "") : "—";
    const rss = s.rssBytes != null ? `${(s.rssBytes / 1048576).toFixed(0)} MiB` + (s.rssPct != null ? ` (${Math.round(s.rssPct)}%)` : "") : "—";
    return h("tr", { testid: "worker-row", "data-instance": w.instanceId },
      h("td.mono", {}, w.instanceId), h("td", {}, ago(w.lastBeatAt)), h("td", {}, s.runtime || "—"), h("td", {}, conc),
      h("td", {}, s.inFlight ?? "—"), h("td", {}, rss), h("td", {}, s.cpuPct != null ? Math.round(s.cpuPct) + "%" : "—"),
      h("td", {}, s.throughputPerMin != null ? num(Math.round(s.throughputPerMin)) : "—"), h("td", {}, s.p95Ms != null ? Math.round(s.p95Ms) + " ms" : "—"));
  }

  load();
  return { dispose() { closed = true; clearTimeout(timer); ctl.abort(); } };
}
