// The built-in login form: POSTs JSON (same origin, application/json — what the console's
// front door requires of every change) to the form's own action, then follows the
// server-checked `redirectTo` (the server keeps `returnTo` only if it is a console page).
const form = document.getElementById("login");
const err = document.getElementById("error");
const params = new URLSearchParams(location.search);
if (params.get("error")) err.textContent = params.get("error");

form.addEventListener("submit", async (e) => {
  e.preventDefault();
  try {
    const res = await fetch(form.getAttribute("action"), {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ username: form.username.value, password: form.password.value,
        returnTo: params.get("returnTo") || undefined }),
    });
    const body = await res.json();
    if (res.ok) location.assign(body.redirectTo);
    else err.textContent = body.message || "Sign-in failed.";
  } catch {
    err.textContent = "Sign-in failed.";
  }
});
