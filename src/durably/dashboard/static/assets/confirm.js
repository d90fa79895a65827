// Every control asks first: a <dialog> with optional token and JSON fields.
import { state } from "./api.js";
import { h, clear, json, flash } from "./dom.js";

/** opts: {title, text, json?: default value (adds a JSON textarea), token?: bool,
 *  run(values) -> Promise, done(result)} */
export function confirmAction(opts) {
  const dialog = document.getElementById("confirm");
  const extra = document.getElementById("confirm-extra");
  const error = document.getElementById("confirm-error");
  const ok = dialog.querySelector("[data-testid=confirm-button]");
  document.getElementById("confirm-title").textContent = opts.title;
  document.getElementById("confirm-text").textContent = opts.text;
  error.textContent = "";
  const token = opts.token ? h("input", { testid: "confirm-token", placeholder: "webhook token", required: true, autocomplete: "off" }) : null;
  const area = "json" in opts ? h("textarea", { testid: "confirm-json", rows: 8, spellcheck: "false" }) : null;
  if (area) area.value = opts.json === undefined ? "" : json(opts.json);
  clear(extra, token ? h("label", {}, "Token", token) : null, area ? h("label", {}, "JSON", area) : null);
  ok.disabled = state.readOnly;

  async function submit(e) {
    e.preventDefault();
    const values = {};
    if (token) values.token = token.value.trim();
    if (area) {
      const text = area.value.trim();
      try { values.json = text === "" ? null : JSON.parse(text); } catch (err) {
        error.textContent = "Not valid JSON: " + err.message;
        return;
      }
    }
    ok.disabled = true;
    try {
      const res = await opts.run(values);
      dialog.close("ok");
      opts.done(res);
    } catch (err) {
      error.textContent = err.message;
      if (err.status === 403) flash(err.message, "err");
    } finally {
      ok.disabled = state.readOnly;
    }
  }
  ok.onclick = submit; // Enter in a field clicks this, the form's only submit button
  dialog.querySelector("[data-testid=confirm-cancel]").onclick = () => dialog.close("cancel");
  if (typeof dialog.showModal === "function") dialog.showModal();
  else if (window.confirm(`${opts.title}: ${opts.text}`)) submit(new Event("submit"));
  (token || area || ok).focus();
}
