/* energyprof report: draws the charts and the function table from the embedded JSON.
 * Data strings are only ever put into the page with textContent (never innerHTML), and plotly
 * labels arrive HTML-escaped from Python, so a function named like a closing script tag stays text. */
(function () {
  "use strict";
  var data = readData(document.getElementById("report-data"));
  /* The data block is raw deflate in base64 (data-encoding="deflate"): a fourth of the JSON's size.
   * Inflated here, synchronously, so the page draws as it loads (DecompressionStream is async). */
  function readData(node) {
    if (node.getAttribute("data-encoding") !== "deflate") return JSON.parse(node.textContent);
    var bin = atob(node.textContent.trim()), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return JSON.parse(new TextDecoder("utf-8").decode(inflate(bytes)));
  }

  /* RFC 1951, after zlib's puff.c: canonical Huffman codes decoded bit by bit (its tables are its own:
   * it runs before the rest of this script has set anything). */
  function inflate(src) {
    var LBASE = [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258];
    var LEXT = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
    var DBASE = [1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073,
                 4097, 6145, 8193, 12289, 16385, 24577];
    var DEXT = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
    var ORDER = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];
    var p = 0, buf = 0, cnt = 0, out = new Uint8Array(src.length * 4 + 1024), n = 0, i;
    function bits(k) {
      while (cnt < k) {
        if (p >= src.length) throw new Error("report data: cut short");
        buf |= src[p++] << cnt;
        cnt += 8;
      }
      var v = buf & ((1 << k) - 1);
      buf >>>= k;
      cnt -= k;
      return v;
    }
    function put(b) {
      if (n === out.length) { var grown = new Uint8Array(out.length * 2); grown.set(out); out = grown; }
      out[n++] = b;
    }
    function codes(lengths) {
      var count = new Uint16Array(16), offs = new Uint16Array(16), symbol = new Uint16Array(lengths.length), j;
      for (j = 0; j < lengths.length; j++) count[lengths[j]]++;
      count[0] = 0;
      for (j = 1; j < 16; j++) offs[j] = offs[j - 1] + count[j - 1];
      for (j = 0; j < lengths.length; j++) if (lengths[j]) symbol[offs[lengths[j]]++] = j;
      return { count: count, symbol: symbol };
    }
    function decode(h) {
      var code = 0, first = 0, index = 0;
      for (var len = 1; len < 16; len++) {
        code |= bits(1);
        var c = h.count[len];
        if (code - c < first) return h.symbol[index + (code - first)];
        index += c; first = (first + c) << 1; code <<= 1;
      }
      throw new Error("report data: not deflate");
    }
    var last, type, lit, dist;
    do {
      last = bits(1);
      type = bits(2);
      if (type === 0) {
        buf = 0; cnt = 0;  // a stored block starts at the next byte
        var len = src[p] | (src[p + 1] << 8);
        p += 4;
        for (i = 0; i < len; i++) put(src[p++]);
        continue;
      }
      if (type === 1) {
        var fixed = new Uint8Array(288);
        for (i = 0; i < 288; i++) fixed[i] = i < 144 ? 8 : i < 256 ? 9 : i < 280 ? 7 : 8;
        lit = codes(fixed);
        dist = codes(new Uint8Array(30).fill(5));
      } else if (type === 2) {
        var nlen = bits(5) + 257, ndist = bits(5) + 1, ncode = bits(4) + 4, cl = new Uint8Array(19);
        for (i = 0; i < ncode; i++) cl[ORDER[i]] = bits(3);
        var clc = codes(cl), lengths = new Uint8Array(nlen + ndist);
        for (i = 0; i < nlen + ndist;) {
          var sym = decode(clc), rep, val = 0;
          if (sym < 16) { lengths[i++] = sym; continue; }
          if (sym === 16) { val = lengths[i - 1]; rep = 3 + bits(2); }
          else if (sym === 17) rep = 3 + bits(3);
          else rep = 11 + bits(7);
          while (rep-- > 0 && i < lengths.length) lengths[i++] = val;
        }
        lit = codes(lengths.subarray(0, nlen));
        dist = codes(lengths.subarray(nlen));
      } else {
        throw new Error("report data: not deflate");
      }
      for (;;) {
        var s = decode(lit);
        if (s < 256) { put(s); continue; }
        if (s === 256) break;
        s -= 257;
        var length = LBASE[s] + bits(LEXT[s]), d = decode(dist), back = DBASE[d] + bits(DEXT[d]);
        for (i = 0; i < length; i++) put(out[n - back]);
      }
    } while (!last);
    return out.subarray(0, n);
  }

  var PAGE = 100;
  var CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"] };

  /* Numbers: the same table of units and the same rounding as energyprof/render/format.py
   * (sent as data.format), so a figure reads the same in the console, the page and its scripts. */
  var FMT = data.format;
  function sig(x, d) {
    if (x === 0) return "0";
    var a = Math.abs(x), r = Number(a.toPrecision(d));
    var k = Math.max(0, d - 1 - Math.floor(Math.log10(r) + 1e-12));
    var s = r.toFixed(k);
    if (s.indexOf(".") >= 0) s = s.replace(/0+$/, "").replace(/\.$/, "");
    return (x < 0 ? "-" : "") + s;
  }
  var ZERO = { energy: "J", power: "W", bytes: "B", grams: "g", seconds: "s" };
  function scaled(x, kind) {
    var units = FMT.units[kind], a = Math.abs(x);
    if (a === 0) return "0 " + ZERO[kind];
    for (var k = 0; k < units.length; k++) {
      if (a >= units[k][0] || k === units.length - 1) {
        var s = sig(x / units[k][0], FMT.digits);
        if (k > 0 && s.replace("-", "") === "1000") { k--; s = sig(x / units[k][0], FMT.digits); }
        return s + " " + units[k][1];
      }
    }
  }
  function pad2(n) { return (n < 10 ? "0" : "") + n; }
  function fmtS(s) {
    if (s === null || s === undefined) return "\u2013";
    var a = Math.abs(s), sign = s < 0 ? "-" : "";
    if (a >= 59.5) {
      if (a >= 3570) { var m = Math.floor(a / 60 + 0.5); return sign + Math.floor(m / 60) + " h " + pad2(m % 60) + " min"; }
      var t = Math.floor(a + 0.5);
      return sign + Math.floor(t / 60) + " min " + pad2(t % 60) + " s";
    }
    return scaled(s, "seconds");
  }
  function fmtJ(j) { return scaled(j, "energy"); }
  function fmtPct(part, whole) {
    if (!whole) return "\u2013";
    return fmtPercent(part / whole * 100);
  }
  function fmtPercent(p) { return (Math.floor(p * 10 + 0.5) / 10).toFixed(1) + "%"; }
  window.energyprofFormat = { energy: fmtJ, seconds: fmtS, bytes: function (b) { return scaled(b, "bytes"); },
    grams: function (g) { return scaled(g, "grams"); }, power: function (w) { return scaled(w, "power"); },
    percent: fmtPct, sig: sig };
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
  var idle = document.getElementById("chart-idle");
  var IDLE = "[other processes and idle]", OWN = "[energyprof]";
  var tree = data.chart.full;
  var PROGRAM = data.program_j || data.total_j || 1;
  var t = data.table;
  /* A file whole: its folder (shared by many) and the name the table shows (see _file_names in charts.py). */
  function fileName(k) {
    return t.dir[k] >= 0 ? t.dirs[t.dir[k]] + t.short[k] : t.full[String(k)];
  }
  /* The tree arrives without repeats (icicle_trace in charts.py): a label that is its row's function
   * name is "", colours are indices into one palette, and each tooltip is built here from the arrays. */
  function escape(t) { return t.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;"); }
  tree.labels = tree.labels.map(function (l, i) { return l || (tree.row[i] >= 0 ? escape(t.fn[tree.row[i]]) : l); });
  ["colour_file", "colour_mix"].forEach(function (k) { tree[k] = tree[k].map(function (c) { return tree.palette[c]; }); });
  function decodeColumn(col) { var f = Math.pow(10, col.exp); return col.v.map(function (v) { return v * f; }); }
  var selfE = decodeColumn(tree.self_e);
  tree.value_e = decodeColumn(tree.value_e);
  tree.value_t = decodeColumn(tree.value_t);
  // idle's and energyprof's boxes, which the idle switch leaves out (their names need no escaping)
  var special = tree.labels.map(function (l) { return l === IDLE || l === OWN; });
  var hasChildren = new Uint8Array(tree.parents.length);
  tree.parents.forEach(function (p) { if (p >= 0) hasChildren[p] = 1; });
  function halfEven(x) {  // Python's format rounds an exact half to even: the same "±2%" for 1,600 samples
    var r = Math.round(x);
    return (r - x === 0.5 && r % 2) ? r - 1 : r;
  }
  function hover(i) {
    var key = String(i), r = tree.row[i], head = tree.head[key];
    if (!head) {
      if (tree.folded[key]) head = ["other: " + tree.folded[key] + " smaller call paths"];
      else if (tree.kind[i] === 3) head = [tree.labels[i], hasChildren[i] ? "click to show its frames" : ""];
      else {
        var file = fileName(t.file[r]);
        head = [escape(t.fn[r])].concat(file ? [escape(file + ":" + t.line[r])] : []);
      }
    }
    var e = tree.value_e[i], time = tree.value_t[i], n = tree.samples[i];
    var energy = tree.parents[i] < 0
      ? "the program's energy " + fmtJ(data.program_j) + " (100%); the machine measured " + fmtJ(data.total_j)
      : "energy " + fmtJ(e) + " (" + fmtPct(e, data.program_j) + " of the program's), self " + fmtJ(selfE[i]);
    var parts = head.concat([energy, "time (summed over threads) " + fmtS(time) + " (" + fmtPct(time, tree.value_t[0] || 1) +
      "), samples " + n + (n ? " \u00b1" + halfEven(100 / Math.sqrt(n)) + "%" : "")]);
    if (tree.split[i] >= 0) parts.push(tree.splits[tree.split[i]]);
    var text = parts.filter(function (p) { return p; }).join("<br>");
    return tree.through[key] ? text + "<br>called through " + tree.through[key] : text;
  }
  var hasGroups = tree.kind.indexOf(3) >= 0;
  if (!hasGroups) {
    collapse.disabled = true;
    collapse.parentNode.title = "no library or import frames in this profile";
  }
  var expanded = {};  // group box index (in data.chart.full) -> shown open
  var selectedRow = null;
  var currentLevel = "";  // the box the icicle is zoomed into ("" = the root)
  var shown = null;   // the boxes drawn: arrays plus, per box, the chart nodes it stands for

  /* The boxes to draw. A library or import frame whose group is folded is not drawn: its box is
   * its group's, and what it calls back in user code appears under the group (merged with a
   * sibling of the same function). Values stay totals of disjoint subtrees, so each parent is at
   * least the sum of its children. The idle box (unless asked for) is dropped and its value
   * taken off its ancestors. */
  function visibleTree() {
    var n = tree.parents.length, values = metric.value === "t" ? tree.value_t : tree.value_e;
    var fold = collapse.checked && hasGroups;
    var colours = colour.value === "mix" ? tree.colour_mix : tree.colour_file;
    var vis = new Int32Array(n), dropped = new Uint8Array(n), byKey = {}, drops = [];
    var out = { ids: [], parents: [], labels: [], hovertext: [], values: [], colours: [], members: [], rows: [], kinds: [] };
    for (var i = 0; i < n; i++) {
      var p = tree.parents[i], k = tree.kind[i];
      if (p >= 0 && dropped[p]) { dropped[i] = 1; continue; }
      if (!idle.checked && special[i]) { dropped[i] = 1; drops.push([vis[p], values[i]]); continue; }
      if (fold && (k === 1 || k === 2) && tree.group[i] >= 0 && !expanded[tree.group[i]]) { vis[i] = vis[p]; continue; }
      var vp = p >= 0 ? vis[p] : -1;
      var key = vp + "|" + (k === 3 ? "g" + tree.labels[i] : tree.row[i] >= 0 ? "r" + tree.row[i] : "n" + i);
      var v = byKey[key];
      if (v === undefined) {
        v = byKey[key] = out.ids.length;
        out.ids.push("b" + v); out.parents.push(vp >= 0 ? "b" + vp : ""); out.labels.push(tree.labels[i]);
        out.hovertext.push(hover(i)); out.values.push(0); out.colours.push(colours[i]);
        out.members.push([]); out.rows.push(tree.row[i]); out.kinds.push(k);
      }
      out.values[v] += values[i];
      out.members[v].push(i);
      vis[i] = v;
    }
    drops.forEach(function (d) {
      for (var a = d[0]; a >= 0; a = out.parents[a] ? Number(out.parents[a].slice(1)) : -1) out.values[a] -= d[1];
    });
    for (var j = 0; j < out.values.length; j++) if (out.values[j] < 0) out.values[j] = 0;
    /* Sums in a different order can leave a parent an ulp below its children, and plotly then
     * draws nothing: lift each parent to its children's sum (boxes come after their parents). */
    var sums = new Float64Array(out.values.length);
    for (j = out.values.length - 1; j > 0; j--) {
      if (sums[j] > out.values[j]) out.values[j] = sums[j];
      sums[Number(out.parents[j].slice(1))] += out.values[j];
    }
    if (out.values.length && sums[0] > out.values[0]) out.values[0] = sums[0];
    return out;
  }

  function outline() {
    return shown.rows.map(function (r) { return r >= 0 && r === selectedRow ? "#111" : "#fff"; });
  }
  /* A box's label, wrapped to the width it will have at the top level (plotly does not wrap, and
   * hides what does not fit): the name broken at dots and underscores, then joules and percent,
   * side by side when they fit. A group box says its package on a line of its own. */
  var CHAR_PX = 6.6, LINE_PX = 14;
  function unescape(t) { return t.replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&"); }
  function wrap(text, chars, lines) {
    var out = [], rest = text;
    while (rest.length > chars && out.length < lines - 1) {
      var cut = -1;
      for (var k = Math.min(chars, rest.length - 1); k > 2; k--) if (".:_ <>".indexOf(rest[k - 1]) >= 0) { cut = k; break; }
      if (cut < 0) cut = chars;
      out.push(rest.slice(0, cut));
      rest = rest.slice(cut);
    }
    if (rest.length > chars) rest = rest.slice(0, Math.max(1, chars - 1)) + "\u2026";
    out.push(rest);
    return out;
  }
  function boxLabels() {
    var width = icicle.clientWidth || 1200, height = (icicle.clientHeight || 470) - 30;
    var depth = new Int32Array(shown.ids.length), rows = 1;
    for (var i = 1; i < shown.ids.length; i++) {
      depth[i] = depth[Number(shown.parents[i].slice(1))] + 1;
      if (depth[i] + 1 > rows) rows = depth[i] + 1;
    }
    var maxLines = Math.max(1, Math.floor(height / rows / LINE_PX));
    var root = shown.values[0] || 1;
    return shown.values.map(function (v, b) {
      var chars = Math.max(1, Math.floor((v / root * width - 6) / CHAR_PX));
      var label = unescape(shown.labels[b]), head = [];
      var m = shown.kinds[b] === 3 && /^\[library: ([^\]]*)\] (.*)$/.exec(label);
      if (m) { head = ["[" + m[1] + "]"]; label = m[2]; }
      var figure = metric.value === "t" ? fmtS(v) : fmtJ(v);
      var share = metric.value === "t" ? fmtPct(v, root) : fmtPct(v, PROGRAM);
      /* the name first (up to two lines), then the figures, then the package if there is room */
      var both = figure + " \u00b7 " + share;
      var nameLines = Math.min(wrap(label, chars, 2).length, Math.max(1, maxLines - 1));
      var left = maxLines - nameLines;
      var tail = both.length <= chars ? [both] : (left >= 2 ? [figure, share] : [share]);
      if (left < 1) tail = [];
      if (left - tail.length < 1) head = [];
      var room = nameLines;
      var name = wrap(label, chars, room).map(function (l) { return "<b>" + escape(l) + "</b>"; });
      return head.map(function (h) { return escape(h.length > chars ? h.slice(0, chars) : h); }).concat(name, tail).join("<br>");
    });
  }

  function icicleTrace() {
    shown = visibleTree();
    var text = boxLabels();
    /* The selected function's boxes are outlined by colour: a per-box line width breaks plotly's
     * path bar once zoomed (NaN paths), so the width is one number. */
    var lineC = outline();
    return {
      type: "icicle", ids: shown.ids, parents: shown.parents, labels: shown.labels,
      values: shown.values, branchvalues: "total", customdata: text,
      level: shown.ids.indexOf(currentLevel) >= 0 ? currentLevel : "",
      marker: { colors: shown.colours, line: { width: 1.5, color: lineC } },
      hovertext: shown.hovertext, hoverinfo: "text",
      texttemplate: "%{customdata}", textposition: "top left", insidetextfont: { size: 11 },
      tiling: { orientation: "v", flip: flame.checked ? "y" : "" }, pathbar: { visible: true, side: flame.checked ? "bottom" : "top" }
    };
  }
  function drawIcicle() {
    var layout = { margin: { l: 2, r: 2, t: 28, b: 2 }, height: icicle.clientHeight || 470,
                   uniformtext: { mode: "hide", minsize: 9 } };
    return Plotly.react(icicle, [icicleTrace()], layout, { responsive: true, displayModeBar: false });
  }
  [metric, colour, collapse, flame, idle].forEach(function (c) { c.addEventListener("change", drawIcicle); });
  drawIcicle();
  icicle.on("plotly_icicleclick", function (ev) {
    var pt = ev && ev.points && ev.points[0];
    if (!pt || !shown) return;
    var b = Number(String(pt.id).slice(1));
    if (shown.kinds[b] === 3) {  // a group box: show (or fold again) the frames inside it
      var open = !expanded[shown.members[b][0]];
      shown.members[b].forEach(function (g) { expanded[g] = open; });
      drawIcicle();
      return false;
    }
    /* Zoom without plotly's animation (restyling the outline during it draws NaN paths), then select. */
    var level = ev.nextLevel !== undefined ? ev.nextLevel : (pt.nextLevel !== undefined ? pt.nextLevel : pt.id);
    currentLevel = level || "";
    Plotly.restyle(icicle, { level: [currentLevel] });
    if (shown.rows[b] >= 0) selectRow(shown.rows[b], true);
    return false;
  });

  /* A legend for the file colours */
  var legend = document.getElementById("chart-legend");
  if (legend) (data.chart.legend || []).forEach(function (item) {
    var span = el("span", "legend-item");
    var sw = el("span", "swatch");
    sw.style.background = item.colour;
    span.appendChild(sw);
    span.appendChild(document.createTextNode(item.label));
    if (item.title) span.title = item.title;
    legend.appendChild(span);
  });

  /* ------------------------------------------------------------ timeline */
  var tl = document.getElementById("timeline-plot");
  /* The timeline arrives packed (packed_timeline in charts.py): shared time axes, shapes as rows. */
  function unpackDicts(p) {
    if (!p || Array.isArray(p)) return p;
    if (p.whole) return p.whole;
    return p.rows.map(function (row) {
      var d = JSON.parse(JSON.stringify(p.common));
      p.keys.forEach(function (k, j) { d[k] = p.choices[k] ? p.choices[k][row[j]] : row[j]; });
      return d;
    });
  }
  if (data.timeline) {
    data.timeline.data.forEach(function (tr) { if (typeof tr.x === "number") tr.x = data.timeline.xs[tr.x]; });
    ["shapes", "annotations"].forEach(function (k) {
      if (data.timeline.layout[k]) data.timeline.layout[k] = unpackDicts(data.timeline.layout[k]);
    });
  }
  if (tl && data.timeline) Plotly.newPlot(tl, data.timeline.data, data.timeline.layout, CONFIG);
  (data.sweeps || []).forEach(function (s, i) {  /* sweeps inside the run: energy against time, front joined */
    var div = document.getElementById("sweep-" + i);
    if (div) Plotly.newPlot(div, s.figure.data, s.figure.layout, CONFIG);
  });

  /* ------------------------------------------------------------ table */
  /* numeric columns arrive as {exp, v}: value = v * 10^exp (see scaled_column in html.py) */
  function decode(col) {
    var f = Math.pow(10, col.exp), out = new Float64Array(col.v.length);
    for (var i = 0; i < out.length; i++) out[i] = col.v[i] * f;
    return out;
  }
  ["self_e", "tot_e", "self_t", "t", "cpu"].forEach(function (k) { t[k] = decode(t[k]); });
  t.src_self = t.src_self.map(decode);
  t.src_tot = t.src_tot.map(decode);
  var rows = t.fn.length;
  function perSource(which, i) {
    if (!which.length) return "";
    return data.sources.map(function (s, k) { return s.id + " " + fmtJ(which[k][i]); }).join(", ");
  }
  var one = data.sources.length === 1 ? " (" + data.sources[0].id + ")" : "";
  var columns = [
    { key: "fn", label: "function", cls: "fn", value: function (i) { return t.fn[i]; } },
    { key: "self_e", label: "self energy" + one, value: function (i) { return t.self_e[i]; }, show: fmtJ, bar: true,
      tip: function (i) { return perSource(t.src_self, i); } },
    { key: "self_p", label: "self %", title: "self energy as a share of the program's energy",
      value: function (i) { return t.self_p[i]; }, show: sharePercent },
    { key: "tot_e", label: "total energy" + one, value: function (i) { return t.tot_e[i]; }, show: fmtJ,
      tip: function (i) { return perSource(t.src_tot, i); } },
    { key: "tot_p", label: "total %", title: "total (inclusive) energy as a share of the program's energy",
      value: function (i) { return t.tot_p[i]; }, show: sharePercent },
    { key: "self_t", label: "self time", value: function (i) { return t.self_t[i]; }, show: fmtS },
    { key: "t", label: "total time (summed)", value: function (i) { return t.t[i]; }, show: fmtS,
      title: "inclusive wall time, summed over threads and processes: it can exceed the run's duration" },
    { key: "cpu", label: "CPU time (summed)", value: function (i) { return t.cpu[i]; }, show: fmtS,
      title: "inclusive CPU time, summed over threads and processes" },
    { key: "n", label: "samples", value: function (i) { return t.n[i]; }, show: String },
    // the sampling error of the self figure: from the function's own samples
    { key: "err", label: "self \u00b1", title: "sampling error of the self figures: 1/\u221a(self samples)",
      value: function (i) { return t.self_n[i] > 0 ? 1 / Math.sqrt(t.self_n[i]) : Infinity; },
      show: function (v) { return isFinite(v) ? "\u00b1" + Math.round(v * 100) + "%" : "\u2013"; },
      flag: function (i) { return data.resolution_s && t.t[i] > 0 && t.t[i] < data.resolution_s; } }
  ];
  /* A tree with a [backward] frame: each row's total energy as its forward and its backward (they add up to it). */
  if (t.fwd_e) {
    t.fwd_e = decode(t.fwd_e);
    t.bwd_e = decode(t.bwd_e);
    columns.splice(5, 0,
      { key: "fwd_e", label: "forward", title: "the part of the total energy outside backward: forward, and the rest",
        value: function (i) { return t.fwd_e[i]; }, show: fmtJ },
      { key: "bwd_e", label: "backward", title: "the part of the total energy under [backward] or torch's backward()" +
        " frames, with its sampling error, 1/\u221a(samples under backward)",
        value: function (i) { return t.bwd_e[i]; },
        show: function (v, i) { return fmtJ(v) + (v > 0 && t.bwd_n[i] > 0 ? " \u00b1" + Math.round(100 / Math.sqrt(t.bwd_n[i])) + "%" : ""); } });
  }

  /* It opens on the user's own functions by total energy; a click on a column sorts every row. */
  /* Idle is not part of the program: more than all of it reads as a multiple, never "153%". */
  function sharePercent(p, i) {
    if (t.special[i] && p > 100) return (Math.floor(p / 10 + 0.5) / 10).toFixed(1) + "\u00d7 the program";
    return fmtPercent(p);
  }

  var state = { key: "tot_e", desc: true, filter: "", page: 0, order: [], ownFirst: !!t.own };
  /* Until a column is clicked, every function outside the user's code is folded under the library or import
   * it spent the most self energy in (`groups`, largest first): the table opens on the user's own functions.
   * A group's entry in the order is -(g + 1); a click on its row opens it. */
  var groups = t.groups || { label: [] }, opened = {};
  function folding() { return state.ownFirst && !state.filter && groups.label.length > 0; }
  var head = document.getElementById("fn-head");
  var body = document.getElementById("fn-body");
  var info = document.getElementById("page-info");
  var search = document.getElementById("table-search");
  var hay = null;
  var maxSelf = 0;
  for (var m = 0; m < rows; m++) if (t.self_e[m] > maxSelf) maxSelf = t.self_e[m];

  columns.forEach(function (c) {
    var th = el("th", c.cls || "", c.label);
    if (c.title) th.title = c.title;
    if (t.fwd_e) th.style.whiteSpace = "normal";  /* two more columns: headers wrap so the table fits */
    th.dataset.key = c.key;
    th.scope = "col";
    th.tabIndex = 0;
    th.addEventListener("click", function () { sortBy(c.key); });
    th.addEventListener("keydown", function (ev) { if (ev.key === "Enter") sortBy(c.key); });
    head.appendChild(th);
  });

  function sortBy(key) {
    state.ownFirst = false;
    if (state.key === key) state.desc = !state.desc;
    else { state.key = key; state.desc = key !== "fn"; }
    state.page = 0;
    refresh();
  }

  function haystack() {
    if (!hay) {
      hay = new Array(rows);
      for (var i = 0; i < rows; i++) hay[i] = (t.fn[i] + "\u0000" + fileName(t.file[i])).toLowerCase();
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
    /* The program's functions first, whatever the column: idle and energyprof are not the
     * program's, so they sort after it (they keep their own rows and figures). */
    order.sort(function (a, b) {
      var sa = t.special[a] ? 1 : 0, sb = t.special[b] ? 1 : 0;
      if (sa !== sb) return sa - sb;
      if (state.ownFirst && t.own[a] !== t.own[b]) return t.own[b] - t.own[a];
      var x = vals[a], y = vals[b];
      if (x < y) return -sign;
      if (x > y) return sign;
      return a - b;
    });
    state.order = folding() ? folded(order) : order;
    Array.prototype.forEach.call(head.children, function (th) {
      if (th.dataset.key === state.key) th.setAttribute("aria-sort", state.desc ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    });
    draw();
  }

  /* The sorted order with each group's functions out of it, the group's row in their place (after the user's
   * functions, before idle and energyprof), and an open group's functions beneath it by self energy. */
  function folded(order) {
    var mine = [], rest = [], last = [], members = groups.label.map(function () { return []; });
    order.forEach(function (i) {
      var g = t.group ? t.group[i] : -1;
      if (g >= 0) members[g].push(i);
      else if (t.special[i]) last.push(i);
      else if (t.own[i]) mine.push(i);
      else rest.push(i);
    });
    var out = mine;
    members.forEach(function (m, g) {
      out.push(-(g + 1));
      if (opened[g]) out = out.concat(m.sort(function (a, b) { return t.self_e[b] - t.self_e[a] || a - b; }));
    });
    return out.concat(rest, last);
  }

  function draw() {
    var order = state.order;
    var pages = Math.max(1, Math.ceil(order.length / PAGE));
    if (state.page >= pages) state.page = pages - 1;
    var start = state.page * PAGE;
    var end = Math.min(order.length, start + PAGE);
    var frag = document.createDocumentFragment();
    for (var r = start; r < end; r++) frag.appendChild(order[r] < 0 ? groupRow(-order[r] - 1) : row(order[r]));
    body.replaceChildren(frag);
    info.textContent = !order.length ? "no function matches" : folding()
      ? "rows " + (start + 1) + "\u2013" + end + " of " + order.length + ": your functions, then each library and import" +
        " folded (a click opens one; a click on a column lists all " + rows + " functions)"
      : "functions " + (start + 1) + "\u2013" + end + " of " + order.length +
        (order.length < rows ? " (filtered from " + rows + ")" : "");
    document.getElementById("page-prev").disabled = state.page === 0;
    document.getElementById("page-next").disabled = state.page >= pages - 1;
  }

  /* Selecting a function (a table row or an icicle box): its row is marked, its boxes outlined,
   * and the spans in which it was on a stack are shaded on the timeline. */
  /* Spans arrive as steps between indices into one sorted list of edges (packed_spans in charts.py). */
  var spans = {};
  Object.keys((data.spans && data.spans.rows) || {}).forEach(function (row) {
    var steps = data.spans.lists[data.spans.rows[row]], at = 0, out = [];
    for (var k = 0; k + 1 < steps.length; k += 2) {
      var a = at + steps[k], b = a + steps[k + 1];
      out.push([data.spans.edges[a], data.spans.edges[b]]);
      at = b;
    }
    spans[row] = out;
  });
  var baseShapes = (tl && data.timeline) ? (data.timeline.layout.shapes || []) : [];
  function selectRow(i, fromChart) {
    selectedRow = (selectedRow === i && !fromChart) ? null : i;
    Array.prototype.forEach.call(body.querySelectorAll("tr"), function (r) {
      r.classList.toggle("selected", selectedRow !== null && Number(r.dataset.row) === selectedRow);
    });
    if (fromChart && selectedRow !== null && !body.querySelector("tr.selected")) {
      if (folding() && t.group[selectedRow] >= 0 && !opened[t.group[selectedRow]]) {
        opened[t.group[selectedRow]] = true;  // its group was folded: open it
        refresh();
      }
      var at = state.order.indexOf(selectedRow);  // bring the row into the table's page
      if (at < 0) { state.filter = ""; search.value = ""; refresh(); at = state.order.indexOf(selectedRow); }
      if (at >= 0) { state.page = Math.floor(at / PAGE); draw(); }
    }
    var tr = body.querySelector("tr.selected");
    /* Bring the row into the table's own scroll box, never by scrolling the page: the box clicked
     * in the chart stays where the reader is looking. */
    var wrap = tr && tr.closest(".fn-wrap");
    if (fromChart && wrap) {
      var wr = wrap.getBoundingClientRect(), rr = tr.getBoundingClientRect();
      if (rr.top < wr.top || rr.bottom > wr.bottom) wrap.scrollTop += rr.top - wr.top - (wr.height - rr.height) / 2;
    }
    Plotly.restyle(icicle, { "marker.line.color": [outline()] });
    var sel = document.getElementById("selection");
    if (sel) sel.textContent = selectedRow === null ? "" : "Selected: " + t.fn[selectedRow] +
      " \u00b7 self " + fmtJ(t.self_e[selectedRow]) + " (" + fmtPercent(t.self_p[selectedRow]) + " of the program's energy)";
    if (!tl || !data.timeline) return;
    var shapes = baseShapes.slice();
    if (selectedRow !== null) {
      (spans[String(selectedRow)] || []).forEach(function (s) {
        shapes.push({ type: "rect", xref: "x", yref: "paper", x0: s[0], x1: s[1], y0: 0, y1: 1,
                      fillcolor: "#1f77b4", opacity: 0.18, line: { width: 0 }, layer: "above" });
      });
    }
    Plotly.relayout(tl, { shapes: shapes });
    var hint = document.getElementById("timeline-selection");
    if (hint) hint.textContent = selectedRow === null ? "" :
      "Shaded: when " + t.fn[selectedRow] + " was on a stack (" + (spans[String(selectedRow)] || []).length + " spans).";
  }

  /* A library's or import's row: the self energy of every frame that ran in it, and how many functions. */
  function groupRow(g) {
    var tr = el("tr", "group" + (opened[g] ? " open" : ""));
    tr.dataset.group = g;
    tr.tabIndex = 0;
    tr.setAttribute("aria-expanded", opened[g] ? "true" : "false");
    tr.title = "the energy of every frame that ran in " + groups.label[g] + " (their self energy); click to " +
      (opened[g] ? "fold it" : "list its functions");
    function toggle() { opened[g] = !opened[g]; refresh(); }
    tr.addEventListener("click", toggle);
    tr.addEventListener("keydown", function (ev) { if (ev.key === "Enter") toggle(); });
    var n = groups.samples[g];
    var cells = { self_e: fmtJ(groups.e[g]), self_p: fmtPercent(groups.p[g]), n: String(n),
                  err: n > 0 ? "\u00b1" + Math.round(100 / Math.sqrt(n)) + "%" : "\u2013" };
    columns.forEach(function (c) {
      if (c.key === "fn") {
        var td = el("td", "fn");
        td.appendChild(el("span", "name group-name", (opened[g] ? "\u25be " : "\u25b8 ") + groups.label[g]));
        td.appendChild(el("span", "where", groups.count[g] + (groups.count[g] === 1 ? " function" : " functions")));
        tr.appendChild(td);
        return;
      }
      var cell = el("td");
      if (c.bar && maxSelf > 0) {
        var bar = el("span", "bar");
        bar.style.width = Math.max(1, Math.min(40, Math.round(40 * groups.e[g] / maxSelf))) + "px";
        cell.appendChild(bar);
      }
      cell.appendChild(document.createTextNode(cells[c.key] || ""));
      tr.appendChild(cell);
    });
    return tr;
  }

  function row(i) {
    var tr = el("tr", t.special[i] ? "special" : (folding() && t.group && t.group[i] >= 0 ? "member" : ""));
    tr.dataset.row = i;
    if (i === selectedRow) tr.classList.add("selected");
    tr.addEventListener("click", function () { selectRow(i, false); });
    columns.forEach(function (c) {
      if (c.key === "fn") {
        var td = el("td", "fn");
        td.appendChild(el("span", "name", t.fn[i]));
        var file = fileName(t.file[i]);
        if (file) {
          var w = el("span", "where", t.short[t.file[i]] + ":" + t.line[i]);
          w.title = file + ":" + t.line[i];
          td.appendChild(w);
        }
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
      cell.appendChild(document.createTextNode(c.show(v, i)));
      var tip = c.tip && c.tip(i);
      if (tip) cell.title = tip;
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
