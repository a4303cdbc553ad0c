"""The inspector's page (jaxrl_llm/inspect.py): HTML, CSS and JS in one template.

`__TITLE__` and `__DATA__` (the step's JSON, from `inspect.page_data`) are
filled in; nothing is fetched from the network. The script decodes a
per-token buffer (base64 of float32 / integer bytes over the sampled tokens,
or one constant) the first time it is needed, and renders only the
sequences of the visible page.
"""

PAGE_TEMPLATE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
body { font: 13px/1.45 system-ui, sans-serif; margin: 0; color: #1b1b1b; background: #fafafa; }
header { position: sticky; top: 0; background: #fff; border-bottom: 1px solid #ddd; padding: 8px 14px; z-index: 2; }
h1 { font-size: 16px; margin: 0 0 4px 0; }
#runinfo { color: #555; font-size: 12px; margin-bottom: 6px; }
#controls { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center; }
#controls input[type=number] { width: 70px; }
#legend { display: flex; align-items: center; gap: 6px; margin-top: 6px; font-size: 12px; }
#legend .bar { display: inline-block; width: 240px; height: 12px; border: 1px solid #aaa; }
#legend .name { font-weight: 600; }
#hists { display: flex; flex-wrap: wrap; gap: 16px; padding: 8px 14px; }
.hist { background: #fff; border: 1px solid #ddd; padding: 4px 6px; }
.hist .ht { font-weight: 600; font-size: 12px; }
main { padding: 4px 14px 40px 14px; }
.seq { background: #fff; border: 1px solid #ddd; border-radius: 4px; margin: 8px 0; padding: 6px 8px; }
.seq .head { font-size: 12px; color: #333; margin-bottom: 4px; }
.seq .head b { color: #000; }
.seq .offwhy { color: #a40; font-weight: 600; }
.seq .prompt { color: #777; white-space: pre-wrap; font-family: ui-monospace, monospace; }
.seq .resp { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 13px; }
.t { border-radius: 2px; padding: 0 0.5px; cursor: default; }
.t.off { color: #999; text-decoration: underline dotted #999; }
.t.mk { outline: 1.5px solid #d00; outline-offset: -1px; }
.t.mk::after { content: "\2022"; color: #d00; font-size: 9px; vertical-align: super; }
.t.cur { box-shadow: 0 0 0 2px #333; }
#tip { position: fixed; z-index: 5; background: #fff; border: 1px solid #888; box-shadow: 0 2px 8px rgba(0,0,0,.25);
       padding: 6px 8px; font-size: 12px; max-width: 420px; pointer-events: none; }
#tip table { border-collapse: collapse; }
#tip td { padding: 0 6px 0 0; white-space: nowrap; }
#tip td.v { font-family: ui-monospace, monospace; text-align: right; }
#tip .why { color: #c00; margin-top: 4px; white-space: normal; }
#empty { color: #777; padding: 20px; }
</style>
</head>
<body>
<header>
  <h1 id="title"></h1>
  <div id="runinfo"></div>
  <div id="controls">
    <label>colour by <select id="colour"></select></label>
    <label id="passbox">pass <select id="pass"></select></label>
    <label>group <select id="group"></select></label>
    <label>reward &ge; <input id="rmin" type="number" step="any"></label>
    <label>&le; <input id="rmax" type="number" step="any"></label>
    <label><input type="checkbox" id="onlymk"> only sequences with marked tokens</label>
    <label>per page <select id="psize"><option>10</option><option selected>20</option><option>50</option><option>100</option></select></label>
    <button id="prev">&#9664;</button><span id="pageinfo"></span><button id="next">&#9654;</button>
  </div>
  <div id="legend"><span class="name"></span><span class="lo"></span><span class="bar"></span><span class="mid"></span><span class="hi"></span>
    <span class="note">&bull; marked: masked or clipped by the loss; grey dotted: not in the loss</span></div>
</header>
<section id="hists"></section>
<main id="seqs"></main>
<div id="tip" hidden></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const M = D.meta, N = M.n_tokens, B = M.B;
const TYPES = {f32: Float32Array, u8: Uint8Array, u16: Uint16Array, i32: Int32Array};
const cache = new Map();
function decode(buf, id) {
  if (cache.has(id)) return cache.get(id);
  let out;
  if ("const" in buf) { out = {c: buf.const}; }
  else {
    const bin = atob(buf.b64), u8 = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) u8[i] = bin.charCodeAt(i);
    out = {a: new TYPES[buf.dtype](u8.buffer)};
  }
  cache.set(id, out);
  return out;
}
function at(d, i) { return d.c !== undefined ? d.c : d.a[i]; }
const SIZES = {f32: 4, u8: 1, u16: 2, i32: 4};
function peek(buf, id, i) {  // element i without decoding the whole buffer (a tooltip's values)
  if ("const" in buf) return buf.const;
  if (cache.has(id)) return at(cache.get(id), i);
  const size = SIZES[buf.dtype], start = i * size, g0 = Math.floor(start / 3), g1 = Math.floor((start + size - 1) / 3);
  const bin = atob(buf.b64.slice(4 * g0, 4 * (g1 + 1))), u8 = new Uint8Array(size);
  for (let k = 0; k < size; k++) u8[k] = bin.charCodeAt(start - 3 * g0 + k);
  return new TYPES[buf.dtype](u8.buffer)[0];
}
function value(key, pass, i) {
  const f = FIELDS.get(key), p = Math.min(pass, f.passes.length - 1);
  return peek(f.passes[p], "f:" + key + ":" + p, i);
}
const FIELDS = new Map(D.fields.map(f => [f.key, f]));
const state = {colour: D.colours.length ? D.colours[0][1] : null, pass: 0, group: "all", rmin: null, rmax: null,
               onlymk: false, page: 0, psize: 20};
function fieldData(key, pass) {
  const f = FIELDS.get(key);
  const p = Math.min(pass, f.passes.length - 1);
  return decode(f.passes[p], "f:" + key + ":" + p);
}
function flagData(fl, pass) {
  const p = Math.min(pass, fl.passes.length - 1);
  return decode(fl.passes[p], "g:" + fl.key + ":" + p);
}
const tokens = decode(D.tokens, "tokens"), inLoss = decode(D.in_loss, "in_loss");
function fmt(x, digits) {
  if (x === undefined || x === null) return "";
  if (!isFinite(x)) return String(x);
  if (x === 0) return "0";
  return Number(x).toPrecision(digits || 6).replace(/(\.\d*?)0+(e|$)/, "$1$2").replace(/\.(e|$)/, "$1");
}
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c])); }

// ---- colour scales ------------------------------------------------------------
const scaleCache = new Map();
function scaleOf(key, pass) {
  const id = key + ":" + pass;
  if (scaleCache.has(id)) return scaleCache.get(id);
  const f = FIELDS.get(key), d = fieldData(key, pass);
  let s = 0;
  for (let i = 0; i < N; i++) {
    const v = at(d, i);
    if (!isFinite(v)) continue;
    if (f.scale === "ratio") { if (v > 0) s = Math.max(s, Math.abs(Math.log(v))); }
    else s = Math.max(s, Math.abs(v));
  }
  const out = {kind: f.scale, s: s};
  scaleCache.set(id, out);
  return out;
}
function position(sc, v) {  // -> t in [-1, 1] (diverging) or [0, 1] (pos)
  if (!isFinite(v)) return v > 0 ? 1 : -1;
  if (sc.kind === "ratio") { if (v <= 0) return -1; return sc.s > 0 ? Math.max(-1, Math.min(1, Math.log(v) / sc.s)) : 0; }
  if (sc.kind === "pos") return sc.s > 0 ? Math.max(0, Math.min(1, v / sc.s)) : 0;
  return sc.s > 0 ? Math.max(-1, Math.min(1, v / sc.s)) : 0;
}
function mix(a, b, t) { return a.map((x, i) => Math.round(x + (b[i] - x) * t)); }
const WHITE = [255, 255, 255], BLUE = [59, 110, 214], RED = [214, 47, 39], GREEN = [28, 150, 80];
function colourAt(sc, t) {
  const c = sc.kind === "pos" ? mix(WHITE, GREEN, t) : t < 0 ? mix(WHITE, BLUE, -t) : mix(WHITE, RED, t);
  return "rgb(" + c.join(",") + ")";
}
function legendLabels(sc) {
  if (sc.kind === "ratio") return [Math.exp(-sc.s), 1, Math.exp(sc.s)];
  if (sc.kind === "pos") return [0, sc.s / 2, sc.s];
  return [-sc.s, 0, sc.s];
}
function drawLegend() {
  const L = document.getElementById("legend");
  if (!state.colour) { L.querySelector(".name").textContent = "no factor to colour by"; return; }
  const sc = scaleOf(state.colour, state.pass), lab = legendLabels(sc);
  L.querySelector(".name").textContent = FIELDS.get(state.colour).label;
  L.querySelector(".lo").textContent = fmt(lab[0], 4);
  L.querySelector(".mid").textContent = fmt(lab[1], 4);
  L.querySelector(".hi").textContent = fmt(lab[2], 4);
  const stops = sc.kind === "pos" ? [0, 0.5, 1] : [-1, 0, 1];
  L.querySelector(".bar").style.background = "linear-gradient(to right," + stops.map(t => colourAt(sc, t)).join(",") + ")";
}

// ---- reasons a token was masked or clipped ----------------------------------------------
function reasons(b, i) {
  const out = [];
  if (!at(inLoss, i)) { out.push("not in the loss: " + (D.seq.off[b] || "masked sample")); return out; }
  for (const fl of D.flags) if (at(flagData(fl, state.pass), i)) out.push(fl.reason);
  if (FIELDS.has("A") && value("A", state.pass, i) === 0) out.push("zero advantage (the group's rewards are equal, or routed away)");
  if (FIELDS.has("teacher.gate") && M.teacher && M.teacher.sign_gate && value("teacher.gate", 0, i) === 0)
    out.push("teacher sign gate closed: the teacher's gap disagrees with A");
  if (D.seq["teacher.has_teacher"] && !D.seq["teacher.has_teacher"][b]) out.push("no teacher for this sample's task tag");
  return out;
}
function marked(b, i) {
  if (!at(inLoss, i)) return false;
  for (const fl of D.flags) if (at(flagData(fl, state.pass), i)) return true;
  return false;
}

// ---- filtering and paging -----------------------------------------------------------
function visibleRows() {
  const rows = [];
  for (let b = 0; b < B; b++) {
    if (state.group !== "all" && D.seq.group[b] !== Number(state.group)) continue;
    const r = D.seq.reward[b];
    if (state.rmin !== null && r < state.rmin) continue;
    if (state.rmax !== null && r > state.rmax) continue;
    if (state.onlymk) {
      let any = false;
      for (let i = D.offsets[b]; i < D.offsets[b + 1] && !any; i++) any = marked(b, i);
      if (!any) continue;
    }
    rows.push(b);
  }
  return rows;
}
function pieceText(id) {
  const p = D.pieces[String(id)];
  if (p === undefined) return "<" + id + ">";
  return p === "" ? "\u2205" : p.replace(/\n/g, "\u21b5\n");
}
function seqHead(b) {
  const parts = ["<b>#" + b + "</b>", "group " + D.seq.group[b], "reward " + fmt(D.seq.reward[b], 4),
                 "A " + fmt(D.seq.adv[b], 4)];
  if (FIELDS.has("log_c_measured")) parts.push("c<sub>i</sub> " + fmt(Math.exp(D.seq.log_c[b]), 4) +
                                                " (log " + fmt(D.seq.log_c[b], 4) + ")");
  parts.push(D.seq.length[b] + " tokens", "finish " + D.seq.finish[b]);
  if (D.seq.tag[b]) parts.push("tag " + esc(D.seq.tag[b]));
  if (D.seq["teacher.routed"]) parts.push("teacher routed " + D.seq["teacher.routed"][b]);
  if (D.seq["teacher.has_teacher"]) parts.push("has teacher " + (D.seq["teacher.has_teacher"][b] ? "yes" : "no"));
  let h = parts.join(" &middot; ");
  if (D.seq.off[b]) h += ' &middot; <span class="offwhy">not in the loss: ' + esc(D.seq.off[b]) + "</span>";
  return h;
}
function render() {
  const rows = visibleRows();
  const pages = Math.max(1, Math.ceil(rows.length / state.psize));
  state.page = Math.min(state.page, pages - 1);
  document.getElementById("pageinfo").textContent =
      " page " + (state.page + 1) + " / " + pages + " (" + rows.length + " of " + B + " sequences) ";
  const sc = state.colour ? scaleOf(state.colour, state.pass) : null;
  const d = state.colour ? fieldData(state.colour, state.pass) : null;
  const html = [];
  for (const b of rows.slice(state.page * state.psize, (state.page + 1) * state.psize)) {
    html.push('<div class="seq" data-b="' + b + '"><div class="head">' + seqHead(b) + '</div><div class="prompt">' +
              esc(D.seq.prompt[b]) + '</div><div class="resp">');
    for (let i = D.offsets[b]; i < D.offsets[b + 1]; i++) {
      const cls = "t" + (at(inLoss, i) ? "" : " off") + (marked(b, i) ? " mk" : "");
      const bg = sc && at(inLoss, i) ? ' style="background:' + colourAt(sc, position(sc, at(d, i))) + '"' : "";
      html.push('<span class="' + cls + '" data-i="' + i + '" data-b="' + b + '"' + bg + ">" + esc(pieceText(at(tokens, i))) + "</span>");
    }
    html.push("</div></div>");
  }
  const main = document.getElementById("seqs");
  main.innerHTML = html.length ? html.join("") : '<div id="empty">no sequence matches the filters</div>';
  tip.hidden = true;  // its token is gone; the next hover shows the new values
  current = null;
  drawLegend();
  drawHists();
}

// ---- tooltip ----------------------------------------------------------------------
function tipHtml(b, i) {
  const t = i - D.offsets[b];
  const rows = ['<tr><td>token</td><td class="v">' + esc(JSON.stringify(D.pieces[String(at(tokens, i))] || "")) +
                " (id " + at(tokens, i) + ", t " + t + ")</td></tr>"];
  for (const f of D.fields) {
    rows.push('<tr data-key="' + esc(f.key) + '"><td>' + esc(f.label) + '</td><td class="v">' +
              fmt(value(f.key, state.pass, i)) + "</td></tr>");
  }
  const why = reasons(b, i);
  return "<table>" + rows.join("") + "</table>" +
         (why.length ? '<div class="why">' + why.map(esc).join("<br>") + "</div>" : "");
}
const tip = document.getElementById("tip");
let current = null;
document.getElementById("seqs").addEventListener("mouseover", ev => {
  const el = ev.target.closest(".t");
  if (!el) return;
  if (current) current.classList.remove("cur");
  current = el;
  el.classList.add("cur");
  tip.innerHTML = tipHtml(Number(el.dataset.b), Number(el.dataset.i));
  tip.hidden = false;
  // Below the token if it fits, else above, else beside it: never over the token itself.
  const r = el.getBoundingClientRect(), h = tip.offsetHeight, w = tip.offsetWidth;
  let x = Math.max(4, Math.min(r.left, window.innerWidth - w - 8)), y;
  if (r.bottom + 6 + h <= window.innerHeight) y = r.bottom + 6;
  else if (r.top - 6 - h >= 0) y = r.top - 6 - h;
  else {
    y = Math.max(4, Math.min(window.innerHeight - h - 4, r.top - h / 2));
    x = r.right + 12 + w <= window.innerWidth ? r.right + 12 : Math.max(4, r.left - 12 - w);
  }
  tip.style.left = x + "px";
  tip.style.top = y + "px";
});
document.getElementById("seqs").addEventListener("mouseleave", () => { tip.hidden = true; });

// ---- histograms of r, c and W over the loss's tokens ------------------------------------------
const histCache = new Map();  // pass -> the histograms' HTML (they depend on the pass only)
function drawHists() {
  const box = document.getElementById("hists");
  if (box.dataset.pass === String(state.pass)) return;
  box.dataset.pass = String(state.pass);
  if (!histCache.has(state.pass)) histCache.set(state.pass, histHtml());
  box.innerHTML = histCache.get(state.pass);
}
function histHtml() {
  const parts = [];
  for (const key of ["r", "c", "W"]) {
    if (!FIELDS.has(key)) continue;
    const d = fieldData(key, state.pass), vals = [];
    for (let i = 0; i < N; i++) if (at(inLoss, i)) vals.push(at(d, i));
    const W = 260, H = 80, nb = 30;
    let lo = Infinity, hi = -Infinity;
    for (const v of vals) { if (isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }
    const counts = new Array(nb).fill(0);
    if (vals.length && hi >= lo) {
      for (const v of vals) {
        if (!isFinite(v)) continue;
        const k = hi > lo ? Math.min(nb - 1, Math.floor((v - lo) / (hi - lo) * nb)) : 0;
        counts[k]++;
      }
    }
    const peak = Math.max(1, ...counts);
    let svg = '<svg width="' + W + '" height="' + (H + 14) + '" data-key="' + key + '">';
    counts.forEach((c, k) => {
      const h = c / peak * H, w = W / nb;
      const a = lo + (hi - lo) * k / nb, z = lo + (hi - lo) * (k + 1) / nb;
      svg += '<rect x="' + (k * w) + '" y="' + (H - h) + '" width="' + (w - 1) + '" height="' + h + '" fill="#4a7bd0" data-count="' +
             c + '"><title>[' + fmt(a, 4) + ", " + fmt(z, 4) + "): " + c + "</title></rect>";
    });
    svg += '<text x="0" y="' + (H + 12) + '" font-size="10">' + fmt(lo, 6) + '</text><text x="' + W + '" y="' + (H + 12) +
           '" font-size="10" text-anchor="end">' + fmt(hi, 6) + "</text></svg>";
    parts.push('<div class="hist" id="hist-' + key + '"><div class="ht">' + esc(FIELDS.get(key).label) + " &middot; " +
               vals.length + " loss tokens" + (M.passes > 1 ? " &middot; pass " + (state.pass + 1) : "") + "</div>" + svg + "</div>");
  }
  return parts.join("");
}

// ---- controls ---------------------------------------------------------------------
function setup() {
  document.getElementById("title").textContent = "step " + M.step + " \u00b7 " + M.run_name + " (objective " + M.method + ")";
  const o = M.objective, ro = M.rollout;
  const info = ["B " + M.B + " samples (groups of " + M.group_size + "), " + M.n_tokens + " sampled tokens, " +
                M.n_loss_tokens + " in the loss", "trust " + o.trust_region + "/" + o.trust_level,
                "correction " + o.correction + " on " + o.correction_ratio + " (" + o.correction_level + ")",
                "kappa " + o.kappa, "aggregation " + o.aggregation, "advantage " + o.advantage];
  if (ro.sampler_dtype) info.push("sampler " + ro.sampler_dtype + ", staleness " + ro.staleness + ", quant " +
                                  ro.quant + (ro.noise ? ", noise " + ro.noise : ""));
  if (M.extensions.length) info.push("extensions " + M.extensions.join(", ") + (M.teacher ? " (teacher signal " + M.teacher.signal + ")" : ""));
  document.getElementById("runinfo").textContent = info.join(" \u00b7 ");
  const colour = document.getElementById("colour");
  colour.innerHTML = D.colours.map(([name, key]) => '<option value="' + esc(key) + '">' + esc(name) + "</option>").join("");
  const pass = document.getElementById("pass");
  pass.innerHTML = Array.from({length: M.passes}, (_, k) => '<option value="' + k + '">' + (k + 1) + "</option>").join("");
  if (M.passes < 2) document.getElementById("passbox").hidden = true;
  const groups = Math.ceil(B / M.group_size);
  document.getElementById("group").innerHTML = '<option value="all">all</option>' +
      Array.from({length: groups}, (_, g) => '<option value="' + g + '">' + g + "</option>").join("");
  const on = (id, ev, fn) => document.getElementById(id).addEventListener(ev, e => { fn(e.target); render(); });
  on("colour", "change", t => { state.colour = t.value; });
  on("pass", "change", t => { state.pass = Number(t.value); });
  on("group", "change", t => { state.group = t.value; state.page = 0; });
  on("rmin", "input", t => { state.rmin = t.value === "" ? null : Number(t.value); state.page = 0; });
  on("rmax", "input", t => { state.rmax = t.value === "" ? null : Number(t.value); state.page = 0; });
  on("onlymk", "change", t => { state.onlymk = t.checked; state.page = 0; });
  on("psize", "change", t => { state.psize = Number(t.value); state.page = 0; });
  on("prev", "click", () => { state.page = Math.max(0, state.page - 1); });
  on("next", "click", () => { state.page += 1; });
  render();
}
setup();
</script>
</body>
</html>
"""
