// rayward view: the page's script (plain JavaScript, no build step). It fetches the server's JSON endpoints
// (orchestrator/view/server.py), draws the curves with uPlot, and polls to follow a running run: each poll asks
// only for the metric rows after those it has.
"use strict";

// How often a poll asks for new rows and steps: a step of a small run takes a second or two.
const POLL_MS = 2000;
// Groups drawn at once; a larger step shows a button for the rest (thousands of rows would slow the page).
const MAX_GROUPS_SHOWN = 48;
// Sampling log-prob (nats) at which a token's shade is full: a token the sampler gave under ~2% chance.
const LOGPROB_FULL = 4;
// Learner-sampler log-prob gap (nats) at which the difference shading is full.
const GAP_FULL = 0.5;
// Totals this close count as equal when marking a group with no spread (float noise in the aggregation).
const SPREAD_EPS = 1e-9;
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
                 "#4b5563", "#65a30d", "#7c3aed", "#0d9488"];
const DASHES = [[], [6, 4], [2, 3], [10, 3, 2, 3]];  // one per run: run 0 solid, run 1 dashed, ...
// The phases in plot.py's order; others follow, sorted.
const PHASE_ORDER = ["step", "generate", "wait_rollouts", "reward", "train", "sync", "train_compute"];

const PANELS = [
  {id: "reward", title: "reward (total, and each reward function's mean)",
   keys: ks => ["reward", ...ks.filter(k => /^rewards\/[^/]+\/mean$/.test(k))]},
  {id: "eval", title: "eval: reward and pass@k",
   keys: ks => ks.filter(k => k === "eval/reward" || /^eval\/pass@\d+$/.test(k) || /^eval\/rewards\/[^/]+\/mean$/.test(k))},
  {id: "gates", title: "gates: fraction closed", keys: ks => ks.filter(k => /^gates\/.+\/closed_frac$/.test(k))},
  {id: "kl", title: "KL to the reference", keys: () => ["kl"]},
  {id: "entropy", title: "entropy", keys: () => ["entropy"]},
  {id: "length", title: "completion length (tokens)",
   keys: () => ["completions/mean_length", "completions/min_length", "completions/max_length"]},
  {id: "time", title: "phase times (s)", keys: ks => phaseKeys(ks)},
];

const S = {  // the page's state (window.__viewer, for tests and the console)
  runs: [],          // from /api/runs
  metrics: [],       // per run: {epoch, steps: [], cols: {key: []}, n, byStep: Map(step -> [row indices])}
  charts: new Map(), // panel id -> {plot, keys, el}
  custom: [],        // metric keys the user added as charts
  sampleRun: 0,
  steps: [],         // the sample run's steps with samples
  tokenSteps: new Set(),
  hasTokens: false,
  step: null,
  follow: true,
  data: null,        // /samples of the shown step
  openTokens: new Set(),
  shade: "sampling",
  showAllGroups: false,
};
window.__viewer = S;

const $ = id => document.getElementById(id);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
};

async function getJSON(url) {
  const r = await fetch(url, {cache: "no-store"});
  if (!r.ok) throw new Error(`${url}: ${r.status} ${await r.text()}`);
  return r.json();
}

function fmt(v, digits = 4) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : v.toPrecision(digits).replace(/\.?0+$/, "");
}

function phaseKeys(keys) {
  const found = new Set(keys.filter(k => k.startsWith("time/")).map(k => k.slice(5)));
  const ordered = PHASE_ORDER.filter(p => found.has(p));
  const rest = [...found].filter(p => !PHASE_ORDER.includes(p)).sort();
  return [...ordered, ...rest].map(p => "time/" + p);
}

// --- metrics: rows by column, merged per step --------------------------------------------------------------

function emptyMetrics() { return {epoch: -1, steps: [], cols: {}, n: 0, byStep: new Map()}; }

// Append a /metrics payload (rows from `since` on) to a run's columns.
function addRows(m, p) {
  if (p.epoch !== m.epoch || p.since === 0 && m.n > 0) Object.assign(m, emptyMetrics(), {epoch: p.epoch});
  const k = p.steps.length;
  for (const key of Object.keys(p.cols)) if (!(key in m.cols)) m.cols[key] = new Array(m.n).fill(null);
  for (const [key, col] of Object.entries(m.cols)) {
    const add = p.cols[key];
    for (let i = 0; i < k; i++) col.push(add ? add[i] : null);
  }
  for (let i = 0; i < k; i++) {
    const s = p.steps[i];
    if (!m.byStep.has(s)) m.byStep.set(s, []);
    m.byStep.get(s).push(m.n + i);
  }
  m.steps.push(...p.steps);
  m.n += k;
  return k;
}

// A key's value at a step: the last row of that step that has it (an eval row shares its step with the
// training row; a rewound run logs a step again, and the later row is the one trained on).
function valueAt(m, key, step) {
  const col = m.cols[key], rows = m.byStep.get(step);
  if (!col || !rows) return null;
  for (let j = rows.length - 1; j >= 0; j--) if (col[rows[j]] !== null) return col[rows[j]];
  return null;
}

function allKeys() {
  const seen = new Set();
  for (const m of S.metrics) for (const k of Object.keys(m.cols)) seen.add(k);
  return [...seen];
}

// --- charts ------------------------------------------------------------------------------------------------

function chartPanels() {
  const keys = allKeys();
  const out = [];
  for (const p of PANELS) {
    const ks = p.keys(keys).filter(k => keys.includes(k));
    if (ks.length) out.push({id: p.id, title: p.title, keys: ks});
  }
  for (const k of S.custom) out.push({id: "custom:" + k, title: k, keys: [k], custom: true});
  return out;
}

function shortName(key) {
  return key.replace(/^rewards\/([^/]+)\/mean$/, "$1").replace(/^eval\/rewards\/([^/]+)\/mean$/, "eval $1")
    .replace(/^completions\/(\w+)_length$/, "$1").replace(/^time\/step$/, "whole step").replace(/^time\//, "").replace(/^gates\/(.+)\/closed_frac$/, "$1");
}

// uPlot's data for a panel: x = every step any run has, one series per (run, key), null where absent.
function panelData(keys) {
  const xs = new Set();
  for (const m of S.metrics) for (const s of m.byStep.keys()) xs.add(s);
  const x = [...xs].sort((a, b) => a - b);
  const data = [x];
  S.metrics.forEach(m => { for (const k of keys) data.push(x.map(s => valueAt(m, k, s))); });
  return data;
}

function panelWidth(container) {
  return Math.max(300, Math.floor(container.getBoundingClientRect().width));
}

function makeChart(panel) {
  const box = el("div", {class: "panel", "data-panel": panel.id},
    el("h3", {text: panel.title}),
    panel.custom ? el("button", {class: "close", title: "remove this chart", text: "×", onclick: () => {
      S.custom = S.custom.filter(k => "custom:" + k !== panel.id);
      drawCharts();
    }}) : null);
  $("charts").append(box);
  const series = [{label: "step", value: (u, v) => v === null ? "–" : v}];
  S.metrics.forEach((m, r) => panel.keys.forEach((k, i) => series.push({
    label: (S.runs.length > 1 ? S.runs[r].name + ": " : "") + shortName(k),
    stroke: PALETTE[i % PALETTE.length], dash: DASHES[r % DASHES.length], width: k === "reward" ? 2 : 1.5,
    spanGaps: true, value: (u, v) => fmt(v), points: {size: 4},
  })));
  const opts = {
    width: panelWidth(box), height: 170, series,
    scales: {x: {time: false}},
    cursor: {sync: {key: "rayward"}, drag: {x: true, y: false}},
    legend: {live: true},
    axes: [{size: 28, values: (u, vals) => vals.map(v => Number.isInteger(v) ? v : "")},
           {size: 48, values: (u, vals) => vals.map(v => fmt(v, 3))}],
  };
  const plot = new uPlot(opts, panelData(panel.keys), box);
  return {plot, keys: panel.keys, el: box, sig: panel.keys.join("|") + "#" + S.metrics.length};
}

// (Re)build the panels whose series changed, update the data of the others (keeping a zoom the user made).
function drawCharts() {
  const panels = chartPanels();
  const wanted = new Set(panels.map(p => p.id));
  for (const [id, c] of S.charts) if (!wanted.has(id)) { c.plot.destroy(); c.el.remove(); S.charts.delete(id); }
  for (const p of panels) {
    const c = S.charts.get(p.id);
    const sig = p.keys.join("|") + "#" + S.metrics.length;
    if (c && c.sig === sig) {
      const data = panelData(p.keys), x = data[0], sc = c.plot.scales.x;
      const zoomed = sc.min != null && c.plot.data[0].length &&
        (sc.min > c.plot.data[0][0] || sc.max < c.plot.data[0][c.plot.data[0].length - 1]);
      c.plot.setData(data, !zoomed);
      if (zoomed && x.length) c.plot.redraw();
    } else {
      if (c) { c.plot.destroy(); c.el.remove(); }
      S.charts.set(p.id, makeChart(p));
    }
  }
  // panels in the order chartPanels gives
  for (const p of panels) $("charts").append(S.charts.get(p.id).el);
  fillAddChart();
}

function fillAddChart() {
  const sel = $("add-chart"), shown = new Set(chartPanels().flatMap(p => p.keys));
  const keys = allKeys().filter(k => !shown.has(k)).sort();
  if (sel.options.length - 1 === keys.length) return;
  sel.replaceChildren(el("option", {value: "", text: `metric… (${keys.length} more)`}),
    ...keys.map(k => el("option", {value: k, text: k})));
}

window.addEventListener("resize", () => {
  for (const c of S.charts.values()) c.plot.setSize({width: panelWidth(c.el), height: 170});
});

// --- header ------------------------------------------------------------------------------------------------

function drawRuns() {
  $("runs").replaceChildren(...S.runs.map((r, i) => el("span", {class: "run-chip", title: r.dir},
    S.runs.length > 1 ? el("span", {class: "dash", style: `border-top-style: ${["solid", "dashed", "dotted"][i % 3]}`})
      : null,
    el("b", {text: r.name}))));
}

function drawStatus(updated) {
  const parts = S.runs.map((r, i) => {
    const m = S.metrics[i];
    const last = m.steps.length ? Math.max(...m.byStep.keys()) : null;
    const age = updated[i] == null ? "" : ` · written ${Math.round(updated[i])} s ago`;
    return `${r.name}: ${last === null ? "no steps yet" : "step " + last}${r.max_steps ? "/" + r.max_steps : ""}${age}`;
  });
  $("status").textContent = parts.join("  |  ");
}

// --- samples -----------------------------------------------------------------------------------------------

function rewardNames(rows) {
  const names = new Set();
  for (const r of rows) for (const k of Object.keys(r)) if (k.startsWith("rewards/")) names.add(k.slice(8));
  return [...names];
}

function rowText(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "string") return v;
  if (Array.isArray(v)) return v.map(m => (m && typeof m === "object") ? partsText(m.content) + " " +
    (m.tool_calls || []).map(c => JSON.stringify(c)).join(" ") : String(m)).join("\n");
  return JSON.stringify(v);
}

function partsText(c) {
  if (typeof c === "string") return c;
  if (Array.isArray(c)) return c.map(p => p && p.type === "text" ? p.text : "").join(" ");
  return c === null || c === undefined ? "" : JSON.stringify(c);
}

function imageSrc(path) { return `api/run/${S.sampleRun}/file/${encodeURI(path)}`; }

// A message's content: text, or content parts with images inline.
function contentNode(c) {
  if (Array.isArray(c)) {
    const span = el("span");
    for (const p of c) {
      if (p && p.type === "image" && typeof p.image === "string") span.append(el("img", {class: "inline", src: imageSrc(p.image), alt: p.image, loading: "lazy"}));
      else if (p && p.type === "text") span.append(p.text);
      else span.append(JSON.stringify(p));
    }
    return span;
  }
  return document.createTextNode(typeof c === "string" ? visibleText(c) : c == null ? "" : JSON.stringify(c));
}

// Control characters (a tiny model writes them) escaped, as `rayward samples` shows them; newlines and tabs kept.
function visibleText(t) {
  return t.replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, c => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
}

function promptNode(prompt) {
  const box = el("div", {class: "prompt", title: "click to show all of it"});
  box.addEventListener("click", () => box.classList.toggle("open"));
  if (Array.isArray(prompt)) {
    for (const m of prompt) box.append(el("div", {class: "msg"}, el("span", {class: "role", text: m.role || ""}), contentNode(m.content)));
  } else box.append(el("div", {class: "msg"}, contentNode(prompt)));
  return box;
}

function callText(call) {
  const fn = call.function || call;
  const args = typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments ?? {});
  return `→ ${fn.name}(${args})`;
}

// A completion: its text, or (a conversation) turn by turn with the tool calls and results.
function completionNode(c) {
  const box = el("div", {class: "ctext", title: "click to show all of it"});
  box.addEventListener("click", () => box.classList.toggle("open"));
  if (Array.isArray(c) && c.length && typeof c[0] === "object") {
    if (c.length === 1 && !c[0].tool_calls) { box.append(contentNode(c[0].content)); return box; }
    for (const m of c) {
      if (m.role === "tool") {
        box.append(el("div", {class: "turn tool"}, `← ${m.name || "tool"}: `, contentNode(m.content)));
      } else {
        const turn = el("div", {class: "turn"});
        if (m.content && (typeof m.content !== "string" || m.content.length)) turn.append(contentNode(m.content));
        for (const call of m.tool_calls || []) turn.append(el("div", {class: "call", text: callText(call)}));
        box.append(turn);
      }
    }
    return box;
  }
  box.append(contentNode(c));
  return box;
}

function groupsOf(rows) {
  const groups = new Map();
  rows.forEach((r, i) => {
    const key = r.prompt_index ?? JSON.stringify(r.prompt);
    if (!groups.has(key)) groups.set(key, {key, prompt: r.prompt, rows: []});
    groups.get(key).rows.push({...r, sample: i});
  });
  for (const g of groups.values()) {
    const t = g.rows.map(r => r.total).filter(v => typeof v === "number");
    g.mean = t.length ? t.reduce((a, b) => a + b, 0) / t.length : null;
    g.std = t.length ? Math.sqrt(t.reduce((a, b) => a + (b - g.mean) ** 2, 0) / t.length) : null;
    g.flat = t.length > 1 && Math.max(...t) - Math.min(...t) <= SPREAD_EPS;
  }
  return [...groups.values()];
}

function filters() {
  const num = id => { const v = $(id).value.trim(); return v === "" ? null : Number(v); };
  return {min: num("f-min"), max: num("f-max"), stop: $("f-stop").value, spread: $("f-spread").value,
          text: $("f-text").value.trim().toLowerCase()};
}

function keepRow(r, f) {
  if (f.min !== null && !(r.total >= f.min)) return false;
  if (f.max !== null && !(r.total <= f.max)) return false;
  if (f.stop && String(r.stop_reason ?? "") !== f.stop) return false;
  if (f.text && !(rowText(r.prompt) + "\n" + rowText(r.completion)).toLowerCase().includes(f.text)) return false;
  return true;
}

function numCell(v, cls = "") {
  const c = typeof v === "number" && cls === "adv" ? (v > 0 ? "pos" : v < 0 ? "neg" : "") : "";
  return el("td", {class: c, text: fmt(v)});
}

function drawSamples() {
  const d = S.data, box = $("groups");
  if (!d) { box.replaceChildren(); return; }
  if (d.step === null) { box.replaceChildren(el("div", {class: "note", text: "No samples yet (completions.jsonl is empty or absent: logging.log_completions false?)."})); return; }
  const names = rewardNames(d.rows), f = filters(), recorded = new Set(d.tokens);
  const stops = [...new Set(d.rows.map(r => r.stop_reason).filter(s => s != null))].sort();
  const stopSel = $("f-stop"), keepStop = stopSel.value;
  stopSel.replaceChildren(el("option", {value: "", text: "any"}), ...stops.map(s => el("option", {value: s, text: s})));
  stopSel.value = stops.includes(keepStop) ? keepStop : "";
  const agentic = d.rows.some(r => "stop_reason" in r);
  let groups = groupsOf(d.rows);
  const nFlat = groups.filter(g => g.flat).length;
  if (f.spread) groups = groups.filter(g => (f.spread === "flat") === g.flat);
  let shown = 0;
  const cards = [];
  for (const g of groups) {
    const rows = g.rows.filter(r => keepRow(r, f));
    if (!rows.length) continue;
    shown += rows.length;
    if (cards.length >= MAX_GROUPS_SHOWN && !S.showAllGroups) continue;
    cards.push(groupCard(g, rows, names, agentic, recorded));
  }
  if (cards.length < groups.length && !S.showAllGroups && groups.length > MAX_GROUPS_SHOWN) {
    cards.push(el("button", {text: `show all ${groups.length} groups`, onclick: () => { S.showAllGroups = true; drawSamples(); }}));
  }
  box.replaceChildren(...cards);
  $("sample-count").textContent = `step ${d.step}: ${shown} of ${d.rows.length} samples shown, ${groupsOf(d.rows).length} groups, ` +
    `${nFlat} without spread`;
  for (const key of S.openTokens) {
    const [step, sample] = key.split(":").map(Number);
    if (step === d.step) showTokens(sample);
  }
}

function groupCard(g, rows, names, agentic, recorded) {
  const head = el("div", {class: "ghead"},
    el("b", {text: `prompt ${g.key}`.slice(0, 40)}),
    el("span", {text: `${g.rows.length} samples · mean total ${fmt(g.mean)} · std ${fmt(g.std)}`}),
    g.flat ? el("span", {class: "badge", title: "every completion got the same total: advantages are all 0, GRPO learns nothing from this group",
                         text: "no spread: nothing to learn"}) : null);
  const th = (t, cls = "") => el("th", {class: cls, text: t});
  const table = el("table", {class: "rows"},
    el("thead", {}, el("tr", {}, th("#"), th("completion", "c"), ...names.map(n => th(n)), th("total"),
      th("advantage"), agentic ? th("stop") : null, th("length"), th("version"), th("tokens"))));
  const body = el("tbody");
  for (const r of rows) {
    const tr = el("tr", {"data-sample": r.sample});
    tr.append(el("td", {text: String(r.sample)}), el("td", {class: "c"}, completionNode(r.completion)));
    for (const n of names) {
      const raw = r["rewards/" + n], gated = r["gated/" + n];
      const td = el("td", {class: "reward", text: fmt(raw)});
      if (gated !== undefined && gated !== raw) td.append(el("span", {class: "gated", title: "after its gate", text: "gated " + fmt(gated)}));
      tr.append(td);
    }
    tr.append(numCell(r.total), numCell(r.advantage, "adv"));
    if (agentic) tr.append(el("td", {text: r.stop_reason ?? "–", title: r.turns != null ? `${r.turns} turns, ${r.tool_calls} tool calls, ${r.tool_failures} failed` : ""}));
    tr.append(lengthCell(r), el("td", {text: fmt(r.policy_version)}));
    const tokTd = el("td");
    if (recorded.has(r.sample)) {
      const on = S.openTokens.has(`${S.data.step}:${r.sample}`);
      tokTd.append(el("button", {class: "tokbtn" + (on ? " on" : ""), text: "tokens", title: "token view: log-probs per token",
        onclick: () => toggleTokens(r.sample)}));
    }
    tr.append(tokTd);
    body.append(tr);
  }
  table.append(body);
  return el("div", {class: "group" + (g.flat ? " flat" : ""), "data-group": g.key}, head, promptNode(g.prompt), table);
}

// Tokens where the row says (completion_length), else characters of what the model wrote (a conversation's
// assistant messages and their tool calls; not the tool results).
function lengthCell(r) {
  if (typeof r.completion_length === "number") return el("td", {text: String(r.completion_length), title: "tokens"});
  const c = r.completion;
  const text = Array.isArray(c) ? c.filter(m => m && m.role !== "tool").map(m => partsText(m.content) +
    (m.tool_calls || []).map(callText).join("")).join("") : rowText(c);
  return el("td", {class: "muted", text: `${text.length} ch`, title: "characters (the completions log has no token count)"});
}

// --- the token view ----------------------------------------------------------------------------------------

function toggleTokens(sample) {
  const key = `${S.data.step}:${sample}`;
  if (S.openTokens.has(key)) { S.openTokens.delete(key); document.querySelector(`tr.tokrow[data-sample="${sample}"]`)?.remove(); }
  else { S.openTokens.add(key); showTokens(sample); }
  document.querySelectorAll(`tr[data-sample="${sample}"] button.tokbtn`).forEach(b => b.classList.toggle("on", S.openTokens.has(key)));
}

async function showTokens(sample) {
  const step = S.data.step, run = S.sampleRun;
  const rec = await getJSON(`api/run/${run}/tokens?step=${step}&sample=${sample}`);
  if (!S.data || S.data.step !== step || S.sampleRun !== run) return;
  const tr = document.querySelector(`#groups tr[data-sample="${sample}"]:not(.tokrow)`);
  if (!tr) return;
  document.querySelector(`tr.tokrow[data-sample="${sample}"]`)?.remove();
  const row = el("tr", {class: "tokrow", "data-sample": sample});
  row.append(el("td", {colspan: tr.children.length}, tokenView(rec)));
  tr.after(row);
}

function shadeOf(rec, i) {
  if (rec.mask[i] === 0) return "";
  if (S.shade === "gap" && rec.learner_logprobs) {
    const a = rec.learner_logprobs[i], b = rec.logprobs[i];
    if (a === null || b === null) return "";
    return `rgba(37, 99, 235, ${Math.min(1, Math.abs(a - b) / GAP_FULL) * 0.85})`;
  }
  const lp = rec.logprobs[i];
  if (lp === null) return "";
  return `rgba(234, 88, 12, ${Math.min(1, -lp / LOGPROB_FULL) * 0.85})`;
}

function visibleToken(t) {
  return visibleText(t).replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

function tokenView(rec) {
  const n = rec.ids.length, inLoss = rec.mask.reduce((a, b) => a + b, 0);
  const haveLearner = Array.isArray(rec.learner_logprobs);
  const modeSel = el("select", {class: "shade"},
    el("option", {value: "sampling", text: "sampling log-prob"}),
    haveLearner ? el("option", {value: "gap", text: "|learner − sampling|"}) : null);
  modeSel.value = haveLearner ? S.shade : "sampling";
  modeSel.addEventListener("change", () => { S.shade = modeSel.value; for (const k of S.openTokens) { const [st, sm] = k.split(":").map(Number); if (st === S.data.step) showTokens(sm); } });
  const scale = S.shade === "gap" && haveLearner
    ? ["linear-gradient(90deg, rgba(37,99,235,0), rgba(37,99,235,.85))", `0 … ${GAP_FULL} nats`]
    : ["linear-gradient(90deg, rgba(234,88,12,0), rgba(234,88,12,.85))", `log-prob 0 … −${LOGPROB_FULL}`];
  const head = el("div", {class: "tokhead"},
    el("b", {text: `step ${rec.step}, sample ${rec.sample}`}),
    el("span", {text: `${rec.length ?? n} token${(rec.length ?? n) === 1 ? "" : "s"}${rec.length ? ` (first ${n} recorded)` : ""}, ${inLoss} in the loss`}),
    el("label", {}, "shade ", modeSel),
    el("span", {}, el("span", {class: "scale", style: `background: ${scale[0]}`}), " " + scale[1]),
    el("span", {class: "tok out", text: "not in the loss"}),
    haveLearner ? null : el("span", {text: "learner log-probs not recorded"}));
  const toks = el("div", {class: "toks"});
  for (let i = 0; i < n; i++) {
    const span = el("span", {class: "tok" + (rec.mask[i] === 0 ? " out" : ""), "data-i": i});
    span.textContent = visibleToken(rec.tokens[i] ?? "");
    const bg = shadeOf(rec, i);
    if (bg) span.style.background = bg;
    toks.append(span);
  }
  toks.addEventListener("mousemove", e => tokenTip(e, rec));
  toks.addEventListener("mouseleave", () => { $("tip").hidden = true; });
  return el("div", {class: "tokview"}, head, toks);
}

function tokenTip(e, rec) {
  const t = e.target.closest(".tok"), tip = $("tip");
  if (!t) { tip.hidden = true; return; }
  const i = Number(t.dataset.i), lp = rec.logprobs[i];
  const lines = [`token ${i}: ${JSON.stringify(rec.tokens[i])}  id ${rec.ids[i]}`];
  if (rec.mask[i] === 0) lines.push("not in the loss (tool result or template scaffold)");
  lines.push(`sampling log-prob ${fmt(lp)}` + (lp === null ? "" : `  (p ${fmt(Math.exp(lp), 3)})`));
  if (rec.learner_logprobs) {
    const l = rec.learner_logprobs[i];
    lines.push(`learner log-prob  ${fmt(l)}`);
    if (l !== null && lp !== null) lines.push(`learner − sampling ${fmt(+(l - lp).toFixed(3))}`);
  }
  if (rec.versions) lines.push(`policy version ${rec.versions[i]}`);
  tip.textContent = lines.join("\n");
  tip.hidden = false;
  tip.style.left = Math.min(e.clientX + 12, window.innerWidth - 430) + "px";
  const below = e.clientY + 16;  // under the pointer, or above it near the window's bottom
  tip.style.top = (below + tip.offsetHeight > window.innerHeight ? e.clientY - tip.offsetHeight - 8 : below) + "px";
}

// --- loading and following ---------------------------------------------------------------------------------

async function loadSamples(step) {
  const run = S.sampleRun;
  const d = await getJSON(`api/run/${run}/samples` + (step === null ? "" : `?step=${step}`));
  if (run !== S.sampleRun) return;
  if (!S.data || S.data.step !== d.step) S.showAllGroups = false;
  S.data = d;
  S.step = d.step;
  drawStepSelect();
  drawSamples();
}

function drawStepSelect() {
  const sel = $("step");
  if (sel.options.length !== S.steps.length || (S.steps.length && Number(sel.options[sel.options.length - 1].value) !== S.steps[S.steps.length - 1])) {
    sel.replaceChildren(...S.steps.map(s => el("option", {value: s, text: String(s) + (S.tokenSteps.has(s) ? " ·tokens" : "")})));
  }
  if (S.step !== null) sel.value = String(S.step);
}

async function pollSteps() {
  const st = await getJSON(`api/run/${S.sampleRun}/steps`);
  const latest = st.steps.length ? st.steps[st.steps.length - 1] : null;
  const grew = latest !== (S.steps.length ? S.steps[S.steps.length - 1] : null);
  S.steps = st.steps;
  S.tokenSteps = new Set(st.token_steps);
  S.hasTokens = st.tokens;
  const note = $("token-note");
  note.hidden = S.hasTokens;
  note.textContent = "This run has no token record (tokens.jsonl): no token view. The run writes one with logging.token_samples > 0.";
  if (grew || S.data === null) {
    if (S.follow || S.data === null || S.data.step === null) await loadSamples(latest);
    else drawStepSelect();
  }
}

async function pollMetrics() {
  let added = 0;
  const updated = [];
  await Promise.all(S.runs.map(async (r, i) => {
    const m = S.metrics[i];
    const p = await getJSON(`api/run/${i}/metrics?since=${m.n}&epoch=${m.epoch}`);
    added += addRows(m, p);
    updated[i] = p.updated_s;
  }));
  if (added || S.charts.size === 0) drawCharts();
  drawStatus(updated);
}

async function poll() {
  if (!document.hidden) {
    try { await Promise.all([pollMetrics(), pollSteps()]); }
    catch (err) { $("status").textContent = "lost the server: " + err.message; }
  }
  setTimeout(poll, POLL_MS);
}

function bindControls() {
  $("step").addEventListener("change", e => { S.follow = false; $("follow").checked = false; loadSamples(Number(e.target.value)); });
  const move = d => {
    const i = S.steps.indexOf(S.step) + d;
    if (i >= 0 && i < S.steps.length) { S.follow = i === S.steps.length - 1 && S.follow; if (!S.follow) $("follow").checked = false; loadSamples(S.steps[i]); }
  };
  $("step-prev").addEventListener("click", () => move(-1));
  $("step-next").addEventListener("click", () => move(1));
  $("follow").addEventListener("change", e => { S.follow = e.target.checked; if (S.follow && S.steps.length) loadSamples(S.steps[S.steps.length - 1]); });
  for (const id of ["f-min", "f-max", "f-stop", "f-spread", "f-text"]) $(id).addEventListener("input", drawSamples);
  $("add-chart").addEventListener("change", e => {
    if (e.target.value && !S.custom.includes(e.target.value)) S.custom.push(e.target.value);
    e.target.value = "";
    drawCharts();
  });
  $("sample-run").addEventListener("change", e => {
    S.sampleRun = Number(e.target.value);
    S.data = null; S.steps = []; S.openTokens.clear();
    pollSteps();
  });
}

async function start() {
  S.runs = await getJSON("api/runs");
  S.metrics = S.runs.map(emptyMetrics);
  drawRuns();
  $("sample-run").replaceChildren(...S.runs.map((r, i) => el("option", {value: i, text: r.name})));
  $("sample-run-label").hidden = S.runs.length < 2;
  bindControls();
  await pollMetrics();
  // first paint: the curves are drawn (the samples follow)
  performance.mark("rayward-ready");
  window.__ready = true;
  await pollSteps();
  setTimeout(poll, POLL_MS);
}

start().catch(err => { $("status").textContent = "failed to load: " + err.message; });
