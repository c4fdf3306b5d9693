// A tenant's limits in the admin forms (create and edit): every field of TenantLimits, and the
// per-base ones (TenantLimits.models, BaseLimits) for each base model the server serves.
// tests/unit/console/test_limits_form.py checks these lists against the server's models.
import { $, h, number } from "./ui.js";

// [legend, [[TenantLimits field, label, short name in the table, least value]]]
export const LIMIT_GROUPS = [
  ["Rates and budget", [
    ["requests_per_minute", "Requests / minute", "rpm", 1],
    ["tokens_per_minute", "Tokens / minute", "tpm", 1],
    ["max_concurrent_requests", "Concurrent requests", "concurrent", 1],
    ["monthly_token_budget", "Monthly token budget", "budget", 1],
    ["priority", "Priority (0-100)", "priority", 0],
  ]],
  ["Adapters", [
    ["max_adapter_versions", "Adapter versions", "adapter versions", 0],
    ["max_adapter_bytes", "Adapter bytes", "adapter bytes", 0],
  ]],
  ["Batch API", [
    ["max_batch_files", "Batch files", "batch files", 0],
    ["max_batch_file_bytes", "Batch file bytes", "batch file bytes", 0],
    ["max_batches_in_flight", "Batches in flight", "batches in flight", 0],
    ["batch_tokens_per_day", "Batch tokens / day (UTC)", "batch tokens/day", 1],
  ]],
  ["Per request", [
    ["max_n", "Choices (n)", "n", 1],
    ["max_prompts_per_request", "Prompts", "prompts/request", 1],
    ["max_tokens_per_request", "max_tokens", "max_tokens/request", 1],
    ["max_sequences_per_request", "Sequences (n x prompts)", "sequences/request", 1],
  ]],
];
const LIMITS = LIMIT_GROUPS.flatMap(([, fields]) => fields);
// [TenantLimits field, label, short name]: the text limits (a name, not a number).
export const TEXT_LIMITS = [
  ["slo_class", "SLO class (empty: the plan's)", "class"],
];

// BaseLimits: a tenant's extra limits on one base model, on top of the tenant-wide ones.
export const BASE_LIMITS = LIMITS.filter(([key]) =>
  ["requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "monthly_token_budget"].includes(key));

function numberInput(key, least, attrs) {
  return h("input", { type: "number", min: least, max: key === "priority" ? 100 : null, step: 1,
    inputmode: "numeric", "data-limit": key, ...attrs });
}

// The tenant-wide inputs, #<prefix>-<field>, one fieldset per group.
export function limitInputs(fieldset, prefix) {
  for (const [legend, fields] of LIMIT_GROUPS) {
    fieldset.append(h("fieldset", { class: "limit-group" }, h("legend", {}, legend),
      fields.map(([key, label, , least]) => h("label", {}, label,
        numberInput(key, least, { id: `${prefix}-${key}` })))));
  }
  fieldset.append(h("fieldset", { class: "limit-group" }, h("legend", {}, "Latency"),
    TEXT_LIMITS.map(([key, label]) => h("label", {}, label,
      h("input", { type: "text", maxlength: 64, "data-limit": key, id: `${prefix}-${key}` })))));
}

// One fieldset per base model (base names may hold '.', so no ids: [data-base][data-limit]).
export function baseLimitInputs(container, bases, own = {}) {
  container.replaceChildren(...bases.map((base) => h("fieldset", { class: "limit-group", "data-base": base },
    h("legend", {}, `On ${base} (on top of the above)`),
    BASE_LIMITS.map(([key, label, , least]) => {
      const v = (own[base] || {})[key];
      return h("label", {}, label, numberInput(key, least, { "data-base": base, "aria-label": `${label} on ${base}`,
        value: v === null || v === undefined ? null : v }));
    }))));
  container.hidden = bases.length === 0;
}

export function fillLimits(prefix, limits) {
  for (const [key] of [...LIMITS, ...TEXT_LIMITS]) {
    const v = limits[key];
    $(`#${prefix}-${key}`).value = v === null || v === undefined || (key === "priority" && v === 0) ? "" : v;
  }
}

// The limits the form says. clearEmpty (a PATCH): an empty field is sent as null, which clears
// the tenant's own (the plan's applies again), and a base whose fields are all empty is cleared
// if the tenant had limits on it (`had`); a create leaves empty fields out.
export function readLimits(prefix, baseContainer, { clearEmpty, had = {} }) {
  const limits = {};
  for (const [key] of LIMITS) {
    const raw = $(`#${prefix}-${key}`).value.trim();
    if (raw !== "") limits[key] = Number(raw);
    else if (clearEmpty) limits[key] = key === "priority" ? 0 : null;
  }
  for (const [key] of TEXT_LIMITS) {
    const raw = $(`#${prefix}-${key}`).value.trim();
    if (raw !== "") limits[key] = raw;
    else if (clearEmpty) limits[key] = null;
  }
  const models = {};
  for (const group of baseContainer.querySelectorAll("fieldset[data-base]")) {
    const base = group.dataset.base;
    const own = {};
    for (const input of group.querySelectorAll("input[data-limit]")) {
      const raw = input.value.trim();
      if (raw !== "") own[input.dataset.limit] = Number(raw);
      else if (clearEmpty) own[input.dataset.limit] = null;
    }
    if (Object.values(own).some((v) => v !== null)) models[base] = own;
    else if (clearEmpty && had[base]) models[base] = null;
  }
  if (Object.keys(models).length) limits.models = models;
  return limits;
}

const SHORT = Object.fromEntries([...LIMITS, ...TEXT_LIMITS].map(([key, , short]) => [key, short]));

// "rpm 30, tpm 5,000, on <base>: rpm 10" or "unlimited".
export function limitsText(limits) {
  const parts = Object.entries(limits)
    .filter(([k, v]) => k !== "models" && v !== null && !(k === "priority" && v === 0))
    .map(([k, v]) => `${SHORT[k] || k} ${typeof v === "string" ? v : number(v)}`);
  for (const [base, own] of Object.entries(limits.models || {})) {
    const text = limitsText(own || {});
    if (text !== "unlimited") parts.push(`on ${base}: ${text}`);
  }
  return parts.length ? parts.join(", ") : "unlimited";
}
