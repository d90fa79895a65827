// Pages by path under the console's base (`<base>/runs/<id>`), with history.pushState.
// `#/…` links and `location.hash = "#/…"` keep working: they are turned into the path form
// (the page is not reloaded) and the old hash URL redirects the same way when opened.
import { config } from "./api.js";

const BASE = String(config.base || "/").replace(/\/+$/, ""); // "" or "/durable"
const listeners = [];

/** The URL of a console route (`runs/a%2Fb?x=1`, `/runs`, `#/runs`): `<base>/runs/…`. */
export function pageHref(route) {
  return BASE + "/" + String(route).replace(/^#?\/*/, "");
}

/** The route on screen, relative to the base: `runs/a%2Fb?x=1` (segments still encoded). */
export function currentRoute() {
  let path = location.pathname;
  if (BASE && (path === BASE || path.startsWith(BASE + "/"))) path = path.slice(BASE.length);
  return path.replace(/^\/+/, "") + location.search;
}

export const onNavigate = (fn) => listeners.push(fn);

/** Open a console route without reloading the page. */
export function navigate(route, { replace = false } = {}) {
  const href = pageHref(route);
  if (href !== location.pathname + location.search) history[replace ? "replaceState" : "pushState"](null, "", href);
  for (const fn of listeners) fn();
}

/** A `#/…` URL (an old link, a bookmark, `location.hash = …`) becomes its path form. */
function fromHash() {
  if (!location.hash.startsWith("#/")) return false;
  history.replaceState(null, "", pageHref(location.hash));
  return true;
}

/** Start listening: links inside the console open in place (a modified click, a target or
 *  a download keeps the browser's own behaviour). `isPage(first segment)` says which paths
 *  under the base are console pages (the rest — assets, the API, login — load normally). */
export function startNavigation(isPage) {
  fromHash();
  window.addEventListener("hashchange", () => { if (fromHash()) for (const fn of listeners) fn(); });
  window.addEventListener("popstate", () => { for (const fn of listeners) fn(); });
  document.addEventListener("click", (e) => {
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    const a = e.target instanceof Element ? e.target.closest("a[href]") : null;
    if (!a || (a.target && a.target !== "_self") || a.hasAttribute("download")) return;
    const raw = a.getAttribute("href");
    if (raw.startsWith("#/")) { e.preventDefault(); navigate(raw); return; }
    const u = new URL(a.href, location.href);
    if (u.origin !== location.origin) return;
    if (BASE && u.pathname !== BASE && !u.pathname.startsWith(BASE + "/")) return;
    const first = u.pathname.slice(BASE.length).replace(/^\/+/, "").split("/")[0];
    if (first && !isPage(first)) return;
    e.preventDefault();
    navigate(u.pathname.slice(BASE.length) + u.search);
  });
}
