// The tenant view: usage chart, adapters, batches, playground. Every figure is from the tenant routes
// (/v1/usage, /v1/adapters, /v1/batches, /v1/models, /v1/chat/completions) with the tenant's own key.
import { Session, download, streamChat } from "./api.js";
import { $, addDays, bytes, confirmAction, fillRows, h, number, say, signInForm, utcDate, when } from "./ui.js";
import { daysBetween, renderUsageChart } from "./usage_chart.js";

const session = new Session("loraplex.tenant_key");
// bases: the base model ids of GET /v1/models (the default first); adapters: {ref, base}, a name
// (its latest version) and each name@version, with the base model the version is bound to.
let models = { bases: [], adapters: [] };

// -- usage --------------------------------------------------------------------------------------
// group_by -> [the key column's header, the caption, the chart's label]
const USAGE_GROUPS = {
  day: ["Day", "Per UTC day", "per UTC day"],
  model: ["Base model", "Per base model", "per base model"],
  adapter: ["Adapter", "Per adapter ((base): no adapter)", "per adapter"],
};

function usageQuery(format) {
  const start = $("#usage-start").value;
  const end = addDays($("#usage-end").value, 1); // the API's end is exclusive
  const groupBy = encodeURIComponent($("#usage-group").value);
  return `/v1/usage?group_by=${groupBy}&start=${start}&end=${end}${format ? `&format=${format}` : ""}`;
}

async function loadUsage() {
  const message = $("#usage-message");
  if ($("#usage-start").value > $("#usage-end").value) {
    say(message, "The start date is after the end date.", "error");
    return;
  }
  try {
    const report = await session.json(usageQuery());
    say(message, report.rows.length ? "" : "No requests finished in this range.");
    renderUsage(report);
  } catch (err) {
    say(message, err.message, "error");
  }
}

function renderUsage(report) {
  const [keyHeader, caption, chartLabel] = USAGE_GROUPS[report.group_by];
  $("#usage-currency").textContent = report.currency;
  $("#usage-key-h").textContent = keyHeader;
  $("#usage-per").textContent = caption;
  $("#usage-chart").setAttribute("aria-label", `Tokens and cost ${chartLabel}; the table below has the same figures`);
  const rows = report.rows.map((r) => h("tr", { "data-key": r[report.group_by] },
    h("th", { scope: "row" }, r[report.group_by]),
    h("td", { class: "num" }, number(r.prompt_tokens)),
    h("td", { class: "num" }, number(r.cached_prompt_tokens)),
    h("td", { class: "num" }, number(r.completion_tokens)),
    h("td", { class: "num" }, number(r.requests)),
    h("td", { class: "num" }, r.cost)));
  fillRows($("#usage-table tbody"), rows, "No usage in this range.", 6);
  const t = report.total;
  $("#total-prompt").textContent = number(t.prompt_tokens);
  $("#total-cached").textContent = number(t.cached_prompt_tokens);
  $("#total-completion").textContent = number(t.completion_tokens);
  $("#total-requests").textContent = number(t.requests);
  $("#total-cost").textContent = t.cost;
  // Per day: every day of the range (days without requests are 0); else one bar group per row.
  const labels = report.group_by === "day" ? daysBetween($("#usage-start").value, $("#usage-end").value)
    : report.rows.map((r) => r[report.group_by]);
  renderUsageChart($("#usage-chart"), report, labels);
}

// -- adapters -----------------------------------------------------------------------------------
async function loadAdapters() {
  const body = await session.json("/v1/adapters");
  const rows = [];
  models.adapters = [];
  for (const adapter of body.data) {
    // The name alone runs its latest version (the last listed), on that version's base.
    const latest = adapter.versions[adapter.versions.length - 1];
    models.adapters.push({ ref: adapter.name, base: latest && latest.base_model });
    for (const v of adapter.versions) {
      const ref = `${v.name}@${v.version}`;
      models.adapters.push({ ref, base: v.base_model });
      rows.push(h("tr", { "data-ref": ref },
        h("th", { scope: "row" }, v.name),
        h("td", { class: "num" }, v.version),
        h("td", {}, h("code", { title: v.sha256 }, v.sha256.slice(0, 12))),
        h("td", { class: "num" }, v.rank),
        h("td", {}, v.base_model || "-"),
        h("td", { class: "num" }, bytes(v.size_bytes)),
        h("td", {}, when(v.created_at)),
        h("td", {}, h("button", { type: "button", class: "danger small", "aria-label": `Delete ${ref}`,
          onclick: () => deleteAdapter(ref) }, "Delete"))));
    }
  }
  fillRows($("#adapters-table tbody"), rows, "No adapters yet: drop an archive above.", 8);
  fillModelSelects();
}

async function deleteAdapter(ref) {
  const message = $("#upload-message");
  if (!(await confirmAction(`Delete ${ref}? New requests for it get 404 at once; running ones finish.`))) return;
  try {
    await session.send("DELETE", `/v1/adapters/${encodeURIComponent(ref)}`);
    say(message, `Deleted ${ref}.`);
    await loadAdapters();
  } catch (err) {
    say(message, err.message, "error");
  }
}

// -- batches ------------------------------------------------------------------------------------
const BATCH_ENDED = ["completed", "failed", "expired", "cancelled"];

async function loadBatches() {
  const body = await session.json("/v1/batches?limit=100");
  const rows = body.data.map((b) => {
    const c = b.request_counts || {};
    const ended = BATCH_ENDED.includes(b.status);
    return h("tr", { "data-batch": b.id },
      h("th", { scope: "row" }, h("code", {}, b.id)),
      h("td", {}, b.status),
      h("td", { class: "num" }, `${(c.completed || 0) + (c.failed || 0)} / ${c.total || 0}`),
      h("td", { class: "num" }, c.failed || 0),
      h("td", {}, b.endpoint),
      h("td", {}, when(b.created_at * 1000)),
      h("td", {}, ended ? "" : h("button", { type: "button", class: "danger small", "aria-label": `Cancel ${b.id}`,
        onclick: () => cancelBatch(b.id) }, "Cancel")));
  });
  fillRows($("#batches-table tbody"), rows, "No batches yet: start one with `loraplex batches create`.", 7);
}

async function cancelBatch(id) {
  const message = $("#batches-message");
  if (!(await confirmAction(`Cancel ${id}? Lines not yet run go to its error file.`))) return;
  try {
    await session.send("POST", `/v1/batches/${encodeURIComponent(id)}/cancel`);
    say(message, `Cancelling ${id}.`);
    await loadBatches();
  } catch (err) {
    say(message, err.message, "error");
  }
}

function nameFromFile(file) {
  const stem = file.name.replace(/\.(tar\.gz|tgz|zip)$/i, "");
  return stem.replace(/[^A-Za-z0-9._-]+/g, "-").replace(/^[^A-Za-z0-9]+/, "").slice(0, 64) || "adapter";
}

async function upload(file) {
  const message = $("#upload-message");
  const name = $("#adapter-name").value.trim() || nameFromFile(file);
  const base = $("#adapter-base").value; // "": the server takes the archive's (or the name's) base
  const form = new FormData();
  form.append("name", name);
  if (base) form.append("base_model", base);
  form.append("file", file, file.name);
  say(message, `Uploading ${file.name} as ${name}${base ? ` for ${base}` : ""}...`);
  try {
    const version = await session.json("/v1/adapters", { method: "POST", body: form });
    say(message, `Uploaded ${version.name}@${version.version} for ${version.base_model} ` +
      `(sha256 ${version.sha256.slice(0, 12)}).`, "ok");
    await loadAdapters();
  } catch (err) {
    // The validator's message as it is: it names the problem and the fix.
    say(message, err.message, "error");
    message.dataset.status = err.status;
  }
}

function wireDropzone() {
  const zone = $("#dropzone");
  const input = $("#adapter-file");
  zone.addEventListener("click", () => input.click());
  zone.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      input.click();
    }
  });
  for (const type of ["dragenter", "dragover"]) {
    zone.addEventListener(type, (event) => {
      event.preventDefault();
      zone.classList.add("over");
    });
  }
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    const [file] = event.dataTransfer.files;
    if (file) upload(file);
  });
  input.addEventListener("change", () => {
    const [file] = input.files;
    if (file) upload(file);
    input.value = "";
  });
}

// -- models -------------------------------------------------------------------------------------
// GET /v1/models: the bases have no `parent`; the caller's adapters name theirs.
async function loadModels() {
  const body = await session.json("/v1/models");
  models.bases = body.data.filter((m) => !m.parent).map((m) => m.id);
  fillBaseSelect();
}

// The upload's base: a choice only with several bases (with one, every adapter is for it).
function fillBaseSelect() {
  const select = $("#adapter-base");
  const keep = select.value;
  select.replaceChildren(h("option", { value: "" }, "From the archive"),
    ...models.bases.map((b) => h("option", { value: b }, b)));
  select.value = models.bases.includes(keep) ? keep : "";
  const several = models.bases.length > 1;
  $("#adapter-base-label").hidden = !several;
  $("#base-help").hidden = !several;
}

// Each base and the adapters on it, one <optgroup> per base. Left: the first base; right: the
// first adapter (else the second base), until the user picks another.
function fillModelSelects() {
  const bases = [...new Set([...models.bases, ...models.adapters.map((a) => a.base).filter(Boolean)])];
  const choices = [...bases, ...models.adapters.map((a) => a.ref)];
  // A closed select shows no group label: with several bases, each adapter names its own.
  const on = (a) => (bases.length > 1 ? `${a.ref} (on ${a.base})` : a.ref);
  const groups = () => bases.map((base) => h("optgroup", { label: `${base} and its adapters` },
    h("option", { value: base }, `${base} (base model)`),
    models.adapters.filter((a) => a.base === base).map((a) => h("option", { value: a.ref }, on(a)))));
  const right = models.adapters.length ? models.adapters[0].ref : bases[1] || bases[0];
  for (const [id, fallback] of [["#model-a", bases[0]], ["#model-b", right]]) {
    const select = $(id);
    const keep = select.dataset.chosen && choices.includes(select.value) ? select.value : fallback;
    select.replaceChildren(...groups());
    select.value = keep;
  }
}

// -- playground ---------------------------------------------------------------------------------

let running = null;

async function play(event) {
  event.preventDefault();
  const messages = [{ role: "user", content: $("#prompt").value }];
  const maxTokens = Number($("#max-tokens").value) || 48;
  running = new AbortController();
  $("#send").disabled = true;
  $("#stop").disabled = false;
  await Promise.all(["a", "b"].map((pane) => runPane(pane, messages, maxTokens, running.signal)));
  $("#send").disabled = false;
  $("#stop").disabled = true;
}

async function runPane(pane, messages, maxTokens, signal) {
  const out = $(`#reply-${pane}`);
  const meta = $(`#meta-${pane}`);
  const model = $(`#model-${pane}`).value;
  out.textContent = "";
  out.dataset.state = "streaming";
  meta.textContent = `${model}: waiting for the first token...`;
  const started = performance.now();
  let first = null;
  try {
    const usage = await streamChat(session, {
      model, messages, maxTokens, signal,
      onDelta: (text) => {
        if (first === null) first = performance.now();
        out.textContent += text;
      },
    });
    const ttft = first === null ? "-" : `${((first - started) / 1000).toFixed(2)} s`;
    meta.textContent = `${model}: first token after ${ttft}` +
      (usage ? `, ${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens` : "");
    out.dataset.state = "done";
  } catch (err) {
    out.dataset.state = "error";
    meta.textContent = signal.aborted ? `${model}: stopped` : `${model}: ${err.status || ""} ${err.message}`;
  }
}

// -- page ---------------------------------------------------------------------------------------
function init() {
  const today = utcDate(new Date());
  $("#usage-start").value = `${today.slice(0, 8)}01`;
  $("#usage-end").value = today;
  $("#usage-form").addEventListener("submit", (event) => {
    event.preventDefault();
    loadUsage();
  });
  $("#usage-group").addEventListener("change", loadUsage);
  $("#usage-csv").addEventListener("click", async () => {
    try {
      await download(session, usageQuery("csv"), "usage.csv");
    } catch (err) {
      say($("#usage-message"), err.message, "error");
    }
  });
  wireDropzone();
  $("#play-form").addEventListener("submit", play);
  for (const id of ["#model-a", "#model-b"]) $(id).addEventListener("change", (e) => { e.target.dataset.chosen = "1"; });
  $("#stop").addEventListener("click", () => running && running.abort());
  signInForm({
    session,
    form: $("#signin-form"),
    input: $("#token"),
    message: $("#signin-message"),
    signOutButton: $("#sign-out"),
    verify: loadModels,
    onSignedIn: async () => {
      $("#who").textContent = "Signed in with a tenant API key";
      await Promise.all([loadUsage(), loadAdapters(), loadBatches()]);
      document.body.dataset.ready = "tenant";
    },
    onSignedOut: () => {
      delete document.body.dataset.ready;
    },
  });
}

init();
