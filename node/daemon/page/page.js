// The node's live page: polls /api/status (node/daemon/status.py:NodeStatus) and draws it.
// Plain DOM and SVG, no libraries, so the node can serve everything the page needs.
"use strict";

const POLL_MS = 3000;
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, text) {
  const node = tag === "svg" || ["line", "polyline", "polygon", "circle", "text", "g", "path", "rect"].includes(tag)
    ? document.createElementNS(SVG, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(x, digits = 3) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits); }

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${(s / 3600).toFixed(1)} h`;
}

function short(peer) { return peer.length > 20 ? `${peer.slice(0, 12)}…${peer.slice(-6)}` : peer; }

function movingAverage(values, window) {
  const out = [];
  let sum = 0;
  for (let i = 0; i < values.length; i++) {
    sum += values[i];
    if (i >= window) sum -= values[i - window];
    out.push(sum / Math.min(i + 1, window));
  }
  return out;
}

// One chart: line series (or stacked areas) of [round, value] points, with axes and a legend.
// Every series element carries data-series and data-points, which the browser test reads.
function drawChart(svg, series, { yMax = null, yUnit = "", stacked = false } = {}) {
  const [W, H] = svg.getAttribute("viewBox").split(" ").slice(2).map(Number);
  const pad = { l: 48, r: 12, t: 10, b: 26 };
  svg.replaceChildren();
  const all = series.flatMap((s) => s.points);
  if (!all.length) {
    svg.append(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, "no round finished yet"));
    legendOf(svg).replaceChildren();
    return;
  }
  const xs = all.map((p) => p[0]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  const highest = Math.max(...(stacked ? stackTops(series) : all.map((p) => p[1])));
  const step = niceStep((yMax ?? highest) / 4);
  const top = yMax ?? step * Math.max(1, Math.ceil(highest / step - 1e-9));
  const X = (x) => pad.l + (x - x0) / (x1 - x0) * (W - pad.l - pad.r);
  const Y = (y) => H - pad.b - y / top * (H - pad.t - pad.b);

  for (let v = 0; v <= top + step / 2; v += step) {  // horizontal grid and y labels
    const y = Y(v);
    svg.append(el("line", { x1: pad.l, x2: W - pad.r, y1: y, y2: y, class: v ? "grid" : "axis" }));
    svg.append(el("text", { x: pad.l - 6, y: y + 4, "text-anchor": "end" }, `${+v.toFixed(3)}${yUnit}`));
  }
  for (const r of niceTicks(x0, x1, 6)) {  // rounds along the bottom, clear of the "round" label
    if (X(r) < W - pad.r - 50) svg.append(el("text", { x: X(r), y: H - 8, "text-anchor": "middle" }, String(r)));
  }
  svg.append(el("text", { x: W - pad.r, y: H - 8, "text-anchor": "end" }, "round"));

  let base = null;
  const legend = [];
  for (const s of series) {
    const pts = s.points;
    let shape;
    if (stacked) {
      const upper = pts.map((p, i) => [p[0], (base ? base[i][1] : 0) + p[1]]);
      const lower = base ? [...base].reverse() : [[pts[pts.length - 1][0], 0], [pts[0][0], 0]];
      shape = el("polygon", { points: [...upper, ...lower].map(([x, y]) => `${X(x)},${Y(y)}`).join(" "),
                              style: `fill: ${s.color}; fill-opacity: 0.55; stroke: ${s.color}` });
      base = upper;
    } else if (s.dots || pts.length === 1) {
      shape = el("g", { style: `fill: ${s.color}` });
      for (const [x, y] of pts) shape.append(el("circle", { cx: X(x), cy: Y(y), r: 3 }));
    } else {
      // A path, broken where rounds are missing (rounds without external groups have no
      // external reward): a line across a gap would show values that never were.
      const gap = 1.5 * medianStep(pts);
      const joined = (i, j) => j >= 0 && j < pts.length && Math.abs(pts[j][0] - pts[i][0]) <= gap;
      const d = pts.map(([x, y], i) => `${joined(i, i - 1) ? "L" : "M"}${X(x)},${Y(y)}`).join(" ");
      shape = el("g");
      const line = el("path", { d, class: "series",
                                style: `stroke: ${s.color}; stroke-width: ${s.width ?? 1.8}; stroke-opacity: ${s.opacity ?? 1}` });
      if (s.dash) line.setAttribute("stroke-dasharray", "5 4");
      shape.append(line);
      pts.forEach(([x, y], i) => {  // a point with no neighbour would be invisible as a path
        if (!joined(i, i - 1) && !joined(i, i + 1)) shape.append(el("circle", { cx: X(x), cy: Y(y), r: 2.5, style: `fill: ${s.color}` }));
      });
    }
    shape.setAttribute("data-series", s.key);
    shape.setAttribute("data-points", String(pts.length));
    svg.append(shape);
    if (pts.length) {
      const item = el("span");
      item.append(el("i", { style: `background: ${s.color}` }), s.name);
      legend.push(item);
    }
  }
  legendOf(svg).replaceChildren(...legend);
}

// The legend is HTML under the chart, so long names wrap instead of running off the plot.
function legendOf(svg) {
  let legend = svg.nextElementSibling;
  if (!legend || !legend.classList.contains("legend")) {
    legend = el("div", { class: "legend" });
    svg.after(legend);
  }
  return legend;
}

function medianStep(pts) {
  const steps = pts.slice(1).map((p, i) => p[0] - pts[i][0]).sort((a, b) => a - b);
  return steps.length ? steps[Math.floor(steps.length / 2)] : 1;
}

function stackTops(series) {
  const n = series[0].points.length;
  return Array.from({ length: n }, (_, i) => series.reduce((sum, s) => sum + (s.points[i]?.[1] ?? 0), 0));
}

// A round grid step at or above x: 1, 2, 2.5 or 5 times a power of ten.
function niceStep(x) {
  if (!(x > 0)) return 0.25;
  const mag = 10 ** Math.floor(Math.log10(x));
  return [1, 2, 2.5, 5, 10].map((m) => m * mag).find((v) => v >= x * (1 - 1e-9));
}

function niceTicks(a, b, count) {
  const raw = (b - a) / count, mag = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  const step = Math.max(1, [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? mag * 10);
  const out = [];
  for (let r = Math.ceil(a / step) * step; r <= b; r += step) out.push(Math.round(r));
  return out;
}

function render(s) {
  $("peer-id").textContent = s.peer_id ? short(s.peer_id) : "";
  $("peer-id").title = s.peer_id ?? "";
  const phase = $("phase");
  phase.textContent = s.phase;
  phase.className = `phase ${s.phase.split(" ")[0]}`;
  $("round").textContent = `round ${s.round}${s.rounds_planned ? ` of ${s.rounds_planned}` : ""}`;
  $("model").textContent = s.model ?? "";
  $("version").textContent = s.version ? `sapo ${s.version}` : "";
  $("uptime").textContent = s.started ? `up ${duration(s.updated - s.started)}` : "";
  $("updated").textContent = `updated ${new Date(s.updated * 1000).toLocaleTimeString()}`;
  document.title = `sapo ${s.phase} r${s.round}`;

  const prog = s.progress;
  $("progress").hidden = !prog;
  if (prog) {
    $("progress-fill").style.width = `${(100 * prog.done / prog.total).toFixed(1)}%`;
    $("progress-text").textContent = `${prog.what}: ${prog.done}/${prog.total}` +
      (prog.seconds_left !== null ? `, about ${duration(prog.seconds_left)} left` : "");
  }
  $("listen").replaceChildren(...s.listen.map((a) => el("li", {}, a)));

  const pts = s.rounds, last = pts[pts.length - 1];
  const external = pts.filter((p) => p.external_reward !== null);
  const card = (k, v) => { const c = el("div", { class: "card" }); c.append(el("div", { class: "v" }, v), el("div", { class: "k" }, k)); return c; };
  const heldoutMean = s.heldout ? Object.values(s.heldout).reduce((a, b) => a + b, 0) / Object.keys(s.heldout).length : null;
  const cards = [
    card("local reward, last round", last ? fmt(last.reward) : "–"),
    card("local accuracy", last ? fmt(last.accuracy) : "–"),
    card("format rate", last ? fmt(last.format_rate, 2) : "–"),
    card("external reward", external.length ? fmt(external[external.length - 1].external_reward) : "–"),
    card(`held-out accuracy${s.heldout_round ? ` (r${s.heldout_round})` : ""}`, fmt(heldoutMean)),
    card("cumulative reward", fmt(s.cumulative_reward, 2)),
    card("peers connected", String(s.peers.filter((p) => p.connected).length)),
    card("inbox groups", String(s.inbox_size)),
  ];
  if (s.judge) cards.push(card("judge pass@1", fmt(s.judge.last_score, 2)));
  $("cards").replaceChildren(...cards);

  const series = (pick) => pts.filter((p) => pick(p) !== null).map((p) => [p.round, pick(p)]);
  const reward = series((p) => p.reward);
  const window = Math.max(5, Math.round(reward.length / 20));
  const rewardMa = movingAverage(reward.map((p) => p[1]), window).map((y, i) => [reward[i][0], y]);
  const smooth = reward.length > 2 * window;
  drawChart($("reward-chart"), [
    { key: "reward", name: "local reward", color: "var(--reward)", points: reward, opacity: smooth ? 0.3 : 1, width: smooth ? 1 : 1.8 },
    ...(smooth ? [{ key: "reward-ma", name: `moving average (${window})`, color: "var(--reward)", points: rewardMa, width: 2.6 }] : []),
    { key: "accuracy", name: "local accuracy", color: "var(--accuracy)", points: series((p) => p.accuracy) },
    { key: "external", name: "external groups' reward", color: "var(--external)", points: series((p) => p.external_reward), dash: true },
    { key: "heldout", name: "held-out accuracy", color: "var(--heldout)", points: series((p) => p.heldout), dots: true },
    ...(s.judge ? [{ key: "judge", name: "judge pass@1", color: "var(--judge)", points: s.judge.scores, dots: true }] : []),
  ], { yMax: Math.max(1, ...reward.map((p) => p[1])) });
  $("heldout").hidden = !s.heldout;
  if (s.heldout) {
    $("heldout").textContent = `Held-out accuracy at round ${s.heldout_round}, by task: ` +
      Object.entries(s.heldout).map(([task, v]) => `${task} ${fmt(v, 2)}`).join(", ");
  }
  drawChart($("format-chart"), [
    { key: "format", name: "format rate", color: "var(--format)", points: series((p) => p.format_rate) },
  ], { yMax: 1 });
  drawChart($("time-chart"), [
    { key: "generate", name: "generation", color: "var(--gen)", points: series((p) => p.generate_seconds) },
    { key: "train", name: "update", color: "var(--train)", points: series((p) => p.train_seconds) },
  ], { stacked: true, yUnit: " s" });

  const rows = s.peers.map((p) => {
    const tr = el("tr", { "data-peer": p.peer_id, class: p.banned ? "banned" : "" });
    tr.append(el("td", { class: "mono", title: p.peer_id }, short(p.peer_id) + (p.banned ? " (banned)" : "")),
              el("td", { class: "mono", title: "what its libp2p identify says it runs" }, p.agent ?? "–"),
              el("td", { class: "mono" }, p.addresses.join(" ") || "–"),
              el("td", {}, p.connected ? "yes" : "no"),
              el("td", {}, String(p.accepted)),
              el("td", {}, p.score == null ? "–" : fmt(p.score, 2)));
    return tr;
  });
  $("peers").tBodies[0].replaceChildren(...rows);
  $("peers-empty").hidden = rows.length > 0;

  const kv = (k, v) => { const tr = el("tr"); tr.append(el("td", {}, k), el("td", {}, String(v))); return tr; };
  $("intake").tBodies[0].replaceChildren(
    kv("groups in the inbox", s.inbox_size), kv("received", s.received), kv("accepted", s.accepted),
    kv("rejected", Object.values(s.rejected).reduce((a, b) => a + b, 0)),
    kv("waiting for the model to load", s.waiting_while_loading), kv("dropped (node too busy)", s.dropped));
  const reasons = Object.entries(s.rejected).sort((a, b) => b[1] - a[1]);
  $("rejected").tBodies[0].replaceChildren(...reasons.map(([k, v]) => kv(k, v)));
  $("rejected-empty").hidden = reasons.length > 0;
  $("bans").textContent = `${s.bans.length} banned now, ${s.peers_banned} so far` +
    (s.bans.length ? `: ${s.bans.map(short).join(", ")}` : "");

  $("judge").hidden = !s.judge;
  if (s.judge) {
    const j = s.judge;
    $("judge-text").textContent = j.last_score !== null
      ? `pass@1 ${fmt(j.last_score, 2)} at round ${j.last_round}; ${j.judged} judged, mean ${fmt(j.mean_score, 2)}.`
      : `Not judged yet (every ${j.every} rounds)` +
        (Object.keys(j.failures).length ? `; ${Object.entries(j.failures).map(([k, v]) => `${k} ${v}`).join(", ")}` : "") + ".";
  }
}

async function poll() {
  try {
    const response = await fetch("/api/status", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
  } catch (error) {
    const phase = $("phase");
    phase.textContent = `node unreachable (${error.message}); retrying`;
    phase.className = "phase unreachable";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

$("here").textContent = location.origin;
poll();
