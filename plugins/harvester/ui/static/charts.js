/* Harvester: small SVG charts (bars, stacked bars, lines) with axes, legend and tooltips.
   No dependencies, no markup strings: every node is built with createElement(NS) and text is set
   with textContent. Exposes window.HarvesterCharts.combo(spec). */
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(key, String(value));
    }
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function div(cls, text) {
    const node = document.createElement("div");
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function niceStep(raw) {
    const exp = Math.floor(Math.log10(raw));
    const f = raw / Math.pow(10, exp);
    const nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10;
    return nice * Math.pow(10, exp);
  }

  /* A "nice" axis for values 0..max: {max, step}, about `ticks` ticks; integer steps if asked. */
  function niceAxis(max, ticks, integer) {
    if (!(max > 0)) return { max: integer ? 4 : 1, step: integer ? 1 : 0.25 };
    let step = niceStep(max / ticks);
    if (integer) step = Math.max(1, Math.ceil(step));
    return { max: Math.ceil(max / step) * step, step };
  }

  const num = (v) => typeof v === "number" && Number.isFinite(v);
  const fmtDefault = (v) => (num(v) ? v.toLocaleString() : "—");

  function legend(items) {
    const box = div("hc-legend");
    for (const item of items) {
      const key = div("hc-key");
      const swatch = div(item.kind === "line" ? "hc-swatch hc-swatch-line" : "hc-swatch");
      swatch.style.background = item.color;
      key.append(swatch, document.createTextNode(item.name));
      box.append(key);
    }
    return box;
  }

  /* Returns a <div class="hc-chart"> holding the legend, the <svg class="hc-svg"> and the tooltip.
     spec: {
       labels: [x labels], titles: [tooltip headings] (optional),
       bars: [{name, color, values}], stacked: bool, barAxis: {label, integer, format, tick},
       lines: [{name, color, values, dash (an SVG stroke-dasharray)}], lineAxis: {label, integer, format, tick, divisor},
       width, height, empty: "text when there is no data", ariaLabel }
     Bars use the left axis; lines the right axis when there are bars, else the left one. */
  function combo(spec) {
    const labels = spec.labels || [];
    const titles = spec.titles || labels;
    const bars = spec.bars || [];
    const lines = spec.lines || [];
    const wrap = div("hc-chart");
    const all = bars.concat(lines);
    wrap.append(legend(bars.map((s) => ({ ...s, kind: "bar" })).concat(lines.map((s) => ({ ...s, kind: "line" })))));
    const W = spec.width || 960;
    const H = spec.height || 280;
    if (!labels.length) {
      const empty = svg("svg", { viewBox: `0 0 ${W} 80`, class: "hc-svg hc-empty", role: "img", "aria-label": spec.empty || "No data yet" });
      empty.append(svg("text", { x: W / 2, y: 44, "text-anchor": "middle" }, spec.empty || "No data yet"));
      wrap.append(empty);
      return wrap;
    }

    const dual = bars.length > 0 && lines.length > 0;
    const m = { left: 64, right: dual ? 64 : 40, top: 14, bottom: 48 };
    const pw = W - m.left - m.right;
    const ph = H - m.top - m.bottom;
    const n = labels.length;
    const band = pw / n;

    const barMax = Math.max(0, ...labels.map((_, i) => {
      const vals = bars.map((s) => (num(s.values[i]) ? s.values[i] : 0));
      return spec.stacked ? vals.reduce((a, b) => a + b, 0) : Math.max(0, ...vals);
    }));
    const lineAxisSpec = lines.length ? (spec.lineAxis || {}) : {};
    const divisor = lineAxisSpec.divisor || 1;
    const lineMax = Math.max(0, ...lines.flatMap((s) => s.values.filter(num).map((v) => v / divisor)));
    const barAxis = bars.length ? niceAxis(barMax, 5, (spec.barAxis || {}).integer !== false) : null;
    const lineAxis = lines.length ? niceAxis(lineMax, 5, !!lineAxisSpec.integer) : null;
    const yOf = (axis) => (v) => m.top + ph - (Math.min(v, axis.max) / axis.max) * ph;

    const root = svg("svg", {
      viewBox: `0 0 ${W} ${H}`, class: "hc-svg", role: "img",
      "aria-label": spec.ariaLabel || all.map((s) => s.name).join(", "),
      preserveAspectRatio: "xMidYMid meet",
    });
    const hover = svg("rect", { class: "hc-hover", x: 0, y: m.top, width: band, height: ph, visibility: "hidden" });
    root.append(hover);

    function axisTicks(axis, side, opts) {
      const y = yOf(axis);
      const g = svg("g", { class: "hc-axis hc-axis-" + side });
      const tick = opts.tick || fmtDefault;
      for (let v = 0; v <= axis.max + axis.step / 2; v += axis.step) {
        const yy = y(v);
        if (side === "left") g.append(svg("line", { class: "hc-grid", x1: m.left, x2: W - m.right, y1: yy, y2: yy }));
        const x = side === "left" ? m.left - 8 : W - m.right + 8;
        g.append(svg("text", { x, y: yy + 4, "text-anchor": side === "left" ? "end" : "start" }, tick(Number(v.toFixed(6)))));
      }
      const xLine = side === "left" ? m.left : W - m.right;
      g.append(svg("line", { class: "hc-axis-line", x1: xLine, x2: xLine, y1: m.top, y2: m.top + ph }));
      if (opts.label) {
        const cx = side === "left" ? 14 : W - 12;
        const cy = m.top + ph / 2;
        g.append(svg("text", { class: "hc-axis-title", x: cx, y: cy, "text-anchor": "middle",
          transform: `rotate(-90 ${cx} ${cy})` }, opts.label));
      }
      root.append(g);
    }

    const leftOpts = bars.length ? (spec.barAxis || {}) : lineAxisSpec;
    axisTicks(barAxis || lineAxis, "left", leftOpts);
    if (dual) axisTicks(lineAxis, "right", lineAxisSpec);

    // x axis: baseline and thinned labels
    const xg = svg("g", { class: "hc-axis hc-axis-x" });
    xg.append(svg("line", { class: "hc-axis-line", x1: m.left, x2: W - m.right, y1: m.top + ph, y2: m.top + ph }));
    const every = Math.max(1, Math.ceil(90 / band));
    labels.forEach((label, i) => {
      if ((n - 1 - i) % every !== 0) return; // always label the newest (right-most) one
      const cx = m.left + band * (i + 0.5);
      xg.append(svg("line", { class: "hc-tick", x1: cx, x2: cx, y1: m.top + ph, y2: m.top + ph + 4 }));
      const edge = cx + 40 > W ? "end" : cx - 40 < 0 ? "start" : "middle";
      const tx = edge === "end" ? Math.min(cx + band / 2, W - 2) : cx;
      xg.append(svg("text", { x: tx, y: m.top + ph + 18, "text-anchor": edge }, label));
    });
    if (spec.xLabel) {
      xg.append(svg("text", { class: "hc-axis-title", x: m.left + pw / 2, y: H - 6, "text-anchor": "middle" }, spec.xLabel));
    }
    root.append(xg);

    const fmtBar = (spec.barAxis || {}).format || fmtDefault;
    const fmtLine = lineAxisSpec.format || fmtDefault;

    // bars
    if (bars.length) {
      const y = yOf(barAxis);
      const g = svg("g", { class: "hc-bars" });
      labels.forEach((_, i) => {
        const x0 = m.left + band * i;
        let acc = 0;
        bars.forEach((s, k) => {
          const v = s.values[i];
          if (!num(v) || v <= 0) return;
          let x, w, top, bottom;
          if (spec.stacked) {
            w = Math.max(1, band * 0.7);
            x = x0 + (band - w) / 2;
            bottom = y(acc);
            acc += v;
            top = y(acc);
          } else {
            const groupW = band * 0.8;
            w = Math.max(1, groupW / bars.length);
            x = x0 + (band - groupW) / 2 + w * k;
            bottom = y(0);
            top = y(v);
          }
          const rect = svg("rect", { x, y: top, width: w, height: Math.max(0.5, bottom - top), fill: s.color, class: "hc-bar" });
          rect.append(svg("title", {}, `${titles[i]}\n${s.name}: ${fmtBar(v)}`));
          g.append(rect);
        });
      });
      root.append(g);
    }

    // lines
    if (lines.length) {
      const y = yOf(lineAxis);
      const g = svg("g", { class: "hc-lines" });
      for (const s of lines) {
        let d = "";
        let pen = false;
        s.values.forEach((v, i) => {
          if (!num(v)) { pen = false; return; }
          const x = m.left + band * (i + 0.5);
          d += `${pen ? "L" : "M"}${x.toFixed(1)} ${y(v / divisor).toFixed(1)} `;
          pen = true;
        });
        if (d) g.append(svg("path", { d: d.trim(), fill: "none", stroke: s.color, "stroke-width": 2, class: "hc-line",
          "stroke-dasharray": s.dash || null, "data-series": s.name }));
        s.values.forEach((v, i) => {
          if (!num(v)) return;
          const dot = svg("circle", { cx: m.left + band * (i + 0.5), cy: y(v / divisor), r: n > 60 ? 2 : 3.5, fill: s.color, class: "hc-dot",
            "data-series": s.name, "data-value": v });
          dot.append(svg("title", {}, `${titles[i]}\n${s.name}: ${fmtLine(v)}`));
          g.append(dot);
        });
      }
      root.append(g);
    }

    // tooltip: one per category, follows the pointer
    const tip = div("hc-tooltip");
    tip.hidden = true;
    tip.setAttribute("role", "tooltip");
    function showTip(event) {
      const ctm = root.getScreenCTM();
      if (!ctm) return;
      const pt = new DOMPoint(event.clientX, event.clientY).matrixTransform(ctm.inverse());
      const i = Math.floor((pt.x - m.left) / band);
      if (i < 0 || i >= n || pt.y < m.top || pt.y > m.top + ph) { hideTip(); return; }
      hover.setAttribute("x", m.left + band * i);
      hover.setAttribute("visibility", "visible");
      tip.replaceChildren(div("hc-tip-title", titles[i]));
      for (const s of bars.concat(lines)) {
        const row = div("hc-tip-row");
        const sw = div(lines.includes(s) ? "hc-swatch hc-swatch-line" : "hc-swatch");
        sw.style.background = s.color;
        const fmt = lines.includes(s) ? fmtLine : fmtBar;
        row.append(sw, div("hc-tip-name", s.name), div("hc-tip-value", fmt(s.values[i])));
        tip.append(row);
      }
      tip.hidden = false;
      const box = wrap.getBoundingClientRect();
      let left = event.clientX - box.left + 14;
      if (left + tip.offsetWidth > box.width) left = event.clientX - box.left - tip.offsetWidth - 14;
      tip.style.left = `${Math.max(0, left)}px`;
      tip.style.top = `${Math.max(0, event.clientY - box.top - tip.offsetHeight / 2)}px`;
    }
    function hideTip() {
      tip.hidden = true;
      hover.setAttribute("visibility", "hidden");
    }
    root.addEventListener("mousemove", showTip);
    root.addEventListener("mouseleave", hideTip);

    wrap.append(root, tip);
    return wrap;
  }

  window.HarvesterCharts = { combo, niceAxis };
})();
