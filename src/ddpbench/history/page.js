// Draws every chart of the ddpbench history page from the JSON in #history-data, as inline SVG:
// the run medians in commit order, their IQR band (absent where a run kept no rounds), the detected
// steps, A/B verdict marks, and one tooltip div for hover. Plain DOM, no libraries: the page must
// open offline and draw a few hundred charts at once.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("history-data").textContent);
  var W = 640, H = 210, LEFT = 64, RIGHT = 14, TOP = 18, BOTTOM = 30;
  var NO_SPREAD = "no spread (saved without --benchmark-save-data)";
  var tooltip = document.getElementById("tooltip");

  function esc(text) {
    return String(text).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; });
  }

  function ms(value) {
    return value >= 100 ? value.toFixed(1) : value.toPrecision(4);
  }

  // About `count` round-numbered ticks covering [lo, hi], labelled with the decimals their step needs.
  function ticks(lo, hi, count) {
    var raw = (hi - lo) / count, unit = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 5, 10].map(function (k) { return k * unit; }).filter(function (s) { return s >= raw; })[0];
    var decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9)), out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push([v, v.toFixed(decimals)]);
    return out;
  }

  // One point element per run: a triangle for an A/B regression (up) or improvement (down), else a dot.
  function pointMarkup(p, i, x, y, run) {
    var verdict = p[4] || "", cls = "pt" + (p[2] === null ? " nospread" : "") + (verdict ? " " + verdict : "");
    var attrs = ' class="' + esc(cls) + '" data-i="' + i + '" data-commit="' + esc(run[0]) + '"';
    if (verdict === "regression" || verdict === "improvement") {
      var d = verdict === "regression" ? -1 : 1, s = 6;
      return '<path' + attrs + ' d="M' + x + "," + (y + d * s) + "L" + (x + s) + "," + (y - d * s * 0.8) +
        "L" + (x - s) + "," + (y - d * s * 0.8) + 'Z"/>';
    }
    return '<circle' + attrs + ' cx="' + x + '" cy="' + y + '" r="' + (verdict ? 4 : 3) + '"/>';
  }

  // The IQR band as one polygon per stretch of consecutive runs that kept their rounds.
  function bandMarkup(points, xs, y) {
    var out = "", stretch = [];
    function flush() {
      if (stretch.length === 1) {
        var i = stretch[0];
        out += '<rect class="band" x="' + (xs[i] - 3) + '" y="' + y(points[i][3]) + '" width="6" height="' +
          Math.max(0.5, y(points[i][2]) - y(points[i][3])) + '"/>';
      } else if (stretch.length > 1) {
        var upper = stretch.map(function (i) { return xs[i] + "," + y(points[i][3]); });
        var lower = stretch.slice().reverse().map(function (i) { return xs[i] + "," + y(points[i][2]); });
        out += '<polygon class="band" points="' + upper.concat(lower).join(" ") + '"/>';
      }
      stretch = [];
    }
    points.forEach(function (p, i) { if (p[2] === null) flush(); else stretch.push(i); });
    flush();
    return out;
  }

  function draw(figure) {
    var series = DATA.series[Number(figure.getAttribute("data-series"))], points = series.points;
    var lo = Infinity, hi = -Infinity;
    points.forEach(function (p) {
      lo = Math.min(lo, p[2] === null ? p[1] : p[2]);
      hi = Math.max(hi, p[3] === null ? p[1] : p[3]);
    });
    var pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.05 || 1;
    lo -= pad; hi += pad;
    var plotW = W - LEFT - RIGHT, plotH = H - TOP - BOTTOM, n = points.length;
    var xs = points.map(function (p, i) { return +(LEFT + (n === 1 ? plotW / 2 : (i * plotW) / (n - 1))).toFixed(1); });
    function y(v) { return +(TOP + plotH - ((v - lo) / (hi - lo)) * plotH).toFixed(1); }

    var svg = '<svg viewBox="0 0 ' + W + " " + H + '" role="img" aria-label="median time per run">';
    svg += '<line class="axis" x1="' + LEFT + '" y1="' + (TOP + plotH) + '" x2="' + (W - RIGHT) + '" y2="' + (TOP + plotH) + '"/>';
    ticks(lo, hi, 4).forEach(function (tick) {
      var ty = y(tick[0]);
      svg += '<line class="axis" x1="' + LEFT + '" y1="' + ty + '" x2="' + (W - RIGHT) + '" y2="' + ty + '" opacity="0.5"/>' +
        '<text class="tick" x="' + (LEFT - 6) + '" y="' + (ty + 4) + '" text-anchor="end">' + tick[1] + " ms</text>";
    });
    var labelled = Math.min(n, 6);
    for (var k = 0; k < labelled; k++) {
      var i = labelled === 1 ? 0 : Math.round((k * (n - 1)) / (labelled - 1)), run = DATA.runs[points[i][0]];
      var anchor = labelled > 1 && k === 0 ? "start" : labelled > 1 && k === labelled - 1 ? "end" : "middle";
      svg += '<text class="tick" x="' + xs[i] + '" y="' + (H - 10) + '" text-anchor="' + anchor + '">' + esc(run[0]) + "</text>";
    }
    svg += bandMarkup(points, xs, y);
    svg += '<polyline class="line" points="' + points.map(function (p, i) { return xs[i] + "," + y(p[1]); }).join(" ") + '"/>';
    series.steps.forEach(function (step) {
      var x = ((xs[step[0] - 1] + xs[step[0]]) / 2).toFixed(1);
      svg += '<line class="stepline" x1="' + x + '" y1="' + TOP + '" x2="' + x + '" y2="' + (TOP + plotH) + '"/>' +
        '<text class="steplabel" x="' + (+x + 4) + '" y="' + (TOP + 10) + '">\u00d7' + step[1].toFixed(2) + "</text>";
    });
    svg += points.map(function (p, i) { return pointMarkup(p, i, xs[i], y(p[1]), DATA.runs[p[0]]); }).join("");
    figure.querySelector(".plot").innerHTML = svg + "</svg>";
    figure.setAttribute("data-drawn", "true");
  }

  function line(text, cls) {
    var div = document.createElement("div");
    div.textContent = text;
    if (cls) div.className = cls;
    return div;
  }

  function showTooltip(pt) {
    var figure = pt.closest(".chart"), series = DATA.series[Number(figure.getAttribute("data-series"))];
    var p = series.points[Number(pt.getAttribute("data-i"))], run = DATA.runs[p[0]];
    tooltip.replaceChildren(
      line("commit " + run[0] + " on " + run[1] + (run[4] ? " (uncommitted changes)" : "")),
      line(run[2]), line("run " + run[3]), line("median " + ms(p[1]) + " ms"),
      line(p[2] === null ? NO_SPREAD : "IQR " + ms(p[2]) + " \u2013 " + ms(p[3]) + " ms"));
    if (p[4]) {
      tooltip.appendChild(line("A/B: " + p[4] + (p[5] === null || p[5] === undefined ? "" : ", ratio " + p[5].toFixed(3)),
        "verdict-" + p[4]));
    }
    if (p[6] !== null && p[6] !== undefined) {
      tooltip.appendChild(line("memory census peak " + (p[6] / 1048576).toFixed(1) + " MiB"));
    }
    if (p[7]) tooltip.appendChild(line("numerics replay: " + p[7]));
    if (p[8]) tooltip.appendChild(line("numerics vs the run before: " + p[8]));
    var box = pt.getBoundingClientRect();
    tooltip.hidden = false;
    var left = box.right + 10;
    if (left + tooltip.offsetWidth > document.documentElement.clientWidth) left = box.left - 10 - tooltip.offsetWidth;
    tooltip.style.left = Math.max(0, left + window.scrollX) + "px";
    tooltip.style.top = Math.max(0, box.top + window.scrollY - tooltip.offsetHeight / 2) + "px";
  }

  document.addEventListener("mouseover", function (event) {
    var pt = event.target.closest ? event.target.closest(".pt") : null;
    if (pt) showTooltip(pt); else tooltip.hidden = true;
  });
  document.querySelectorAll("figure.chart").forEach(draw);
})();
