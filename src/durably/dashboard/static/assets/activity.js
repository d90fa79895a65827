// The run list's chart: runs started / completed / failed per time bucket, counted by the
// store (runs/activity), for the list's filters (its status chips excepted: the series are
// statuses). Plain DOM bars positioned in percent; no chart library.
import { getJson } from "./api.js";
import { h, clear, num, when } from "./dom.js";

const SERIES = ["started", "completed", "failed"];
export const RANGES = [
  { key: "1h", label: "last hour", bucketMs: 60_000, buckets: 60 },
  { key: "24h", label: "last 24 hours", bucketMs: 1_800_000, buckets: 48 },
  { key: "7d", label: "last 7 days", bucketMs: 6 * 3_600_000, buckets: 28 },
  { key: "30d", label: "last 30 days", bucketMs: 86_400_000, buckets: 30 },
];

/** The chart card; `filters` are the list's API filters (URLSearchParams, no status). */
export function activityChart(filters, signal, initial = "24h") {
  let range = RANGES.find((r) => r.key === initial) || RANGES[1];
  const box = h("div.chart-body", { testid: "runs-chart-body" }, h("p.muted.small", {}, "Loading…"));
  const totals = h("span.muted.small", { testid: "runs-chart-totals" });
  const picker = h("select", { testid: "runs-chart-range", onchange: (e) => { range = RANGES.find((r) => r.key === e.target.value); load(); } },
    RANGES.map((r) => h("option", { value: r.key, selected: r === range }, r.label)));
  const card = h("section.card.chart", { testid: "runs-chart" },
    h("div.head", {}, h("h3", {}, "Runs over time"), picker, totals,
      h("span.legend", {}, SERIES.map((s) => h("span", {}, h("span.sw.c-" + s, {}), s)))),
    box);

  async function load() {
    const q = new URLSearchParams(filters);
    q.set("bucketMs", String(range.bucketMs));
    q.set("buckets", String(range.buckets));
    let body;
    try { body = await getJson("runs/activity", q, signal); } catch (e) {
      if (e.name !== "AbortError") clear(box, h("p.err.small", { testid: "runs-chart-error" }, e.message));
      return;
    }
    draw(body);
  }

  function draw(body) {
    const slot = 100 / body.buckets, bar = slot / 3;
    const max = Math.max(1, ...body.items.flatMap((i) => SERIES.map((s) => i[s])));
    const sum = Object.fromEntries(SERIES.map((s) => [s, body.items.reduce((n, i) => n + i[s], 0)]));
    totals.textContent = SERIES.map((s) => `${num(sum[s])} ${s}`).join(" · ");
    for (const s of SERIES) card.dataset[s] = String(sum[s]);
    const plot = h("div.plot", { role: "img", "aria-label": `runs per bucket, ${range.label}` });
    for (const item of body.items) {
      const index = Math.floor((item.startMs - body.sinceMs) / body.bucketMs);
      SERIES.forEach((s, k) => {
        if (!item[s]) return;
        plot.append(h("span.cbar.c-" + s, { testid: "chart-bar", "data-series": s, "data-start": item.startMs, "data-count": item[s],
          title: `${when(item.startMs)} · ${num(item[s])} ${s}`,
          style: { left: `${index * slot + k * bar}%`, width: `max(1px, calc(${bar}% - 1px))`, height: `max(1px, ${(100 * item[s]) / max}%)` } }));
      });
    }
    const axis = h("div.caxis.small.muted", {}, [0, 0.5, 1].map((f) =>
      h("span", {}, when(body.sinceMs + f * (body.untilMs - body.sinceMs)).slice(5, 16))));
    clear(box, h("div.cmax.small.muted", {}, `${num(max)} per bucket`), plot, axis,
      body.items.length ? null : h("p.muted.small", { testid: "runs-chart-empty" }, `No runs ${range.label}.`));
  }

  load();
  return { el: card, load };
}
