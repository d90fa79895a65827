// The schedules page: every schedule of the console's namespace — declared in code (static,
// shown read-only) or created at run time (persisted: pause, unpause and trigger, each after
// a confirm) — with its cadence, its next window starts and the runs it started lately.
import { getJson, post, state, enc } from "./api.js";
import { h, clear, badge, when, num, runLink, flash } from "./dom.js";
import { confirmAction } from "./confirm.js";

const REFRESH_MS = 5000;
const NEXT_SHOWN = 3;

export function schedulesPanel(root) {
  const body = h("div", { testid: "schedules" }, h("p.muted", {}, "Loading schedules…"));
  const count = h("span.muted", { testid: "schedules-count" });
  root.append(h("section.card", {},
    h("div.head", {}, h("h2", {}, "Schedules"), count),
    h("p.muted.small", {}, "Static schedules are declared in code and shown read-only; persisted ones were created at run time and can be paused, unpaused and triggered here."),
    body));
  const ctl = new AbortController();
  let timer = 0;

  function act(d, verb, title, text, withNote) {
    const s = d.schedule;
    confirmAction({
      title, text,
      json: withNote ? { note: "" } : undefined,
      run: (values) => post(`schedules/${enc(s.id)}/${verb}`, null, withNote ? noteOf(values.json) : undefined),
      done: (res) => {
        flash(verb === "trigger" ? `Started ${res && res.runId}` : `${title}: ${s.id}`);
        load();
      },
    });
  }
  const noteOf = (value) => {
    const note = value && typeof value.note === "string" ? value.note.trim() : "";
    return note ? { note } : {};
  };

  const mutating = (label, testid, onclick) =>
    h("button.ctl", { testid, "data-mutates": "", disabled: state.readOnly, onclick }, label);

  function controls(d) {
    const s = d.schedule;
    if (d.source !== "persisted") return h("span.muted.small", { testid: "schedule-read-only" }, "declared in code");
    return h("div.controls", {},
      s.paused
        ? mutating("Unpause", "schedule-unpause", () => act(d, "unpause", "Unpause schedule", `Fire “${s.id}” again from the current window on? The windows it was paused in are not started.`))
        : mutating("Pause", "schedule-pause", () => act(d, "pause", "Pause schedule", `Stop firing “${s.id}”? A run already started goes on. A note may say why.`, true)),
      mutating("Trigger", "schedule-trigger", () => act(d, "trigger", "Trigger schedule", `Start a run of “${s.id}” now, outside its timetable?`)));
  }

  function row(d) {
    const s = d.schedule;
    const next = s.paused ? h("span.muted", {}, "paused") : d.nextFires.length
      ? h("ul.plain", { testid: "schedule-next" }, d.nextFires.slice(0, NEXT_SHOWN).map((t) => h("li", {}, when(t))))
      : h("span.muted", {}, "—");
    const last = d.lastRunId
      ? [runLink(d.lastRunId, "schedule-last-run"), " ", d.lastRunStatus ? badge(d.lastRunStatus, "schedule-last-status") : null, h("div.muted.small", {}, when(d.lastFireAt))]
      : h("span.muted", {}, "none yet");
    const recent = d.recentRuns.length
      ? h("ul.plain", { testid: "schedule-recent" }, d.recentRuns.map((r) => h("li", {}, runLink(r.runId, "schedule-recent-run"), " ", badge(r.status))))
      : h("span.muted", {}, "—");
    return h("tr", { testid: "schedule-row", "data-schedule-id": s.id, "data-source": d.source, "data-paused": String(s.paused) },
      h("td.mono", { testid: "schedule-id" }, s.id),
      h("td", {}, h("a", { href: "#/runs?workflow=" + enc(s.workflow) }, s.workflow)),
      h("td", { testid: "schedule-cadence" }, cadence(s)),
      h("td", {}, h("span.tag", { testid: "schedule-source" }, d.source)),
      h("td", { testid: "schedule-state" }, s.paused ? "paused" : "active",
        d.note ? h("div.muted.small", { testid: "schedule-note" }, d.note) : null,
        d.lastError ? h("div.err.small", { testid: "schedule-error" }, d.lastError) : null),
      h("td", {}, next),
      h("td", {}, last),
      h("td", {}, recent),
      h("td", {}, controls(d)));
  }

  async function load() {
    clearTimeout(timer);
    let items;
    try { items = await getJson("schedules", null, ctl.signal); } catch (e) {
      if (e.name !== "AbortError") clear(body, h("p.err", { testid: "schedules-error" }, e.message));
      return;
    }
    count.textContent = `${num(items.length)} schedule(s)`;
    if (!items.length) clear(body, h("p.muted", { testid: "no-schedules" }, "No schedules."));
    else clear(body, h("table", {},
      h("thead", {}, h("tr", {}, ["Schedule", "Workflow", "Cadence", "Source", "State", "Next fires", "Last run", "Recent runs", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, items.map(row))));
    timer = setTimeout(load, REFRESH_MS);
  }

  load();
  return { dispose() { ctl.abort(); clearTimeout(timer); } };
}

function cadence(s) {
  if (s.cron) return h("span", {}, h("code", {}, s.cron), ` (${s.timezone || "UTC"})`);
  return "every " + span(s.everyMs);
}

function span(ms) {
  if (ms == null) return "—";
  const units = [["d", 86_400_000], ["h", 3_600_000], ["m", 60_000], ["s", 1000]];
  for (const [unit, size] of units) if (ms % size === 0) return `${num(ms / size)}${unit}`;
  return `${num(ms)} ms`;
}
