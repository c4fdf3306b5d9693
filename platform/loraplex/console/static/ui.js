// Small DOM helpers shared by the tenant and admin pages.

// h("td", {class: "num"}, "12"): an element with attributes (on* = listeners) and children.
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export const $ = (selector, root = document) => root.querySelector(selector);

// A status line: kind "error" is announced at once (role=alert), others politely.
export function say(node, text, kind = "info") {
  node.textContent = text || "";
  node.dataset.kind = kind;
  node.setAttribute("role", kind === "error" ? "alert" : "status");
  node.hidden = !text;
}

export function fillRows(tbody, rows, emptyText, columns) {
  tbody.replaceChildren();
  if (!rows.length) {
    tbody.append(h("tr", {}, h("td", { colspan: columns, class: "empty" }, emptyText)));
    return;
  }
  for (const row of rows) tbody.append(row);
}

// Ask before a destructive action, in the page's <dialog id="confirm"> (modal: focus stays in
// it, Escape cancels). Resolves true only for the confirm button.
export function confirmAction(question, confirmLabel = "Delete") {
  const dialog = $("#confirm");
  $("#confirm-text", dialog).textContent = question;
  $("#confirm-yes", dialog).textContent = confirmLabel;
  dialog.returnValue = "";
  dialog.showModal();
  $("#confirm-no", dialog).focus();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
  });
}

export function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}

// "2026-11-29T22:03:11.123+00:00" -> "2026-11-29 22:03 UTC"
export function when(iso) {
  if (!iso) return "-";
  const d = new Date(iso);
  return `${d.toISOString().slice(0, 10)} ${d.toISOString().slice(11, 16)} UTC`;
}

export function number(n) {
  return n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US");
}

// UTC calendar dates as YYYY-MM-DD (the API's days are UTC days).
export function utcDate(d) {
  return d.toISOString().slice(0, 10);
}

export function addDays(isoDate, days) {
  const d = new Date(`${isoDate}T00:00:00Z`);
  d.setUTCDate(d.getUTCDate() + days);
  return utcDate(d);
}

// Sign-in form wiring shared by both pages: verify(token) throws an ApiError for a bad token.
export function signInForm({ session, form, input, message, verify, onSignedIn, onSignedOut, signOutButton }) {
  async function tryToken(token) {
    session.signIn(token);
    try {
      await verify();
    } catch (err) {
      session.signOut();
      say(message, `${err.status || ""} ${err.message}`.trim(), "error");
      input.focus();
      return;
    }
    say(message, "");
    input.value = "";
    await onSignedIn();
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (input.value.trim()) tryToken(input.value);
  });
  signOutButton.addEventListener("click", () => {
    session.signOut();
    onSignedOut();
    input.focus();
  });
  if (session.token) tryToken(session.token);
  else onSignedOut();
}
