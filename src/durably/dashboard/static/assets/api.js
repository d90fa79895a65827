// The JSON API client: bases from the config block, errors as
// `{statusCode, message}`, ETag revalidation, read-only detection.

const cfgEl = document.getElementById("durable-config");
export const config = (() => {
  try { return JSON.parse(cfgEl ? cfgEl.textContent : "{}"); } catch { return {}; }
})();
const API = String(config.api || "api").replace(/\/$/, "");

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export const state = { readOnly: config.readOnly === true, listeners: [] };

export function setReadOnly(value) {
  if (state.readOnly === value) return;
  state.readOnly = value;
  for (const fn of state.listeners) fn(value);
}
export const onReadOnly = (fn) => state.listeners.push(fn);

export function url(path, params) {
  let u = API + "/" + path.replace(/^\//, "");
  if (params) {
    const q = params instanceof URLSearchParams ? params : toParams(params);
    const s = q.toString();
    if (s) u += "?" + s;
  }
  return u;
}

export function toParams(obj) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(obj || {})) {
    if (v == null || v === "" || v === false) continue;
    for (const one of Array.isArray(v) ? v : [v]) if (one != null && one !== "") q.append(k, String(one));
  }
  return q;
}

async function fail(res) {
  let message = res.statusText || "HTTP " + res.status;
  try {
    const body = await res.json();
    if (body && body.message) message = body.message;
  } catch { /* not JSON */ }
  if (res.status === 403 && /read-only/i.test(message)) setReadOnly(true);
  throw new ApiError(res.status, message);
}

/** GET JSON. With `etag`, sends If-None-Match; answers {status, etag, body}. */
export async function get(path, params, etag, signal) {
  const headers = { Accept: "application/json" };
  if (etag) headers["If-None-Match"] = etag;
  const res = await fetch(url(path, params), { headers, cache: "no-store", credentials: "same-origin", signal });
  if (res.status === 304) return { status: 304, etag: res.headers.get("ETag") || etag, body: null };
  if (!res.ok) await fail(res);
  return { status: res.status, etag: res.headers.get("ETag"), body: await res.json() };
}

export const getJson = async (path, params, signal) => (await get(path, params, null, signal)).body;

// Every change is a same-origin POST (or DELETE) that says it is JSON, with or without a body: the
// server refuses any other content type on a change (a form or a no-cors fetch from another
// site cannot send this one without a CORS preflight, which the console never answers).
const SEND_JSON = { Accept: "application/json", "Content-Type": "application/json" };

export async function post(path, params, body) {
  const init = { method: "POST", credentials: "same-origin", headers: { ...SEND_JSON } };
  if (body !== undefined) init.body = JSON.stringify(body);
  const res = await fetch(url(path, params), init);
  if (!res.ok) await fail(res);
  const text = await res.text();
  if (!text) return null;
  try { return JSON.parse(text); } catch { return text; }
}

/** DELETE, as the console's other changes: same origin, saying JSON (no body). */
export async function remove(path) {
  const res = await fetch(url(path), { method: "DELETE", credentials: "same-origin", headers: { ...SEND_JSON } });
  if (!res.ok) await fail(res);
  return res.json();
}

/** Read-only mode: the config block says so, or a harmless mutation probe gets a 403
 *  (continuing an unknown run answers 404 on a writable console and touches nothing). */
export async function probeReadOnly() {
  if (typeof config.readOnly === "boolean") return;
  try {
    const res = await fetch(url("runs/" + encodeURIComponent("__console_probe__") + "/continue"),
      { method: "POST", credentials: "same-origin", headers: { ...SEND_JSON } });
    setReadOnly(res.status === 403);
  } catch { /* offline: leave as is */ }
}

export const enc = encodeURIComponent;
