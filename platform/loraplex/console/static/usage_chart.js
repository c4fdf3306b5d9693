// The usage chart: tokens per group as bars (prompt, cached prompt, completion) and cost on its
// own axis, one point per label: per UTC day, every day of the range (days without requests are
// 0) and cost as a line; per base model or adapter, one bar group each and cost as points (a line
// between two models would mean nothing).
// Chart.js (vendor/chart.umd.min.js, a classic script) defines the global `Chart`.
import { addDays } from "./ui.js";

const COLORS = {
  prompt: "#1f5fa8", // dark enough for 4.5:1 on white (WCAG AA for the legend text beside it)
  cached: "#6a8fbf",
  completion: "#b5540b",
  cost: "#1d6b3a",
};

export function daysBetween(start, end) {
  const days = [];
  for (let d = start; d <= end && days.length < 400; d = addDays(d, 1)) days.push(d);
  return days;
}

// labels: the group keys to show, in order (report.rows' keys under report.group_by).
export function renderUsageChart(canvas, report, labels) {
  const byKey = new Map(report.rows.map((r) => [r[report.group_by], r]));
  const series = (field) => labels.map((k) => (byKey.has(k) ? Number(byKey.get(k)[field]) : 0));
  const overTime = report.group_by === "day" || report.group_by === "hour";
  const data = {
    labels,
    datasets: [
      { type: "bar", label: "Prompt tokens", data: series("prompt_tokens"), backgroundColor: COLORS.prompt, yAxisID: "tokens" },
      { type: "bar", label: "Cached prompt tokens", data: series("cached_prompt_tokens"), backgroundColor: COLORS.cached, yAxisID: "tokens" },
      { type: "bar", label: "Completion tokens", data: series("completion_tokens"), backgroundColor: COLORS.completion, yAxisID: "tokens" },
      { type: "line", label: `Cost (${report.currency})`, data: series("cost"), borderColor: COLORS.cost,
        backgroundColor: COLORS.cost, yAxisID: "cost", tension: 0.2, showLine: overTime, pointRadius: overTime ? 3 : 6 },
    ],
  };
  const existing = Chart.getChart(canvas);
  if (existing) {
    existing.data = data;
    existing.options.scales.cost.title.text = report.currency;
    existing.update();
    return existing;
  }
  return new Chart(canvas, {
    data,
    options: {
      responsive: true,
      maintainAspectRatio: false,
      animation: false,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { labels: { color: "#1a1a1a" } } },
      scales: {
        x: { ticks: { color: "#333" } },
        tokens: { type: "linear", position: "left", beginAtZero: true, title: { display: true, text: "tokens" },
                  ticks: { color: "#333" } },
        cost: { type: "linear", position: "right", beginAtZero: true, grid: { drawOnChartArea: false },
                title: { display: true, text: report.currency },
                // Small amounts as decimals (0.00003), not 3.000000E-5.
                ticks: { color: "#333", callback: (v) => Number(v).toLocaleString("en-US", { maximumSignificantDigits: 3, maximumFractionDigits: 10 }) } },
      },
    },
  });
}
