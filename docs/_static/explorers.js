/*
 * Three explorers that check themselves against tinyformer, in the pattern of
 * explorer.js (the W_Q/W_K explorer of the attention chapter):
 *
 *   .tf-decoding-explorer  (chapter "Decoding"): temperature, top-k, top-p and min-p on
 *       the trained language model's next-token distributions;
 *   .tf-attention-viewer   (chapter "Multi-head attention"): every head's weights
 *       for the token under the pointer or the keyboard focus, in the trained
 *       reversal model;
 *   .tf-position-explorer  (chapter "Positions"): sinusoidal and rotary encodings,
 *       and the dot products that depend only on the offset.
 *
 * An executed code cell of the page writes the inputs and tinyformer's results
 * into data-* attributes as JSON. On load each explorer recomputes those results
 * with its own copy of the formula and reports on the page whether they agree
 * (the .tf-status element, data-match="yes" or "no"). Plain DOM and SVG: no
 * libraries, no network; every control is a native input, a select or a button.
 */
(function () {
  "use strict";

  const SVG_NS = "http://www.w3.org/2000/svg";

  // ---- Small shared helpers ----

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    node.append(...children);
    return node;
  }

  function svg(tag, attrs = {}) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    return node;
  }

  function data(root, name) {
    return JSON.parse(root.dataset[name]);
  }

  function largestDifference(a, b) {
    if (Array.isArray(a)) {
      if (!Array.isArray(b) || a.length !== b.length) return Infinity;
      return a.reduce((worst, x, i) => Math.max(worst, largestDifference(x, b[i])), 0);
    }
    if (a === b) return 0; // also equal infinities
    return Math.abs(a - b);
  }

  // A slider with a label and a live value; `format` turns its value into text.
  function slider(name, label, min, max, step, format) {
    const input = el("input", { type: "range", min, max, step, "data-setting": name });
    input.setAttribute("aria-label", label);
    const output = el("output", { "data-setting": name });
    const update = () => (output.value = format(input.valueAsNumber));
    input.addEventListener("input", update);
    return { input, output, update, label: el("label", {}, el("span", {}, label), input, output) };
  }

  // Can `input` hold exactly `value` (in range and on its step grid)?
  function reachable(input, value) {
    const before = input.value;
    input.value = value;
    const ok = input.valueAsNumber === value;
    input.value = before;
    return ok;
  }

  function report(status, what, count, worst, tolerance, problems) {
    const ok = worst <= tolerance && !problems.length;
    status.dataset.match = ok ? "yes" : "no";
    status.dataset.largestDifference = String(worst);
    status.textContent =
      `Self-check at ${count} ${what}: matches tinyformer: ${ok ? "yes" : "no"}` +
      ` (largest difference ${worst.toExponential(1)}, tolerance ${tolerance.toExponential(0)}).`;
    if (!ok) console.error(`tf-explorer: ${problems.join("; ") || `difference ${worst}`}`);
  }

  function logSoftmax(z) {
    const finite = z.filter((x) => x !== -Infinity);
    const largest = Math.max(...finite);
    const total = z.reduce((sum, x) => sum + Math.exp(x - largest), 0);
    const lse = largest + Math.log(total);
    return z.map((x) => x - lse);
  }

  // ---- 1. Decoding: temperature, top-k, top-p, min-p (tinyformer.generation.log_probabilities) ----

  // Order of the tokens, most likely first; ties: smaller id first (a stable sort).
  function ranking(logP) {
    const order = logP.map((_, i) => i).sort((a, b) => logP[b] - logP[a] || a - b);
    const ranks = new Array(logP.length);
    order.forEach((token, rank) => (ranks[token] = rank));
    return { order, ranks };
  }

  function keepOnly(logP, keep) {
    return logSoftmax(logP.map((x, i) => (keep[i] ? x : -Infinity)));
  }

  // temperature > 0; topK null (or V) keeps all; topP null (or 1) keeps all;
  // minP null (or 0) keeps all.
  function decodingLogProbs(z, temperature, topK, topP, minP) {
    const largest = Math.max(...z);
    const shifted = z.map((x) => x - largest);
    let logP = logSoftmax(shifted.map((x) => (x === 0 ? x : x / temperature)));
    if (topK !== null && topK < z.length) {
      const { ranks } = ranking(logP);
      logP = keepOnly(logP, ranks.map((r) => r < topK));
    }
    if (topP !== null && topP < 1) {
      const { order, ranks } = ranking(logP);
      const keepSorted = [];
      let before = 0;
      for (const token of order) {
        keepSorted.push(before < topP);
        before += Math.exp(logP[token]);
      }
      logP = keepOnly(logP, ranks.map((r) => keepSorted[r]));
    }
    if (minP !== null && minP > 0) {
      // p >= minP * max p, in logs: the most likely token always passes.
      const cut = Math.max(...logP) + Math.log(minP);
      logP = keepOnly(logP, logP.map((x) => x >= cut));
    }
    return logP;
  }

  function decodingProbs(z, s) {
    const topK = s.top_k === null || s.top_k >= z.length ? null : s.top_k;
    const topP = s.top_p === null || s.top_p >= 1 ? null : s.top_p;
    const minP = s.min_p === null || s.min_p === undefined || s.min_p <= 0 ? null : s.min_p;
    return decodingLogProbs(z, s.temperature, topK, topP, minP).map(Math.exp);
  }

  function keptMass(pModel, processed) {
    return processed.reduce((sum, p, i) => sum + (p > 0 ? pModel[i] : 0), 0);
  }

  function buildDecoding(root) {
    const tokens = data(root, "tokens");
    const prompts = data(root, "prompts");
    const reference = data(root, "reference");
    const tolerance = Number(root.dataset.tolerance || 1e-9);
    const V = tokens.length;
    root.replaceChildren();

    const choose = el("select", { "data-setting": "prompt" });
    choose.setAttribute("aria-label", "prompt");
    prompts.forEach((p, i) => choose.append(el("option", { value: String(i) }, p.name)));
    const temperature = slider("temperature", "temperature τ", 0.1, 3, 0.05, (v) => v.toFixed(2));
    const topK = slider("top_k", "top-k", 1, V, 1, (v) => (v >= V ? `off (${V})` : String(v)));
    const topP = slider("top_p", "top-p", 0.05, 1, 0.05, (v) => (v >= 1 ? "off (1)" : v.toFixed(2)));
    const minP = slider("min_p", "min-p", 0, 1, 0.01, (v) => (v <= 0 ? "off (0)" : v.toFixed(2)));
    const controls = el(
      "div",
      { class: "tf-controls" },
      el("label", {}, el("span", {}, "prompt"), choose),
      temperature.label,
      topK.label,
      topP.label,
      minP.label,
    );
    const presets = el("div", { class: "tf-presets" }, el("span", {}, "Presets: "));
    reference.forEach((ref, i) => {
      if (!ref.preset) return;
      const button = el("button", { type: "button", "data-preset": String(i) }, ref.preset);
      button.addEventListener("click", () => show(ref));
      presets.append(button);
    });
    const kept = el("p", { class: "tf-kept", "aria-live": "polite" });
    const table = el("table", { class: "tf-bars" });
    const status = el("p", { class: "tf-status", role: "status" });
    root.append(controls, presets, kept, table, status);

    function settings() {
      return {
        prompt: Number(choose.value),
        temperature: temperature.input.valueAsNumber,
        top_k: topK.input.valueAsNumber >= V ? null : topK.input.valueAsNumber,
        top_p: topP.input.valueAsNumber >= 1 ? null : topP.input.valueAsNumber,
        min_p: minP.input.valueAsNumber <= 0 ? null : minP.input.valueAsNumber,
      };
    }

    function show(ref) {
      if (ref) {
        choose.value = String(ref.prompt);
        temperature.input.value = ref.settings.temperature;
        topK.input.value = ref.settings.top_k === null ? V : ref.settings.top_k;
        topP.input.value = ref.settings.top_p === null ? 1 : ref.settings.top_p;
        minP.input.value = ref.settings.min_p == null ? 0 : ref.settings.min_p;
      }
      [temperature, topK, topP, minP].forEach((s) => s.update());
      const s = settings();
      const z = prompts[s.prompt].logits;
      const pModel = decodingProbs(z, { temperature: 1, top_k: null, top_p: null, min_p: null });
      const processed = decodingProbs(z, s);
      const mass = keptMass(pModel, processed);
      const count = processed.filter((p) => p > 0).length;
      kept.dataset.value = String(mass);
      kept.textContent =
        `Kept probability mass: ${mass.toFixed(3)} of the model's distribution,` +
        ` in ${count} of ${V} tokens.`;
      drawBars(table, tokens, pModel, processed);
    }
    for (const node of [choose, temperature.input, topK.input, topP.input, minP.input]) {
      node.addEventListener("input", () => show());
    }

    // Self-check at every reference setting, each one reachable by the controls.
    let worst = 0;
    const problems = [];
    for (const ref of reference) {
      const z = prompts[ref.prompt].logits;
      const processed = decodingProbs(z, ref.settings);
      const pModel = decodingProbs(z, { temperature: 1, top_k: null, top_p: null, min_p: null });
      worst = Math.max(worst, largestDifference(processed, ref.probs));
      worst = Math.max(worst, Math.abs(keptMass(pModel, processed) - ref.kept));
      const s = ref.settings;
      if (
        !reachable(temperature.input, s.temperature) ||
        !reachable(topK.input, s.top_k === null ? V : s.top_k) ||
        !reachable(topP.input, s.top_p === null ? 1 : s.top_p) ||
        !reachable(minP.input, s.min_p == null ? 0 : s.min_p)
      ) {
        problems.push(`the controls cannot reach setting ${JSON.stringify(s)}`);
      }
    }
    report(status, "settings", reference.length, worst, tolerance, problems);
    show(reference[0]);
  }

  // One row per token, most likely first under the model; the bar is the
  // probability the sampler draws from, the outline the model's.
  function drawBars(table, tokens, pModel, processed) {
    const order = ranking(pModel.map(Math.log)).order;
    const head = el(
      "tr",
      {},
      el("th", { scope: "col" }, "token"),
      el("th", { scope: "col" }, "model p"),
      el("th", { scope: "col" }, "sampler draws with p"),
    );
    const rows = order.map((token) => {
      const p = processed[token];
      const bar = el("span", { class: "tf-bar" });
      bar.style.setProperty("--tf-p", p.toFixed(4));
      const outline = el("span", { class: "tf-outline" });
      outline.style.setProperty("--tf-p", pModel[token].toFixed(4));
      const cell = el("td", { class: "tf-draw", "data-value": String(p) });
      cell.append(el("span", { class: "tf-track" }, bar, outline), el("span", {}, p.toFixed(3)));
      if (p === 0) cell.classList.add("tf-removed");
      return el(
        "tr",
        { "data-token": String(token) },
        el("th", { scope: "row" }, tokens[token]),
        el("td", { "data-value": String(pModel[token]) }, pModel[token].toFixed(3)),
        cell,
      );
    });
    const caption = el(
      "caption",
      {},
      "Tokens sorted by the model's probability. Filled bar: the distribution the sampler",
      " draws from; outline: the model's. A removed token has probability 0.",
    );
    table.replaceChildren(caption, el("thead", {}, head), el("tbody", {}, ...rows));
  }

  // ---- 2. The heads of the trained reversal model ----

  // softmax(q k^T) per head, q already scaled; mask[i][j] false: weight 0.
  function headWeights(q, k, mask) {
    return q.map((qh, h) =>
      qh.map((qi, i) => {
        const scores = k[h].map((kj, j) =>
          mask && !mask[i][j] ? -Infinity : qi.reduce((sum, x, d) => sum + x * kj[d], 0),
        );
        if (scores.every((x) => x === -Infinity)) return scores.map(() => 0);
        return logSoftmax(scores).map(Math.exp);
      }),
    );
  }

  function buildAttentionViewer(root) {
    const layers = data(root, "layers");
    const tolerance = Number(root.dataset.tolerance || 1e-9);
    root.replaceChildren();

    const choose = el("select", { "data-setting": "layer" });
    choose.setAttribute("aria-label", "attention layer");
    layers.forEach((l, i) => choose.append(el("option", { value: String(i) }, l.name)));
    const controls = el(
      "div",
      { class: "tf-controls" },
      el("label", {}, el("span", {}, "attention layer"), choose),
    );
    const hint = el(
      "p",
      { class: "tf-hint" },
      "Point at a query token, or focus one with Tab and move with the arrow keys:",
    );
    const queries = el("div", { class: "tf-tokens", role: "toolbar" });
    queries.setAttribute("aria-label", "query tokens");
    const table = el("table", { class: "tf-weights tf-heads" });
    const status = el("p", { class: "tf-status", role: "status" });
    root.append(controls, hint, queries, table, status);

    let current = 0;
    function layer() {
      return layers[Number(choose.value)];
    }

    function showQuery(i) {
      const l = layer();
      current = Math.max(0, Math.min(i, l.queries.length - 1));
      queries.querySelectorAll("button").forEach((b, j) => {
        b.setAttribute("aria-pressed", j === current ? "true" : "false");
        b.tabIndex = j === current ? 0 : -1;
      });
      drawHeads(table, l, l.computed, current);
    }

    function showLayer() {
      const l = layer();
      queries.replaceChildren(
        ...l.queries.map((token, i) => {
          const b = el("button", { type: "button", "data-query": String(i) }, token);
          b.addEventListener("mouseenter", () => showQuery(i));
          b.addEventListener("focus", () => showQuery(i));
          b.addEventListener("click", () => showQuery(i));
          b.addEventListener("keydown", (event) => {
            const step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 }[event.key];
            const jump = { Home: 0, End: l.queries.length - 1 }[event.key];
            if (step === undefined && jump === undefined) return;
            event.preventDefault();
            const next = jump !== undefined ? jump : Math.max(0, Math.min(i + step, l.queries.length - 1));
            queries.querySelectorAll("button")[next].focus();
          });
          return b;
        }),
      );
      showQuery(Math.min(current, l.queries.length - 1));
    }
    choose.addEventListener("input", showLayer);

    let worst = 0;
    for (const l of layers) {
      l.computed = headWeights(l.q, l.k, l.mask);
      worst = Math.max(worst, largestDifference(l.computed, l.weights));
    }
    const count = layers.reduce((n, l) => n + l.q.length, 0);
    report(status, "heads", count, worst, tolerance, []);
    showLayer();
  }

  // Rows are heads, columns keys: the weights of query `i` in every head.
  function drawHeads(table, l, weights, i) {
    const head = el("tr", {}, el("th", { scope: "col" }, "head ↓ key →"));
    for (const key of l.keys) head.append(el("th", { scope: "col" }, key));
    const rows = weights.map((wh, h) => {
      const tr = el("tr", {}, el("th", { scope: "row" }, `head ${h + 1}`));
      wh[i].forEach((w, j) => {
        const masked = l.mask && !l.mask[i][j];
        const cell = el("td", { "data-value": String(w) }, masked ? "·" : w.toFixed(2));
        cell.style.setProperty("--tf-weight", w.toFixed(4));
        if (w > 0.5) cell.classList.add("tf-strong");
        tr.append(cell);
      });
      return tr;
    });
    const caption = el("caption", {}, `Weights of the query “${l.queries[i]}” (position ${i})`);
    caption.append(" in every head: each row sums to 1; · marks a masked key.");
    table.dataset.query = String(i);
    table.replaceChildren(caption, el("thead", {}, head), el("tbody", {}, ...rows));
  }

  // ---- 3. Sinusoidal and rotary positions: dot products depend only on the offset ----

  function frequencies(d, base) {
    return Array.from({ length: d / 2 }, (_, i) => base ** (-(2 * i) / d));
  }

  function sinusoidalTable(n, d, base) {
    const w = frequencies(d, base);
    return Array.from({ length: n }, (_, p) => w.flatMap((wi) => [Math.sin(p * wi), Math.cos(p * wi)]));
  }

  // RoPE, adjacent pairs: rotate (x[2i], x[2i+1]) by the angle p * w_i.
  function rotate(x, p, base) {
    const w = frequencies(x.length, base);
    const out = new Array(x.length);
    w.forEach((wi, i) => {
      const c = Math.cos(p * wi);
      const s = Math.sin(p * wi);
      const a = x[2 * i];
      const b = x[2 * i + 1];
      out[2 * i] = a * c - b * s;
      out[2 * i + 1] = a * s + b * c;
    });
    return out;
  }

  function dot(a, b) {
    return a.reduce((sum, x, i) => sum + x * b[i], 0);
  }

  function gram(rowsA, rowsB) {
    return rowsA.map((a) => rowsB.map((b) => dot(a, b)));
  }

  function buildPositions(root) {
    const s = data(root, "settings");
    const q = data(root, "q");
    const k = data(root, "k");
    const ref = data(root, "reference");
    const tolerance = Number(root.dataset.tolerance || 1e-9);
    const n = s.n_positions;
    root.replaceChildren();

    // Recompute everything tinyformer computed, then check.
    const table = sinusoidalTable(n, s.d_model, s.base);
    const positions = Array.from({ length: n }, (_, p) => p);
    const rotatedQ = positions.map((p) => rotate(q, p, s.base));
    const rotatedK = positions.map((p) => rotate(k, p, s.base));
    const computed = { table, gram: gram(table, table), rotary_scores: gram(rotatedQ, rotatedK) };
    const worst = Math.max(
      largestDifference(computed.table, ref.table),
      largestDifference(computed.gram, ref.gram),
      largestDifference(computed.rotary_scores, ref.rotary_scores),
    );

    const maxOffset = s.max_offset;
    const offset = slider("offset", "offset k", 0, maxOffset, 1, String);
    const position = slider("position", "position p", 0, n - 1 - maxOffset, 1, String);
    const controls = el("div", { class: "tf-controls" }, offset.label, position.label);
    const sinChart = svg("svg");
    const ropeChart = svg("svg");
    const readout = el("dl", { class: "tf-readout" });
    const status = el("p", { class: "tf-status", role: "status" });
    const charts = el(
      "div",
      { class: "tf-charts" },
      el("figure", {}, sinChart, el("figcaption", {}, "sinusoidal: PE(p) · PE(p + k), for every p")),
      el("figure", {}, ropeChart, el("figcaption", {}, "rotary: score of q at p and k at p + k")),
    );
    root.append(controls, charts, readout, status);

    function item(name, label, value, digits) {
      const dd = el("dd", { "data-value": String(value), "data-name": name }, value.toFixed(digits));
      return [el("dt", {}, label), dd];
    }

    function show() {
      offset.update();
      position.update();
      const kk = offset.input.valueAsNumber;
      const p = position.input.valueAsNumber;
      const starts = positions.slice(0, n - kk);
      const sin = starts.map((a) => computed.gram[a][a + kk]);
      const rope = starts.map((a) => computed.rotary_scores[a][a + kk]);
      const spread = (v) => Math.max(...v) - Math.min(...v);
      drawDots(sinChart, sin, p, s.d_model / 2, "sinusoidal");
      drawDots(ropeChart, rope, p, s.score_bound, "rotary");
      readout.replaceChildren(
        ...item("sinusoidal", `PE(${p}) · PE(${p + kk})`, sin[p], 6),
        ...item("sinusoidal_spread", `spread over all p at k = ${kk}`, spread(sin), 17),
        ...item("rotary", `q at ${p} · k at ${p + kk} (rotary)`, rope[p], 6),
        ...item("rotary_spread", `spread over all p at k = ${kk}`, spread(rope), 17),
      );
      readout.querySelectorAll('[data-name$="spread"]').forEach((dd) => {
        dd.textContent = Number(dd.dataset.value).toExponential(1);
      });
    }
    offset.input.addEventListener("input", show);
    position.input.addEventListener("input", show);
    offset.input.value = s.start_offset;
    position.input.value = 0;
    report(status, "positions", n, worst, tolerance, []);
    show();
  }

  // One marker per starting position p; the current p is drawn larger.
  function drawDots(chart, values, current, bound, kind) {
    const width = 320;
    const height = 120;
    const pad = 8;
    chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
    chart.setAttribute("role", "img");
    chart.setAttribute("aria-label", `${kind} dot products for every starting position`);
    const x = (p) => pad + ((width - 2 * pad) * p) / Math.max(values.length - 1, 1);
    const y = (v) => height / 2 - ((height / 2 - pad) * v) / bound;
    chart.replaceChildren(
      svg("line", { x1: 0, y1: height / 2, x2: width, y2: height / 2, class: "tf-axis" }),
      ...values.map((v, p) =>
        svg(kind === "rotary" ? "rect" : "circle", {
          class: `tf-dot tf-${kind}${p === current ? " tf-current" : ""}`,
          ...(kind === "rotary"
            ? { x: x(p) - 2.5, y: y(v) - 2.5, width: 5, height: 5 }
            : { cx: x(p), cy: y(v), r: p === current ? 4.5 : 2.5 }),
        }),
      ),
    );
  }

  function start() {
    document.querySelectorAll(".tf-decoding-explorer").forEach(buildDecoding);
    document.querySelectorAll(".tf-attention-viewer").forEach(buildAttentionViewer);
    document.querySelectorAll(".tf-position-explorer").forEach(buildPositions);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
