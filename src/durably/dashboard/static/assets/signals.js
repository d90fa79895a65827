// The buffered-signals panel: signals sent before any run waited on their token, held by the
// engine until a run takes them or they expire. Token, size and times only (never a payload);
// operators purge one token, a prefix, the expired ones, or everything, each after a confirm.
import { getJson, post, state } from "./api.js";
import { h, clear, when, num, flash } from "./dom.js";
import { confirmAction } from "./confirm.js";

const PAGE = 50;

export function signalsPanel(root, params) {
  let offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  let prefix = params.get("prefix") || "";
  const body = h("div", { testid: "signals" }, h("p.muted", {}, "Loading buffered signals…"));
  const count = h("span.muted", { testid: "signals-count" });
  const input = h("input", { testid: "signals-prefix", placeholder: "token prefix", value: prefix, autocomplete: "off" });
  const mutating = (label, testid, act) =>
    h("button", { testid, "data-mutates": "", disabled: state.readOnly, onclick: act }, label);
  root.append(h("section.card", {},
    h("div.head", {}, h("h2", {}, "Buffered signals"), count),
    h("p.muted.small", {}, "Signals that arrived before a run waited on their token. A run that waits on the token takes the oldest; the rest expire."),
    h("form.row", { onsubmit: (e) => { e.preventDefault(); prefix = input.value.trim(); offset = 0; load(); } },
      input, h("button", { testid: "signals-filter" }, "Filter"),
      mutating("Purge expired", "signals-purge-expired", () => purge({ expiredOnly: true }, "every expired buffered signal")),
      mutating("Purge all", "signals-purge-all", () => prefix
        ? purge({ prefix }, `every buffered signal whose token starts with “${prefix}”`)
        : purge({ all: true }, "every buffered signal"))),
    body));
  const ctl = new AbortController();

  function purge(choice, what) {
    confirmAction({
      title: "Purge buffered signals",
      text: `Delete ${what}? A run that later waits on such a token will not find it.`,
      run: () => post("signals/buffered/purge", null, choice),
      done: (res) => { flash(`Purged ${num(res && res.purged)} buffered signal(s)`); load(); },
    });
  }

  async function load() {
    const q = { limit: PAGE, offset };
    if (prefix) q.prefix = prefix;
    let page;
    try { page = await getJson("signals/buffered", q, ctl.signal); } catch (e) {
      if (e.name !== "AbortError") clear(body, h("p.err", {}, e.message));
      return;
    }
    count.textContent = `${num(page.total)} buffered`;
    count.dataset.total = String(page.total);
    if (!page.items.length) { clear(body, h("p.muted", { testid: "no-signals" }, "No buffered signals.")); return; }
    clear(body, h("table", {},
      h("thead", {}, h("tr", {}, ["Token", "Size", "Buffered", "Expires", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, page.items.map((s) => h("tr", { testid: "signal-row", "data-token": s.token },
        h("td.mono", {}, s.token), h("td", {}, `${num(s.sizeBytes)} B`), h("td", {}, when(s.bufferedAt)),
        h("td", {}, s.expiresAt ? when(s.expiresAt) : "never (engine record)"),
        h("td", {}, mutating("Purge", "signal-purge", () => purge({ token: s.token }, `the signal(s) buffered for “${s.token}”`)))))),
      h("div.pager", {},
        h("button", { testid: "signals-prev", disabled: offset === 0, onclick: () => { offset = Math.max(0, offset - PAGE); load(); } }, "‹ Prev"),
        h("span.muted", {}, `${num(offset + 1)}–${num(offset + page.items.length)} of ${num(page.total)}`),
        h("button", { testid: "signals-next", disabled: offset + page.items.length >= page.total, onclick: () => { offset += PAGE; load(); } }, "Next ›"))));
  }

  load();
  return { dispose() { ctl.abort(); } };
}
