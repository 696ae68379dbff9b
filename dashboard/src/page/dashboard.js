// Stoker dashboard: polls /api/jobs, keeps each job's series, and draws the charts on canvas.
// Every number shown is the API's value printed with toFixed at the API's rounding, so a test
// can read the page's figures back by element id and compare them with the API exactly.
"use strict";

const STAGES = ["read", "decode", "augment", "assemble"];
const STAGE_COLORS = { read: "#0ea5e9", decode: "#ef4444", augment: "#f59e0b", assemble: "#8b5cf6" };
const TRAINER_COLOR = "#10b981";
const jobs = new Map(); // key -> { series: [], elements }
let lastT = 0;
let pollMs = 1000;
let historyMs = 600000;

function fixed(value, digits) {
  return value === null || value === undefined ? "\u2013" : value.toFixed(digits);
}

function el(tag, attrs, children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  for (const child of children || []) node.appendChild(child);
  return node;
}

function figure(key, id, label, unit) {
  return el("div", { class: "figure" }, [
    el("div", { class: "label", text: label }),
    el("div", {}, [
      el("span", { class: "value", id: `job-${key}-${id}`, text: "\u2013" }),
      el("span", { class: "unit", text: unit }),
    ]),
  ]);
}

function chart(key, id, title) {
  return el("div", { class: "chart" }, [
    el("h3", { text: title }),
    el("canvas", { id: `job-${key}-chart-${id}` }),
  ]);
}

function createCard(job) {
  const key = job.key;
  const card = el("section", { class: "job", id: `job-${key}` }, [
    el("div", { class: "job-head" }, [
      el("h2", {}, [
        document.createTextNode(job.name),
        el("span", { class: "rank", text: `rank ${job.rank}` }),
      ]),
      el("span", { class: "updated", id: `job-${key}-t`, "data-t-ms": "", text: "no reading yet" }),
    ]),
    el("div", { class: "verdict-line", id: `job-${key}-verdict-line` }, [
      el("span", { class: "verdict", id: `job-${key}-verdict`, text: job.verdict }),
      el("span", { class: "verdict-detail" }, [
        document.createTextNode("host wait "),
        el("span", { id: `job-${key}-window-stall`, text: "\u2013" }),
        document.createTextNode("% \u00b7 GPU idle "),
        el("span", { id: `job-${key}-window-gpu-idle`, text: "\u2013" }),
        document.createTextNode("% \u00b7 GPU decode beside the step "),
        el("span", { id: `job-${key}-window-lane-cost`, text: "\u2013" }),
        document.createTextNode("% over the last "),
        el("span", { id: `job-${key}-window-seconds`, text: "\u2013" }),
        document.createTextNode(" s \u00b7 "),
        el("span", { id: `job-${key}-window-throughput`, text: "\u2013" }),
        document.createTextNode(" samples/s"),
      ]),
    ]),
    el("div", { class: "share", id: `job-${key}-share`, hidden: "" }),
    el("div", { class: "share", id: `job-${key}-decode`, hidden: "" }),
    el("div", { class: "figures" }, [
      figure(key, "stall", "Host wait (last 0.5 s)", "%"),
      figure(key, "gpu-idle", "GPU idle (last 0.5 s)", "%"),
      figure(key, "throughput", "Throughput", "samples/s"),
      figure(key, "queue", "Queue: in flight / depth", "batches"),
      figure(key, "latency", "Batch latency", "ms"),
      figure(key, "busy", "Decode threads busy", "%"),
      figure(key, "bad", "Bad samples", "total"),
    ]),
    el("div", { class: "charts" }, [
      chart(key, "stall", "Stall (% of time the trainer waited, the GPU sat idle, and the GPU decode lane cost the GPU)"),
      chart(key, "throughput", "Throughput (samples/s)"),
      chart(key, "queue", "Queue depth (batches)"),
      chart(key, "time", "Where time goes (ms per sample, last 10 s)"),
    ]),
    el("table", { class: "workers", id: `job-${key}-workers` }, [
      el("caption", { text: "Workers" }),
      el("thead", {}, [
        el("tr", {}, ["worker", "kind", "threads", "busy %", "tasks/s", "bad samples"].map(
          (h) => el("th", { text: h }))),
      ]),
      el("tbody", {}),
    ]),
  ]);
  return card;
}

function verdictClass(verdict) {
  if (verdict.startsWith("input-bound")) return "input";
  if (verdict === "balanced") return "balanced";
  if (verdict === "compute-bound") return "compute";
  return "neutral";
}

function setText(id, text) {
  const node = document.getElementById(id);
  if (node) node.textContent = text;
}

function updateFigures(job) {
  const key = job.key;
  const p = job.current;
  const w = job.window;
  setText(`job-${key}-verdict`, job.verdict);
  const line = document.getElementById(`job-${key}-verdict-line`);
  line.className = `verdict-line ${verdictClass(job.verdict)}`;
  setText(`job-${key}-window-stall`, fixed(w ? w.stall_pct : null, 1));
  setText(`job-${key}-window-gpu-idle`, fixed(w ? w.gpu_idle_pct : null, 1));
  setText(`job-${key}-window-lane-cost`, fixed(w ? w.gpu_lane_cost_pct : null, 1));
  setText(`job-${key}-window-seconds`, fixed(w ? w.seconds : null, 1));
  setText(`job-${key}-window-throughput`, fixed(w ? w.samples_per_s : null, 1));
  const share = document.getElementById(`job-${key}-share`);
  if (job.share) {
    const s = job.share;
    share.hidden = false;
    share.textContent = `share of the workers: weight ${s.weight} \u00b7 ` +
      `${fixed(s.lease_fraction === null ? null : s.lease_fraction * 100, 0)}% of tasks ` +
      `(${fixed(s.leases_per_s, 1)}/s) \u00b7 ${s.waiting_sessions} sessions waiting \u00b7 ` +
      `served by ${s.workers.length ? s.workers.join(", ") : "no worker lately"}`;
  } else {
    share.hidden = true;
  }
  if (!p) return;
  const stamp = document.getElementById(`job-${key}-t`);
  stamp.setAttribute("data-t-ms", String(p.t_ms));
  stamp.textContent = `reading of ${new Date(p.t_ms).toLocaleTimeString()}`;
  setText(`job-${key}-stall`, fixed(p.stall_pct, 1));
  setText(`job-${key}-gpu-idle`, fixed(p.gpu_idle_pct, 1));
  setText(`job-${key}-throughput`, fixed(p.samples_per_s, 1));
  setText(`job-${key}-queue`, `${p.in_flight} / ${p.prefetch_depth}`);
  setText(`job-${key}-latency`, fixed(p.batch_latency_ms, 2));
  setText(`job-${key}-busy`, fixed(p.busy_pct, 1));
  setText(`job-${key}-bad`, String(p.bad_samples));
  const decode = document.getElementById(`job-${key}-decode`);
  if (p.gpu_decode) {
    const d = p.gpu_decode;
    decode.hidden = false;
    decode.textContent = `GPU decode lane${d.hardware ? " (JPEG engines)" : ""}: ` +
      `${fixed(d.split_pct, 1)}% of each batch offered \u00b7 GPU ${fixed(d.gpu_rows_per_s, 0)} ` +
      `rows/s \u00b7 CPU threads ${fixed(d.cpu_rows_per_s, 0)} rows/s \u00b7 ` +
      `${d.declined_rows} rows left to the CPU \u00b7 memory ` +
      `${fixed(d.memory_bytes / 1048576, 0)} of ${fixed(d.memory_cap / 1048576, 0)} MiB` +
      (d.lost ? ` \u00b7 lost (${d.lost}): every row on the CPU threads` : "");
  } else {
    decode.hidden = true;
  }
  const body = document.querySelector(`#job-${key}-workers tbody`);
  body.replaceChildren(...job.workers.map((worker) => el("tr", {}, [
    el("td", { text: worker.name }),
    el("td", { text: worker.kind }),
    el("td", { text: String(worker.threads) }),
    el("td", { text: fixed(worker.busy_pct, 1) }),
    el("td", { text: fixed(worker.tasks_per_s, 1) }),
    el("td", { text: String(worker.bad_samples) }),
  ])));
}

// ---- charts ----

function prepare(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 400;
  const height = canvas.clientHeight || 170;
  if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, width, height };
}

function niceStep(range, count) {
  const raw = range / Math.max(1, count);
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

function tickLabel(value, step) {
  const digits = step >= 1 ? 0 : Math.min(3, Math.ceil(-Math.log10(step)));
  return value.toFixed(digits);
}

// Lines over time. lines: [{ label, color, dash, values: [[t_ms, value|null]] }].
function drawLines(canvas, lines, options) {
  const { ctx, width, height } = prepare(canvas);
  const left = 46, right = 10, top = 18, bottom = 30;
  const plotW = width - left - right, plotH = height - top - bottom;
  const t1 = options.now;
  let t0 = t1 - 10000;
  let yMax = options.yMin || 1;
  for (const line of lines) {
    for (const [t, v] of line.values) {
      if (t < t0) t0 = t;
      if (v !== null && v > yMax) yMax = v;
    }
  }
  t0 = Math.max(t0, t1 - historyMs);
  const yStep = niceStep(yMax, 4);
  yMax = Math.ceil(yMax / yStep) * yStep;
  const x = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * plotW;
  const y = (v) => top + plotH - (v / yMax) * plotH;

  ctx.strokeStyle = "#e5e7eb";
  ctx.fillStyle = "#6b7280";
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let v = 0; v <= yMax + yStep / 2; v += yStep) {
    ctx.beginPath();
    ctx.moveTo(left, y(v));
    ctx.lineTo(left + plotW, y(v));
    ctx.stroke();
    ctx.fillText(tickLabel(v, yStep), left - 4, y(v));
  }
  const spanS = (t1 - t0) / 1000;
  const xStep = niceStep(spanS, 5);
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (let s = 0; s <= spanS + 1e-9; s += xStep) {
    ctx.fillText(tickLabel(s, xStep), x(t1 - s * 1000), top + plotH + 3);
  }
  ctx.fillText("seconds ago", left + plotW / 2, top + plotH + 16);
  ctx.save();
  ctx.translate(10, top + plotH / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textBaseline = "middle";
  ctx.fillText(options.yLabel, 0, 0);
  ctx.restore();

  for (const mark of options.marks || []) {
    if (mark.value > yMax) continue;
    ctx.strokeStyle = mark.color;
    ctx.setLineDash([3, 3]);
    ctx.beginPath();
    ctx.moveTo(left, y(mark.value));
    ctx.lineTo(left + plotW, y(mark.value));
    ctx.stroke();
    ctx.setLineDash([]);
  }

  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top, plotW, plotH);
  ctx.clip();
  for (const line of lines) {
    ctx.strokeStyle = line.color;
    ctx.lineWidth = 1.8;
    ctx.setLineDash(line.dash || []);
    ctx.beginPath();
    let pen = false;
    for (const [t, v] of line.values) {
      if (v === null) { pen = false; continue; }
      if (pen) ctx.lineTo(x(t), y(v)); else ctx.moveTo(x(t), y(v));
      pen = true;
    }
    ctx.stroke();
  }
  ctx.restore();
  ctx.setLineDash([]);

  let legendX = left + 4;
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  const legend = lines.map((line) => ({ label: line.label, color: line.color, dash: line.dash }))
    .concat((options.marks || []).map((mark) => ({ ...mark, dash: [3, 3] })));
  for (const entry of legend) {
    ctx.strokeStyle = entry.color;
    ctx.lineWidth = 2;
    ctx.setLineDash(entry.dash || []);
    ctx.beginPath();
    ctx.moveTo(legendX, 7);
    ctx.lineTo(legendX + 12, 7);
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = "#374151";
    ctx.fillText(entry.label, legendX + 16, 7);
    legendX += 26 + ctx.measureText(entry.label).width;
  }
}

// Two horizontal bars on one scale: the input pipeline's stages stacked, and the trainer.
function drawTime(canvas, window, automaticPrefetch) {
  const { ctx, width, height } = prepare(canvas);
  const left = 92, right = 14, top = 26, bottom = 30;
  const plotW = width - left - right, plotH = height - top - bottom;
  const stages = STAGES.map((s) => ({ name: s, value: window ? window[`${s}_ms`] : null }));
  const inputTotal = stages.reduce((sum, s) => sum + (s.value || 0), 0);
  const trainer = window ? window.trainer_ms : null;
  let max = Math.max(inputTotal, trainer || 0, 0.01);
  const step = niceStep(max, 4);
  max = Math.ceil(max / step) * step;
  const x = (v) => left + (v / max) * plotW;
  const barH = Math.min(30, plotH / 2 - 10);
  const rows = [
    { label: "input pipeline", y: top + plotH * 0.25 - barH / 2 },
    { label: "trainer", y: top + plotH * 0.75 - barH / 2 },
  ];

  ctx.strokeStyle = "#e5e7eb";
  ctx.fillStyle = "#6b7280";
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (let v = 0; v <= max + step / 2; v += step) {
    ctx.beginPath();
    ctx.moveTo(x(v), top);
    ctx.lineTo(x(v), top + plotH);
    ctx.stroke();
    ctx.fillText(tickLabel(v, step), x(v), top + plotH + 3);
  }
  ctx.fillText("ms per sample (decode stages: pool wall time, all threads busy)", left + plotW / 2,
    top + plotH + 16);

  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.fillStyle = "#374151";
  for (const row of rows) ctx.fillText(row.label, left - 6, row.y + barH / 2);

  let at = 0;
  for (const stage of stages) {
    if (!stage.value) continue;
    ctx.fillStyle = STAGE_COLORS[stage.name];
    ctx.fillRect(x(at), rows[0].y, x(at + stage.value) - x(at), barH);
    at += stage.value;
  }
  if (trainer !== null) {
    ctx.fillStyle = TRAINER_COLOR;
    ctx.fillRect(x(0), rows[1].y, x(trainer) - x(0), barH);
  } else {
    ctx.textAlign = "left";
    ctx.fillStyle = "#9ca3af";
    const why = automaticPrefetch ? "not measured yet" : "not measured (fixed prefetch)";
    ctx.fillText(why, left + 6, rows[1].y + barH / 2);
  }

  let legendX = 8;
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  const legend = stages.map((s) => [s.name, STAGE_COLORS[s.name], s.value])
    .concat([["trainer", TRAINER_COLOR, trainer]]);
  for (const [name, color, value] of legend) {
    const text = `${name} ${fixed(value, 2)}`;
    ctx.fillStyle = color;
    ctx.fillRect(legendX, 6, 10, 10);
    ctx.fillStyle = "#374151";
    ctx.fillText(text, legendX + 14, 11);
    legendX += 26 + ctx.measureText(text).width;
  }
}

function drawCharts(key, state, window, now, automaticPrefetch) {
  const series = state.series;
  const pick = (field) => series.map((p) => [p.t_ms, p[field]]);
  drawLines(document.getElementById(`job-${key}-chart-stall`), [
    { label: "host wait %", color: "#dc2626", values: pick("stall_pct") },
    { label: "GPU idle %", color: "#7c3aed", values: pick("gpu_idle_pct") },
    { label: "GPU decode beside the step %", color: "#db2777", values: pick("gpu_lane_cost_pct") },
  ], {
    now, yLabel: "% of time", yMin: 10,
    marks: [
      { value: 5, color: "#d97706", label: "5% (input-bound above)" },
      { value: 1, color: "#059669", label: "1% (compute-bound below)" },
    ],
  });
  drawLines(document.getElementById(`job-${key}-chart-throughput`), [
    { label: "samples/s", color: "#2563eb", values: pick("samples_per_s") },
  ], { now, yLabel: "samples/s", yMin: 10 });
  drawLines(document.getElementById(`job-${key}-chart-queue`), [
    { label: "in flight", color: "#7c3aed", values: pick("in_flight") },
    { label: "prefetch depth", color: "#9ca3af", dash: [5, 3], values: pick("prefetch_depth") },
  ], { now, yLabel: "batches", yMin: 2 });
  drawTime(document.getElementById(`job-${key}-chart-time`), window, automaticPrefetch);
}

// ---- polling ----

async function poll() {
  const status = document.getElementById("status");
  try {
    const response = await fetch(`/api/jobs?since=${lastT}`, { cache: "no-store" });
    if (response.status === 401) {
      // The cookie expired (or the credential changed): the server answers, but not to us.
      status.className = "status down";
      status.textContent =
        "signed out: open this page again with ?token=CREDENTIAL (the credential is not the RPC token)";
      setTimeout(poll, pollMs * 10);
      return;
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    pollMs = data.poll_ms;
    historyMs = data.history_s * 1000;
    document.getElementById("interval").textContent = String(data.interval_ms / 1000);
    document.getElementById("window").textContent = String(data.window_s);
    document.getElementById("no-jobs").hidden = data.jobs.length > 0;
    for (const job of data.jobs) {
      let state = jobs.get(job.key);
      if (!state) {
        state = { series: [] };
        jobs.set(job.key, state);
        document.getElementById("jobs").appendChild(createCard(job));
      }
      for (const point of job.series) {
        const last = state.series[state.series.length - 1];
        if (!last || point.t_ms > last.t_ms) state.series.push(point);
        if (point.t_ms > lastT) lastT = point.t_ms;
      }
      const oldest = data.now_ms - historyMs;
      while (state.series.length && state.series[0].t_ms < oldest) state.series.shift();
      updateFigures(job);
      drawCharts(job.key, state, job.window, data.now_ms, job.automatic_prefetch);
    }
    // A job the server no longer lists (retired: no session for --job-retention-secs) leaves
    // the page too.
    const listed = new Set(data.jobs.map((job) => job.key));
    for (const key of [...jobs.keys()]) {
      if (listed.has(key)) continue;
      jobs.delete(key);
      document.getElementById(`job-${key}`)?.remove();
    }
    status.className = "status";
    status.textContent = `live \u00b7 ${new Date(data.now_ms).toLocaleTimeString()}`;
  } catch (error) {
    status.className = "status down";
    status.textContent = `server unreachable (${error.message})`;
  }
  setTimeout(poll, pollMs);
}

poll();
