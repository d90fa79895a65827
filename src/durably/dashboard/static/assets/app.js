// The console's entry: routing by path under the console's base (<base>/runs,
// <base>/runs/<id>, <base>/workers, <base>/signals,
// <base>/schedules; old #/… links redirect) over the JSON API.
import { onReadOnly, probeReadOnly, state } from "./api.js";
import { h, clear } from "./dom.js";
import { runList } from "./runs.js";
import { runDetail } from "./run.js";
import { workersPanel } from "./workers.js";
import { signalsPanel } from "./signals.js";
import { schedulesPanel } from "./schedules.js";
import { currentRoute, onNavigate, startNavigation } from "./nav.js";

const app = document.getElementById("app");
let current = null; // {dispose()} of the page on screen

// The first path segment of every page (the server serves the console's shell for them).
const PAGES = new Set(["runs", "workers", "signals", "schedules"]);

function parse() {
  const raw = currentRoute();
  const [path, query = ""] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(query) };
}

function route() {
  const { parts, params } = parse();
  if (current && current.dispose) current.dispose();
  current = null;
  clear(app);
  document.body.dataset.page = parts[0] || "runs";
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("on", a.getAttribute("href") === "#/" + (parts[0] || "runs"));
  }
  if (parts[0] === "runs" && parts.length > 1) current = runDetail(app, parts.slice(1).join("/"));
  else if (parts[0] === "workers") current = workersPanel(app);
  else if (parts[0] === "signals") current = signalsPanel(app, params);
  else if (parts[0] === "schedules") current = schedulesPanel(app);
  else if (!parts[0] || parts[0] === "runs") current = runList(app, params);
  else app.append(h("p.err", {}, "Unknown page. "), h("a", { href: "#/runs" }, "Back to runs"));
}

function showReadOnly(on) {
  document.getElementById("ro").hidden = !on;
  document.body.classList.toggle("read-only", on);
  for (const b of document.querySelectorAll("[data-mutates]")) b.disabled = on || b.dataset.off === "1";
}

onReadOnly(showReadOnly);
startNavigation((first) => PAGES.has(first));
onNavigate(route);
showReadOnly(state.readOnly);
probeReadOnly();
route();
