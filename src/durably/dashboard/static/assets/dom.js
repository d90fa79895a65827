// Tiny DOM and formatting helpers shared by the console pages.
import { pageHref } from "./nav.js";

/** h("tag.cls", {attrs}, ...children): build an element. `on*` attrs are listeners,
 *  `style` is an object of CSS properties. */
export function h(tag, attrs, ...kids) {
  const [name, ...classes] = tag.split(".");
  const el = document.createElement(name || "div");
  if (classes.length) el.className = classes.join(" ");
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "testid") el.dataset.testid = v;
    else if (k === "text") el.textContent = v;
    // style through the CSSOM: the CSP (own assets only) refuses style="" attributes
    else if (k === "style") Object.assign(el.style, v);
    else if (k in el && k !== "list" && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  add(el, kids);
  return el;
}

function add(el, kids) {
  for (const kid of kids) {
    if (kid == null || kid === false) continue;
    if (Array.isArray(kid)) add(el, kid);
    else el.append(kid instanceof Node ? kid : String(kid));
  }
}

export function clear(el, ...kids) {
  el.replaceChildren();
  add(el, kids);
  return el;
}

export const badge = (status, testid) =>
  h("span.badge.s-" + status, { testid: testid || "status", "data-status": status }, status);

export function ms(value) {
  if (value == null) return null;
  if (typeof value === "number") return value;
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

export function when(value) {
  const t = ms(value);
  if (t == null) return "—";
  const d = new Date(t);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function ago(value) {
  const t = ms(value);
  if (t == null) return "—";
  const s = Math.round((Date.now() - t) / 1000);
  if (Math.abs(s) < 60) return `${s}s ago`;
  if (Math.abs(s) < 3600) return `${Math.round(s / 60)}m ago`;
  if (Math.abs(s) < 86400) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

export function duration(from, to) {
  const a = ms(from), b = ms(to);
  if (a == null || b == null) return "—";
  return millis(b - a);
}

/** A span in milliseconds, in words: `840 ms`, `1.0 s`, `2m 5s`. */
export function millis(d) {
  if (d == null) return "—";
  if (d < 1000) return `${d} ms`;
  if (d < 60000) return `${(d / 1000).toFixed(1)} s`;
  return `${Math.floor(d / 60000)}m ${Math.round((d % 60000) / 1000)}s`;
}

export const num = (n) => (n == null ? "—" : Number(n).toLocaleString("en-US"));

export function json(value) {
  if (value === undefined) return "—";
  try { return JSON.stringify(value, null, 2); } catch { return String(value); }
}

/** A labelled JSON block, collapsed when long. */
export function jsonBlock(label, value, testid) {
  const text = json(value);
  const pre = h("pre.json", { testid }, text.length > 20000 ? text.slice(0, 20000) + "\n…" : text);
  if (text.length < 400) return h("div.kv", {}, h("h4", {}, label), pre);
  return h("details.kv", { open: text.length < 4000 }, h("summary", {}, label), pre);
}

/** The error block: message, code, details, stack (the StepError JSON). */
export function errorBlock(err, testid = "error") {
  if (!err) return null;
  const e = typeof err === "object" ? err : { message: String(err) };
  return h("div.errbox", { testid },
    h("div", {}, h("strong", {}, "Error"), e.code ? h("code.code", { testid: testid + "-code" }, e.code) : null,
      e.retryable === false ? h("span.muted", {}, " not retryable") : null),
    h("div.msg", { testid: testid + "-message" }, e.message || json(e)),
    e.details !== undefined && e.details !== null ? jsonBlock("details", e.details, testid + "-details") : null,
    e.stack ? h("details", {}, h("summary", {}, "stack"), h("pre.json", {}, e.stack)) : null);
}

export const runHref = (id) => pageHref("runs/" + encodeURIComponent(id));
export const runLink = (id, testid = "run-link") =>
  h("a.mono", { href: runHref(id), testid, "data-run-id": id }, id);

let flashTimer = 0;
export function flash(message, kind = "ok") {
  const el = document.getElementById("flash");
  if (!el) return;
  el.textContent = message;
  el.className = "flash " + kind;
  el.hidden = false;
  clearTimeout(flashTimer);
  flashTimer = setTimeout(() => { el.hidden = true; }, kind === "err" ? 9000 : 4000);
}
