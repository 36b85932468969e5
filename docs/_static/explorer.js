/*
 * The attention explorer of the chapter "Scaled dot-product attention".
 *
 * A page asks for an explorer with an element written by one of its executed
 * code cells:
 *
 *   <div class="tf-explorer" data-words='["the", ...]' data-vectors='[[x, y], ...]'
 *        data-reference='[{"name": "...", "settings": {...}, "weights": [[...]]}, ...]'>
 *
 * The weights in data-reference were computed by tinyformer's
 * scaled_dot_product_attention. This script builds sliders for W_Q and W_K (a
 * rotation angle and two axis scales each), draws the queries and keys, and
 * shows the attention weights as a shaded table. On load it recomputes every
 * reference setting and reports whether it agrees with tinyformer, so that
 * this copy of the formula cannot drift from the tested library unnoticed.
 * Plain DOM and SVG: no libraries, no network.
 */
(function () {
  "use strict";

  const TOLERANCE = 1e-9; // largest difference from tinyformer's weights we accept
  const MATRICES = ["q", "k"]; // W_Q and W_K
  // One slider per entry: [setting suffix, label, min, max, step].
  const SLIDERS = [
    ["angle", "rotation θ", -180, 180, 1],
    ["sx", "scale along x", 0, 2.5, 0.1],
    ["sy", "scale along y", 0, 2.5, 0.1],
  ];
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PLANE_PX = 220; // width and height of each drawing of the plane, in SVG units
  const PLANE_RANGE = 2.8; // the drawing shows [-2.8, 2.8] on both axes

  // ---- The math: the chapter's plane_attention, written out for 2-D vectors ----
  // (The order of some roundings differs from NumPy's, hence a tolerance, not equality.)

  // The row vector x times W = diag(sx, sy) R(θ)^T: stretch the axes, then rotate by θ.
  function project(x, angleDegrees, sx, sy) {
    const t = (angleDegrees * Math.PI) / 180;
    const a = sx * x[0];
    const b = sy * x[1];
    return [Math.cos(t) * a - Math.sin(t) * b, Math.sin(t) * a + Math.cos(t) * b];
  }

  function queriesAndKeys(vectors, s) {
    return {
      q: vectors.map((x) => project(x, s.q_angle, s.q_sx, s.q_sy)),
      k: vectors.map((x) => project(x, s.k_angle, s.k_sx, s.k_sy)),
    };
  }

  // softmax(Q K^T / sqrt(d_k)) row by row, with d_k = 2. Each row's largest score is
  // subtracted before exponentiating, so no exponential overflows. (tinyformer's softmax
  // shifts only the rows whose largest score is outside a safe range; the weights agree.)
  function attentionWeights(vectors, s) {
    const { q, k } = queriesAndKeys(vectors, s);
    const scale = 1 / Math.sqrt(2);
    return q.map((qi) => {
      const scores = k.map((kj) => (qi[0] * kj[0] + qi[1] * kj[1]) * scale);
      const largest = Math.max(...scores);
      const e = scores.map((z) => Math.exp(z - largest));
      const total = e.reduce((sum, z) => sum + z, 0);
      return e.map((z) => z / total);
    });
  }

  function largestDifference(a, b) {
    let worst = 0;
    a.forEach((row, i) => row.forEach((x, j) => (worst = Math.max(worst, Math.abs(x - b[i][j])))));
    return worst;
  }

  // ---- Small DOM helpers ----

  function formatSetting(name, value) {
    return name.endsWith("angle") ? `${value}°` : value.toFixed(1);
  }

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

  // ---- The explorer ----

  function buildExplorer(root) {
    const words = JSON.parse(root.dataset.words);
    const vectors = JSON.parse(root.dataset.vectors);
    const reference = JSON.parse(root.dataset.reference);
    root.replaceChildren(); // drop the no-JavaScript fallback text

    // Sliders: one fieldset per matrix, each slider with a label and a live value.
    const inputs = {};
    const outputs = {};
    const controls = el("div", { class: "tf-controls" });
    for (const m of MATRICES) {
      const legend = el("legend", {}, "W", el("sub", {}, m.toUpperCase()));
      legend.append(m === "q" ? " (queries)" : " (keys)");
      const box = el("fieldset", {}, legend);
      for (const [suffix, label, min, max, step] of SLIDERS) {
        const name = `${m}_${suffix}`;
        inputs[name] = el("input", { type: "range", min, max, step, "data-setting": name });
        inputs[name].setAttribute("aria-label", `${m === "q" ? "W_Q" : "W_K"} ${label}`);
        outputs[name] = el("output", { "data-setting": name });
        box.append(el("label", {}, el("span", {}, label), inputs[name], outputs[name]));
      }
      controls.append(box);
    }

    // One button per reference setting, to jump to it.
    const presets = el("div", { class: "tf-presets" }, el("span", {}, "Presets: "));
    reference.forEach((ref, i) => {
      const button = el("button", { type: "button", "data-preset": String(i) }, ref.name);
      button.addEventListener("click", () => show(ref.settings));
      presets.append(button);
    });

    // Two drawings of the plane (queries, keys) and the table of weights.
    const planes = { q: svg("svg"), k: svg("svg") };
    const figures = el("div", { class: "tf-planes" });
    for (const m of MATRICES) {
      planes[m].setAttribute("viewBox", `0 0 ${PLANE_PX} ${PLANE_PX}`);
      planes[m].setAttribute("role", "img");
      const name = m === "q" ? "queries" : "keys";
      planes[m].setAttribute("aria-label", `${name} ${m} = x W_${m.toUpperCase()}`);
      const caption = el("figcaption", {}, `${name} ${m} = x W`, el("sub", {}, m.toUpperCase()));
      figures.append(el("figure", { class: "tf-plane" }, planes[m], caption));
    }
    const table = el("table", { class: "tf-weights" });
    const status = el("p", { class: "tf-status", role: "status" });
    root.append(controls, presets, figures, table, status);

    function currentSettings() {
      const s = {};
      for (const name of Object.keys(inputs)) s[name] = inputs[name].valueAsNumber;
      return s;
    }

    // Move the sliders to `settings` (if given) and redraw everything.
    function show(settings) {
      if (settings) for (const name of Object.keys(inputs)) inputs[name].value = settings[name];
      const s = currentSettings();
      for (const name of Object.keys(inputs)) outputs[name].value = formatSetting(name, s[name]);
      drawPlanes(planes, words, queriesAndKeys(vectors, s));
      drawTable(table, words, attentionWeights(vectors, s));
    }
    for (const input of Object.values(inputs)) input.addEventListener("input", () => show());

    // Self-check against tinyformer at every reference setting; each setting
    // must also be one the sliders can reach (on their grid, within range).
    const worst = Math.max(
      ...reference.map((ref) => largestDifference(attentionWeights(vectors, ref.settings), ref.weights)),
    );
    const unreachable = reference.filter((ref) =>
      Object.keys(inputs).some((name) => {
        inputs[name].value = ref.settings[name];
        return inputs[name].valueAsNumber !== ref.settings[name];
      }),
    );
    if (unreachable.length) console.error(`tf-explorer: sliders cannot reach ${unreachable[0].name}`);
    const ok = worst <= TOLERANCE && !unreachable.length;
    status.dataset.match = ok ? "yes" : "no";
    status.textContent =
      `Self-check at the ${reference.length} presets: matches tinyformer: ${ok ? "yes" : "no"}` +
      ` (largest difference ${worst.toExponential(1)}).`;
    if (!ok) console.error(`tf-explorer: weights differ from tinyformer's by ${worst}`);

    show(reference[0].settings);
  }

  // Arrows from the origin to each word's query (or key), with the word just
  // beyond its tip, on the far side from the origin.
  function drawPlanes(planes, words, vectorsOf) {
    const half = PLANE_PX / 2;
    const px = (value) => half + (value / PLANE_RANGE) * half;
    for (const m of MATRICES) {
      const plane = planes[m];
      plane.replaceChildren(
        svg("line", { x1: 0, y1: half, x2: PLANE_PX, y2: half, class: "tf-axis" }),
        svg("line", { x1: half, y1: 0, x2: half, y2: PLANE_PX, class: "tf-axis" }),
      );
      vectorsOf[m].forEach(([x, y], i) => {
        const tipX = px(x);
        const tipY = px(-y); // SVG's y axis points down
        plane.append(
          svg("line", { x1: half, y1: half, x2: tipX, y2: tipY, class: `tf-arrow tf-${m}` }),
          svg("circle", { cx: tipX, cy: tipY, r: 2.5, class: `tf-tip tf-${m}` }),
        );
        const length = Math.hypot(x, y) || 1;
        const label = svg("text", {
          x: tipX + (8 * x) / length,
          y: tipY - (8 * y) / length + 3,
          "text-anchor": x < 0 ? "end" : "start",
          class: "tf-word",
        });
        label.textContent = words[i];
        plane.append(label);
      });
    }
  }

  // Rows are queries, columns keys; each cell is shaded by its weight and keeps
  // the full-precision value in data-value.
  function drawTable(table, words, weights) {
    const head = el("tr", {}, el("th", { scope: "col" }, "query ↓ key →"));
    for (const w of words) head.append(el("th", { scope: "col" }, w));
    const rows = weights.map((row, i) => {
      const tr = el("tr", {}, el("th", { scope: "row" }, words[i]));
      for (const w of row) {
        const cell = el("td", { "data-value": String(w) }, w.toFixed(2));
        cell.style.setProperty("--tf-weight", w.toFixed(4));
        if (w > 0.5) cell.classList.add("tf-strong");
        tr.append(cell);
      }
      return tr;
    });
    const caption = el("caption", {}, "Attention weights softmax(Q K", el("sup", {}, "T"));
    caption.append(" / √2): rows are queries, columns keys; each row sums to 1.");
    table.replaceChildren(caption, el("thead", {}, head), el("tbody", {}, ...rows));
  }

  function start() {
    document.querySelectorAll(".tf-explorer").forEach(buildExplorer);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
