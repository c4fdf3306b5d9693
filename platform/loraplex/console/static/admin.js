// The admin view: tenants (limits, status, keys, month-to-date usage), latency against the SLO and
// per SLO class, Engine replicas, billing export status. Every action is an /admin route the CLI uses too.
import { Session, download } from "./api.js";
import { baseLimitInputs, fillLimits, limitInputs, limitsText, readLimits } from "./limits_form.js";
import { $, confirmAction, fillRows, h, number, say, signInForm, when } from "./ui.js";

const session = new Session("loraplex.admin_token");
let tenants = [];
let editing = null; // the tenant in the edit dialog
let keysOf = null; // the tenant in the keys dialog

// -- base models --------------------------------------------------------------------------------
async function loadModelUsage() {
  try {
    const usage = await session.json("/admin/usage?group_by=model"); // this UTC month so far
    $("#models-currency").textContent = usage.currency;
    const rows = usage.rows.map((r) => h("tr", { "data-model": r.model },
      h("th", { scope: "row" }, r.model),
      h("td", { class: "num" }, number(r.prompt_tokens)),
      h("td", { class: "num" }, number(r.cached_prompt_tokens)),
      h("td", { class: "num" }, number(r.completion_tokens)),
      h("td", { class: "num" }, number(r.requests)),
      h("td", { class: "num" }, r.cost)));
    fillRows($("#models-table tbody"), rows, "No requests this month.", 6);
  } catch (err) {
    say($("#models-message"), err.message, "error");
  }
}

// -- tenants ------------------------------------------------------------------------------------
let bases = []; // the base models per-base limits may name (GET /admin/adapters lists them when there are several)

async function loadBases() {
  try {
    bases = Object.keys((await session.json("/admin/adapters")).bases || {});
  } catch (err) {
    bases = []; // the per-base limits of a tenant that has some are still shown when it is edited
  }
  baseLimitInputs($("#create-base-limits"), bases);
}

async function loadTenants() {
  const message = $("#tenants-message");
  try {
    const [list, usage] = await Promise.all([
      session.json("/admin/tenants"),
      session.json("/admin/usage?group_by=tenant"), // default range: this UTC month so far
    ]);
    tenants = list.data;
    $("#mtd-currency").textContent = usage.currency;
    const mtd = new Map(usage.rows.map((r) => [r.tenant, r]));
    const rows = tenants.map((t) => {
      const u = mtd.get(t.id);
      const suspended = t.status === "suspended";
      return h("tr", { "data-tenant": t.id, "data-name": t.name },
        h("th", { scope: "row" }, t.name),
        h("td", {}, h("code", {}, t.id)),
        h("td", {}, t.plan),
        h("td", {}, h("span", { class: `badge ${suspended ? "bad" : "good"}` }, t.status)),
        h("td", { class: "limits-cell" }, limitsText(t.effective_limits)),
        h("td", { class: "num" }, number(u ? u.prompt_tokens + u.completion_tokens : 0)),
        h("td", { class: "num" }, u ? u.cost : "0"),
        h("td", { class: "actions" },
          h("button", { type: "button", class: "small secondary", "aria-label": `Edit ${t.name}`,
            onclick: () => openEdit(t) }, "Edit"),
          h("button", { type: "button", class: `small ${suspended ? "secondary" : "danger"}`,
            "aria-label": `${suspended ? "Reactivate" : "Suspend"} ${t.name}`,
            onclick: () => setStatus(t, suspended ? "active" : "suspended") }, suspended ? "Reactivate" : "Suspend"),
          h("button", { type: "button", class: "small secondary", "aria-label": `Keys of ${t.name}`,
            onclick: () => openKeys(t) }, "Keys")));
    });
    fillRows($("#tenants-table tbody"), rows, "No tenants yet: create one below.", 8);
  } catch (err) {
    say(message, err.message, "error");
  }
}

async function createTenant(event) {
  event.preventDefault();
  const message = $("#tenants-message");
  const body = { name: $("#create-name").value.trim(), plan: $("#create-plan").value.trim() || "default",
    limits: readLimits("create", $("#create-base-limits"), { clearEmpty: false }) };
  try {
    const tenant = await session.send("POST", "/admin/tenants", body);
    say(message, `Created ${tenant.name} (${tenant.id}).`, "ok");
    $("#create-form").reset();
    await loadTenants();
  } catch (err) {
    say(message, err.message, "error");
  }
}

async function setStatus(tenant, status) {
  const message = $("#tenants-message");
  if (status === "suspended" && !(await confirmAction(
    `Suspend ${tenant.name}? Its keys get 403 within seconds on every ingress replica (tenancy.key_cache.refresh_s).`, "Suspend"))) return;
  try {
    await session.send("PATCH", `/admin/tenants/${encodeURIComponent(tenant.id)}`, { status });
    say(message, `${tenant.name} is ${status}.`, "ok");
    await loadTenants();
  } catch (err) {
    say(message, err.message, "error");
  }
}

function openEdit(tenant) {
  editing = tenant;
  $("#edit-h").textContent = `Edit ${tenant.name}`;
  $("#edit-plan").value = tenant.plan;
  fillLimits("edit", tenant.limits);
  const own = tenant.limits.models || {};
  baseLimitInputs($("#edit-base-limits"), [...new Set([...bases, ...Object.keys(own)])], own);
  say($("#edit-message"), "");
  $("#edit").showModal();
  $("#edit-plan").focus();
}

async function saveEdit(event) {
  event.preventDefault();
  try {
    await session.send("PATCH", `/admin/tenants/${encodeURIComponent(editing.id)}`, {
      plan: $("#edit-plan").value.trim(),
      limits: readLimits("edit", $("#edit-base-limits"), { clearEmpty: true, had: editing.limits.models || {} }),
    });
    $("#edit").close();
    say($("#tenants-message"), `Saved ${editing.name}.`, "ok");
    await loadTenants();
  } catch (err) {
    say($("#edit-message"), err.message, "error");
  }
}

// -- keys ---------------------------------------------------------------------------------------
async function openKeys(tenant) {
  keysOf = tenant;
  $("#keys-h").textContent = `API keys of ${tenant.name}`;
  $("#new-key-box").hidden = true;
  $("#new-key").value = "";
  say($("#keys-message"), "");
  fillRows($("#keys-table tbody"), [], "Loading...", 5);
  $("#keys").showModal();
  $("#issue-key").focus();
  await loadKeys();
}

async function loadKeys() {
  try {
    const body = await session.json(`/admin/tenants/${encodeURIComponent(keysOf.id)}/keys`);
    const rows = body.data.map((k) => h("tr", { "data-key": k.id },
      h("th", { scope: "row" }, h("code", {}, k.id)),
      h("td", {}, h("code", {}, `${k.prefix}...`)),
      h("td", {}, when(k.created_at)),
      h("td", {}, h("span", { class: `badge ${k.revoked ? "bad" : "good"}` }, k.revoked ? "revoked" : "active")),
      h("td", {}, k.revoked ? "" : h("button", { type: "button", class: "small danger", "aria-label": `Revoke ${k.id}`,
        onclick: () => revokeKey(k) }, "Revoke"))));
    fillRows($("#keys-table tbody"), rows, "No keys.", 5);
  } catch (err) {
    say($("#keys-message"), err.message, "error");
  }
}

async function issueKey() {
  try {
    const key = await session.send("POST", `/admin/tenants/${encodeURIComponent(keysOf.id)}/keys`);
    $("#new-key-box").hidden = false;
    $("#new-key").value = key.key; // the only time it is ever shown: the server keeps its sha256
    $("#new-key").select();
    say($("#keys-message"), `Issued ${key.id}. Copy the key now: it is not shown again.`, "ok");
    await loadKeys();
  } catch (err) {
    say($("#keys-message"), err.message, "error");
  }
}

async function revokeKey(key) {
  // The confirmation opens over the keys dialog (both modal, stacked).
  if (!(await confirmAction(`Revoke ${key.id} (${key.prefix}...)? Requests with it get 401 from the next one on.`,
    "Revoke"))) return;
  try {
    await session.send("DELETE", `/admin/keys/${encodeURIComponent(key.id)}`);
    say($("#keys-message"), `Revoked ${key.id}.`, "ok");
    await loadKeys();
  } catch (err) {
    say($("#keys-message"), err.message, "error");
  }
}

// -- latency ------------------------------------------------------------------------------------
function seconds(v) {
  if (v === null || v === undefined) return "no requests";
  return v >= 1 ? `${v.toFixed(2)} s` : `${(v * 1000).toFixed(v < 0.01 ? 2 : 0)} ms`;
}

async function loadLatency() {
  const message = $("#latency-message");
  try {
    const body = await session.json("/admin/latency");
    const source = body.source === "prometheus" ? "Prometheus" :
      `the usage ledger's timestamps (${number(body.requests)} requests)`;
    $("#latency-caption").textContent = `P95 over the last ${Math.round(body.window_s / 60)} minutes, from ${source}`;
    const rows = [["ttft", "Time to first token"], ["tpot", "Time per output token"]].map(([k, label]) => {
      const ok = body.within_slo[k];
      return h("tr", { "data-metric": k },
        h("th", { scope: "row" }, label),
        h("td", { class: "num" }, seconds(body[`${k}_p95_s`])),
        h("td", { class: "num" }, `${seconds(body.slo[`${k}_p95_s`])}`),
        h("td", {}, ok === null ? "-" : h("span", { class: `badge ${ok ? "good" : "bad"}` }, ok ? "within SLO" : "over SLO")));
    });
    fillRows($("#latency-table tbody"), rows, "", 4);
    renderClasses(body);
    say(message, body.prometheus_error ? `Prometheus did not answer, so these are from the ledger: ${body.prometheus_error}` : "",
      body.prometheus_error ? "warn" : "info");
  } catch (err) {
    say(message, err.message, "error");
  }
}

// -- latency per SLO class (/admin/latency's `classes`) -----------------------------------------
const percent = (v) => `${+(v * 100).toFixed(2)} %`;

// Each field of a `classes` entry, in #classes-table's column order (after Class, before Status),
// with what an empty one says: a target's null is no target; a measured figure's (from Prometheus
// only) is no requests of the class in the window, or "not measured" when the figures are the ledger's.
const CLASS_FIELDS = [
  ["ttft_p95_s", seconds, "none"],
  ["tpot_p95_s", seconds, "none"],
  ["availability", percent, "-"],
  ["attainment", percent, "measured"],
  ["goodput_tokens_per_s", (v) => `${v.toFixed(2)} tokens/s`, "measured"],
  ["tenants", (v) => Object.entries(v).sort(([a, x], [b, y]) => x - y || a.localeCompare(b)) // worst first
    .map(([id, x]) => `${tenantName(id)} ${percent(x)}`).join(", "), "measured"],
];

function tenantName(id) {
  const t = tenants.find((x) => x.id === id);
  return t ? t.name : id;
}

function classStatus(c) {
  if (c.ttft_p95_s === null && c.tpot_p95_s === null) return "no latency target";
  if (c.attainment === null) return "-";
  const ok = c.attainment >= c.availability; // LoraplexSLOClassMissed fires below it
  return h("span", { class: `badge ${ok ? "good" : "bad"}` }, ok ? "within objective" : "below objective");
}

function renderClasses(body) {
  const prometheus = body.source === "prometheus";
  const missing = prometheus ? "no requests" : "not measured";
  $("#classes-caption").textContent = prometheus
    ? `Per SLO class: its targets, and over the last ${Math.round(body.window_s / 60)} minutes the share of its requests `
      + "within them (attainment, against its availability) and their output tokens/s (goodput), from Prometheus"
    : "Per SLO class: its targets; attainment and goodput are measured from Prometheus only (console.prometheus_url)";
  const rows = Object.entries(body.classes || {}).map(([name, c]) => h("tr", { "data-class": name },
    h("th", { scope: "row" }, name),
    CLASS_FIELDS.map(([key, format, empty]) => {
      const v = c[key];
      const none = v === null || v === undefined || (typeof v === "object" && !Object.keys(v).length);
      return h("td", { class: key === "tenants" ? null : "num", "data-field": key },
        none ? (empty === "measured" ? missing : empty) : format(v));
    }),
    h("td", {}, classStatus(c))));
  fillRows($("#classes-table tbody"), rows, "No SLO class configured.", 8);
  const total = body.goodput_tokens_per_s;
  $("#classes-goodput").textContent = total === null || total === undefined ? missing : `${total.toFixed(2)} tokens/s`;
}

// -- replicas (GET /admin/replicas, where the server has it) ----------------------------------
function cell(value) {
  if (value === null || value === undefined) return "-";
  if (Array.isArray(value)) {
    if (value.length && typeof value[0] === "object") return objectsTable(value);
    return value.length ? value.join(", ") : "none";
  }
  if (typeof value === "object") {
    const entries = Object.entries(value);
    if (entries.length && entries.every(([, v]) => v && typeof v === "object" && !Array.isArray(v))) {
      return objectsTable(entries.map(([k, v]) => ({ "": k, ...v })));
    }
    return entries.length ? entries.map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ") : "none";
  }
  if (typeof value === "number" && !Number.isInteger(value)) return value.toFixed(3);
  return String(value);
}

function objectsTable(items) {
  const columns = [...new Set(items.flatMap((o) => Object.keys(o)))];
  return h("table", { class: "inner" },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c.replaceAll("_", " "))))),
    h("tbody", {}, items.map((o) => h("tr", {}, columns.map((c) => h("td", {}, cell(o[c])))))));
}

function tenantLabel(id) {
  const t = tenants.find((x) => x.id === id);
  return t ? `${t.name} (${id})` : id;
}

// "ten_abc/pirate@<sha256>" (vLLM's adapter name) -> "acme/pirate@1a2b3c4d5e6f"
function adapterLabel(name) {
  const m = /^([^/]+)\/([^@]+)@([0-9a-f]+)$/.exec(name);
  if (!m) return name;
  const t = tenants.find((x) => x.id === m[1]);
  return `${t ? t.name : m[1]}/${m[2]}@${m[3].slice(0, 12)}`;
}

const REPLICA_FIELDS = {
  running: ["Running", number], waiting: ["Waiting (vLLM)", number], queued: ["Queued (fair queue)", number],
  in_flight: ["In flight", number], dispatched: ["Dispatched", number],
  dispatch_limit: ["Dispatch limit", (v) => (v === null ? "no fair queue" : number(v))],
  kv_usage: ["KV cache used", (v) => `${(v * 100).toFixed(1)} %`],
  reported_at: ["Reported", (v) => `${Math.max(0, Math.round(Date.now() / 1000 - v))} s ago`],
};

function replicaCard(replica, i) {
  const id = replica.replica_id || replica.replica || replica.id || `replica ${i + 1}`;
  const facts = [];
  for (const [key, value] of Object.entries(replica)) {
    if (["replica_id", "replica", "id", "base_model", "tenants", "loaded_adapters"].includes(key)) continue; // in the title
    const [label, format] = REPLICA_FIELDS[key] || [key.replaceAll("_", " "), cell];
    facts.push(h("dt", {}, label), h("dd", {}, value === null || value === undefined ? "-" : format(value)));
  }
  const queues = Object.entries(replica.tenants || {});
  const adapters = replica.loaded_adapters || [];
  return h("article", { class: "card", "data-replica": id, "aria-label": `Replica ${id}` },
    h("h3", {}, `Replica ${id}`, replica.base_model ? ` of ${replica.base_model}` : ""),
    h("dl", {}, facts),
    h("h4", {}, "Tenants on it (fair-share queue per tenant)"),
    queues.length ? h("table", { class: "inner" },
      h("thead", {}, h("tr", {}, ["Tenant", "Queued", "Running", "Virtual token counter"].map((c, i) => h("th", { scope: "col", class: i ? "num" : null }, c)))),
      h("tbody", {}, queues.map(([tenant, q]) => h("tr", { "data-queue-tenant": tenant },
        h("th", { scope: "row" }, tenantLabel(tenant)), h("td", { class: "num" }, number(q.queued)),
        h("td", { class: "num" }, number(q.running)), h("td", { class: "num" }, number(q.counter))))))
      : h("p", { class: "help" }, "No tenant has requests on it now."),
    h("h4", {}, "Loaded adapters"),
    adapters.length ? h("ul", { class: "adapters" }, adapters.map((a) => h("li", {}, h("code", { title: a }, adapterLabel(a)))))
      : h("p", { class: "help" }, "None."));
}

async function loadReplicas() {
  const message = $("#replicas-message");
  const list = $("#replicas-list");
  list.replaceChildren();
  const response = await fetch("/admin/replicas", { headers: session.headers() });
  if (response.status === 404) {
    say(message, "Not available: this server has no GET /admin/replicas (it answered 404).", "warn");
    list.dataset.state = "unavailable";
    return;
  }
  let body = null;
  try {
    body = await response.json();
  } catch (e) {
    body = null;
  }
  if (!response.ok) {
    say(message, `Not available: ${response.status} ${(body && body.error && body.error.message) || response.statusText}`,
      "warn");
    list.dataset.state = "unavailable";
    return;
  }
  const replicas = Array.isArray(body) ? body : body.data || body.replicas || [];
  const extra = Array.isArray(body) ? {} : Object.fromEntries(Object.entries(body)
    .filter(([k]) => !["data", "replicas", "object"].includes(k)));
  say(message, replicas.length ? "" : "No Engine replica reported.");
  if (Object.keys(extra).length) list.append(h("dl", { class: "summary" },
    Object.entries(extra).flatMap(([k, v]) => [h("dt", {}, k.replaceAll("_", " ")), h("dd", {}, cell(v))])));
  list.append(...replicas.map(replicaCard));
  list.dataset.state = "shown";
}

// -- merged dedicated replicas -----------------------------------------------------------------
function dedicatedRow(entry) {
  const serving = entry.healthy ? ["merged replica", "good"] : entry.backing_off ? ["LoRA path (replica failing)", "warn"]
    : ["LoRA path (replica not ready)", "warn"];
  return h("tr", { "data-adapter": entry.adapter },
    h("th", { scope: "row" }, entry.adapter),
    h("td", {}, entry.deployment || ""),
    h("td", {}, entry.source === "config" ? "serve_config.yaml" : "admin mark"),
    h("td", {}, h("span", { class: `badge ${serving[1]}` }, serving[0])));
}

async function loadDedicated() {
  const message = $("#dedicated-message");
  let body;
  try {
    body = await session.json("/admin/dedicated");
  } catch (err) {
    say(message, `Not available: ${err.status || ""} ${err.message}`.trim(), "warn");
    return;
  }
  const pending = (body.pending || []).map((entry) => h("tr", { "data-adapter": entry.adapter },
    h("th", { scope: "row" }, entry.adapter), h("td", {}, "not deployed yet"), h("td", {}, "admin mark"),
    h("td", {}, h("span", { class: "badge warn" }, "LoRA path"), " ", entry.takes_effect || "")));
  fillRows($("#dedicated-table tbody"), [...(body.data || []).map(dedicatedRow), ...pending],
    "No adapter is dedicated: every adapter runs on the shared LoRA replicas.", 4);
  say(message, "");
}

// -- billing export -----------------------------------------------------------------------------
function recentMonths(n) {
  const now = new Date();
  const months = [];
  for (let i = 0; i < n; i += 1) {
    const d = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() - i, 1));
    months.push(d.toISOString().slice(0, 7));
  }
  return months;
}

async function loadBilling() {
  const rows = await Promise.all(recentMonths(3).map(async (period) => {
    const path = `/admin/billing/export?period=${period}`;
    try {
      const response = await session.fetch(path);
      const complete = response.headers.get("X-LoRAPlex-Export-Complete") === "true";
      return h("tr", { "data-period": period },
        h("th", { scope: "row" }, period),
        h("td", {}, h("span", { class: `badge ${complete ? "good" : "warn"}` }, complete ? "complete" : "open")),
        h("td", {}, response.headers.get("X-LoRAPlex-Export-Through") || "no final day yet"),
        h("td", { class: "num" }, number(response.headers.get("X-LoRAPlex-Export-Events"))),
        h("td", {}, h("button", { type: "button", class: "small secondary", "aria-label": `Download ${period} export`,
          onclick: () => download(session, path, `loraplex-billing-${period}.jsonl`) }, "Download JSONL")));
    } catch (err) {
      return h("tr", {}, h("th", { scope: "row" }, period), h("td", { colspan: 4 }, err.message));
    }
  }));
  fillRows($("#billing-table tbody"), rows, "", 5);
}

// -- page ---------------------------------------------------------------------------------------
function init() {
  limitInputs($("#create-limits"), "create");
  limitInputs($("#edit-limits"), "edit");
  $("#create-form").addEventListener("submit", createTenant);
  $("#edit-form").addEventListener("submit", saveEdit);
  $("#edit-cancel").addEventListener("click", () => $("#edit").close());
  $("#issue-key").addEventListener("click", issueKey);
  $("#keys-close").addEventListener("click", () => {
    $("#new-key").value = ""; // the key leaves the page with the dialog
    $("#keys").close();
    loadTenants();
  });
  $("#copy-key").addEventListener("click", () => navigator.clipboard && navigator.clipboard.writeText($("#new-key").value));
  signInForm({
    session,
    form: $("#signin-form"),
    input: $("#token"),
    message: $("#signin-message"),
    signOutButton: $("#sign-out"),
    verify: () => session.json("/admin/tenants"),
    onSignedIn: async () => {
      const named = loadTenants(); // the replicas' and classes' tenants and adapters are shown by name
      await Promise.all([named, loadBases(), loadModelUsage(), named.then(loadLatency), named.then(loadReplicas), loadDedicated(), loadBilling()]);
      document.body.dataset.ready = "admin";
    },
    onSignedOut: () => {
      delete document.body.dataset.ready;
    },
  });
}

init();
