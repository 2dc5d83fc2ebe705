/* energyprof report: draws the charts and the function table from the embedded JSON.
 * Data strings are only ever put into the page with textContent (never innerHTML), and plotly
 * labels arrive HTML-escaped from Python, so a function named like a closing script tag stays text. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var PAGE = 100;
  var CONFIG = { responsive: true, displaylogo: false };
  var SPECIAL = { "[other processes and idle]": 1, "[energyprof]": 1, "[child processes]": 1 };

  function fmtJ(j) {
    var a = Math.abs(j);
    if (a === 0) return "0 J";
    if (a >= 1e3) return (j / 1e3).toPrecision(3) + " kJ";
    if (a >= 1) return j.toPrecision(3) + " J";
    if (a >= 1e-3) return (j * 1e3).toPrecision(3) + " mJ";
    if (a >= 1e-6) return (j * 1e6).toPrecision(3) + " \u00b5J";
    return (j * 1e9).toPrecision(3) + " nJ";
  }
  function fmtS(s) {
    if (s === 0) return "0 s";
    if (s >= 60) return (s / 60).toFixed(1) + " min";
    if (s >= 1) return s.toPrecision(3) + " s";
    return (s * 1e3).toPrecision(3) + " ms";
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  /* ------------------------------------------------------------ icicle */
  var icicle = document.getElementById("icicle");
  var metric = document.getElementById("chart-metric");
  var colour = document.getElementById("chart-colour");
  var collapse = document.getElementById("chart-collapse");
  var flame = document.getElementById("chart-flame");
  if (!data.chart.collapsed) {
    collapse.disabled = true;
    collapse.parentNode.title = "no library frames in this profile";
  }

  var idle = document.getElementById("chart-idle");
  var IDLE = "[other processes and idle]";

  /* Leaving out the idle node: drop it (and anything under it) and take its value off its
   * ancestors, so every parent still equals self + children. */
  function withoutIdle(tree, values) {
    var index = {}, drop = {}, i;
    for (i = 0; i < tree.ids.length; i++) index[tree.ids[i]] = i;
    var vals = values.slice();
    for (i = 0; i < tree.ids.length; i++) {
      var p = tree.parents[i];
      if (tree.names[i] === IDLE || (p && drop[p])) {
        drop[tree.ids[i]] = true;
        if (!p || drop[p]) continue;
        for (var a = index[p]; a !== undefined; a = tree.parents[a] ? index[tree.parents[a]] : undefined) vals[a] -= values[i];
      }
    }
    var out = { ids: [], parents: [], labels: [], hovertext: [], values: [], colours: [] };
    var colours = colour.value === "mix" ? tree.colour_mix : tree.colour_file;
    for (i = 0; i < tree.ids.length; i++) {
      if (drop[tree.ids[i]]) continue;
      out.ids.push(tree.ids[i]); out.parents.push(tree.parents[i]); out.labels.push(tree.labels[i]);
      out.hovertext.push(tree.hovertext[i]); out.values.push(Math.max(0, vals[i])); out.colours.push(colours[i]);
    }
    return out;
  }

  function icicleTrace() {
    var tree = collapse.checked && data.chart.collapsed ? data.chart.collapsed : data.chart.full;
    var values = metric.value === "t" ? tree.value_t : tree.value_e;
    var shown = idle.checked
      ? { ids: tree.ids, parents: tree.parents, labels: tree.labels, hovertext: tree.hovertext, values: values,
          colours: colour.value === "mix" ? tree.colour_mix : tree.colour_file }
      : withoutIdle(tree, values);
    return {
      type: "icicle", ids: shown.ids, parents: shown.parents, labels: shown.labels,
      values: shown.values, branchvalues: "total",
      marker: { colors: shown.colours, line: { width: 0.5, color: "#fff" } },
      hovertext: shown.hovertext, hoverinfo: "text", textinfo: "label",
      tiling: { orientation: "v", flip: flame.checked ? "y" : "" }, pathbar: { visible: true, side: flame.checked ? "bottom" : "top" }
    };
  }
  function drawIcicle() {
    var layout = { margin: { l: 2, r: 2, t: 28, b: 2 }, height: icicle.clientHeight || 470 };
    return Plotly.react(icicle, [icicleTrace()], layout, CONFIG);
  }
  [metric, colour, collapse, flame, idle].forEach(function (c) { c.addEventListener("change", drawIcicle); });
  drawIcicle();

  /* ------------------------------------------------------------ timeline */
  var tl = document.getElementById("timeline-plot");
  if (tl && data.timeline) Plotly.newPlot(tl, data.timeline.data, data.timeline.layout, CONFIG);

  /* ------------------------------------------------------------ table */
  var t = data.table;
  /* numeric columns arrive as {exp, v}: value = v * 10^exp (see scaled_column in html.py) */
  function decode(col) {
    var f = Math.pow(10, col.exp), out = new Float64Array(col.v.length);
    for (var i = 0; i < out.length; i++) out[i] = col.v[i] * f;
    return out;
  }
  ["self_e", "tot_e", "self_t", "t", "cpu"].forEach(function (k) { t[k] = decode(t[k]); });
  t.src_self = t.src_self.map(decode);
  t.src_tot = t.src_tot.map(decode);
  var total = data.total_j || 1;
  var rows = t.fn.length;
  var columns = [
    { key: "fn", label: "function", cls: "fn", value: function (i) { return t.fn[i]; } },
    { key: "self_e", label: "self energy", value: function (i) { return t.self_e[i]; }, show: fmtJ, bar: true },
    { key: "tot_e", label: "total energy", value: function (i) { return t.tot_e[i]; }, show: fmtJ }
  ];
  if (data.sources.length === 1) {
    columns[1].label += " (" + data.sources[0].id + ")";
    columns[2].label += " (" + data.sources[0].id + ")";
  }
  data.sources.forEach(function (s, k) {
    if (!t.src_self.length) return;
    columns.push({ key: "ss" + k, label: "self J \u00b7 " + s.id, value: function (i) { return t.src_self[k][i]; }, show: fmtJ });
    columns.push({ key: "st" + k, label: "total J \u00b7 " + s.id, value: function (i) { return t.src_tot[k][i]; }, show: fmtJ });
  });
  columns.push(
    { key: "share", label: "share", value: function (i) { return t.tot_e[i] / total; },
      show: function (v) { return (v * 100).toFixed(1) + "%"; } },
    { key: "self_t", label: "self time", value: function (i) { return t.self_t[i]; }, show: fmtS },
    { key: "t", label: "total time", value: function (i) { return t.t[i]; }, show: fmtS },
    { key: "cpu", label: "CPU time", value: function (i) { return t.cpu[i]; }, show: fmtS },
    { key: "n", label: "samples", value: function (i) { return t.n[i]; }, show: String },
    // the sampling error of the self figure: from the function's own samples
    { key: "err", label: "self \u00b1", value: function (i) { return t.self_n[i] > 0 ? 1 / Math.sqrt(t.self_n[i]) : Infinity; },
      show: function (v) { return isFinite(v) ? "\u00b1" + Math.round(v * 100) + "%" : "\u2013"; },
      flag: function (i) { return data.resolution_s && t.t[i] > 0 && t.t[i] < data.resolution_s; } }
  );

  var state = { key: "self_e", desc: true, filter: "", page: 0, order: [] };
  var head = document.getElementById("fn-head");
  var body = document.getElementById("fn-body");
  var info = document.getElementById("page-info");
  var search = document.getElementById("table-search");
  var hay = null;
  var maxSelf = 0;
  for (var m = 0; m < rows; m++) if (t.self_e[m] > maxSelf) maxSelf = t.self_e[m];

  columns.forEach(function (c) {
    var th = el("th", c.cls || "", c.label);
    th.dataset.key = c.key;
    th.scope = "col";
    th.tabIndex = 0;
    th.addEventListener("click", function () { sortBy(c.key); });
    th.addEventListener("keydown", function (ev) { if (ev.key === "Enter") sortBy(c.key); });
    head.appendChild(th);
  });

  function sortBy(key) {
    if (state.key === key) state.desc = !state.desc;
    else { state.key = key; state.desc = key !== "fn"; }
    state.page = 0;
    refresh();
  }

  function haystack() {
    if (!hay) {
      hay = new Array(rows);
      for (var i = 0; i < rows; i++) hay[i] = (t.fn[i] + "\u0000" + t.files[t.file[i]]).toLowerCase();
    }
    return hay;
  }

  function refresh() {
    var col = columns.filter(function (c) { return c.key === state.key; })[0];
    var order = [];
    var q = state.filter.toLowerCase();
    var h = q ? haystack() : null;
    for (var i = 0; i < rows; i++) if (!q || h[i].indexOf(q) >= 0) order.push(i);
    var vals = new Array(rows);
    order.forEach(function (i) { vals[i] = col.value(i); });
    var sign = state.desc ? -1 : 1;
    order.sort(function (a, b) {
      var x = vals[a], y = vals[b];
      if (x < y) return -sign;
      if (x > y) return sign;
      return a - b;
    });
    state.order = order;
    Array.prototype.forEach.call(head.children, function (th) {
      if (th.dataset.key === state.key) th.setAttribute("aria-sort", state.desc ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    });
    draw();
  }

  function draw() {
    var order = state.order;
    var pages = Math.max(1, Math.ceil(order.length / PAGE));
    if (state.page >= pages) state.page = pages - 1;
    var start = state.page * PAGE;
    var end = Math.min(order.length, start + PAGE);
    var frag = document.createDocumentFragment();
    for (var r = start; r < end; r++) frag.appendChild(row(order[r]));
    body.replaceChildren(frag);
    info.textContent = order.length
      ? "functions " + (start + 1) + "\u2013" + end + " of " + order.length + (order.length < rows ? " (filtered from " + rows + ")" : "")
      : "no function matches";
    document.getElementById("page-prev").disabled = state.page === 0;
    document.getElementById("page-next").disabled = state.page >= pages - 1;
  }

  /* Clicking a row shades, on the timeline, the spans in which that function was on a stack. */
  var spans = data.spans || {};
  var baseShapes = (tl && data.timeline) ? (data.timeline.layout.shapes || []) : [];
  var selected = null;
  function select(i, tr) {
    if (!tl || !data.timeline) return;
    selected = selected === i ? null : i;
    Array.prototype.forEach.call(body.querySelectorAll("tr.selected"), function (r) { r.classList.remove("selected"); });
    var shapes = baseShapes.slice();
    if (selected !== null) {
      tr.classList.add("selected");
      (spans[String(i)] || []).forEach(function (s) {
        shapes.push({ type: "rect", xref: "x", yref: "paper", x0: s[0], x1: s[1], y0: 0, y1: 1,
                      fillcolor: "#1f77b4", opacity: 0.18, line: { width: 0 }, layer: "above" });
      });
    }
    Plotly.relayout(tl, { shapes: shapes });
    var hint = document.getElementById("timeline-selection");
    if (hint) hint.textContent = selected === null ? "" :
      "Shaded: when " + t.fn[i] + " was on a stack (" + (spans[String(i)] || []).length + " spans).";
  }

  function row(i) {
    var tr = el("tr", SPECIAL[t.fn[i]] ? "special" : "");
    if (i === selected) tr.classList.add("selected");
    tr.addEventListener("click", function () { select(i, tr); });
    columns.forEach(function (c) {
      if (c.key === "fn") {
        var td = el("td", "fn");
        td.appendChild(el("span", "name", t.fn[i]));
        var file = t.files[t.file[i]];
        if (file) td.appendChild(el("span", "where", file + ":" + t.line[i]));
        tr.appendChild(td);
        return;
      }
      var v = c.value(i);
      var cell = el("td");
      if (c.bar && maxSelf > 0) {
        var bar = el("span", "bar");
        bar.style.width = Math.max(1, Math.round(40 * v / maxSelf)) + "px";
        cell.appendChild(bar);
      }
      cell.appendChild(document.createTextNode(c.show(v)));
      if (c.flag && c.flag(i)) {
        var f = el("span", "short", " \u2691");
        f.title = "ran " + fmtS(t.t[i]) + ", under 3 sensor updates (" + fmtS(data.resolution_s) + "): below the sensor's resolution";
        cell.appendChild(f);
      }
      tr.appendChild(cell);
    });
    return tr;
  }

  var pending = null;
  search.addEventListener("input", function () {
    clearTimeout(pending);
    pending = setTimeout(function () { state.filter = search.value; state.page = 0; refresh(); }, 120);
  });
  document.getElementById("page-prev").addEventListener("click", function () { state.page--; draw(); });
  document.getElementById("page-next").addEventListener("click", function () { state.page++; draw(); });
  refresh();
})();
