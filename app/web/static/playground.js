// Playground: predict and embed one input, show the similarities and the input in the latent scatter.
"use strict";

corel.pages.playground = async function () {
  const { api, el, num, lossLabel, flash } = corel;
  const TEXT_DATASETS = ["ag-news", "text"];
  const select = document.getElementById("experiment");
  const exps = (await api("/experiments?status=succeeded&limit=100")).items;
  const wanted = Number(corel.query().get("experiment_id") || 0);
  if (wanted && !exps.some((e) => e.id === wanted)) { try { exps.unshift(await api("/experiments/" + wanted)); } catch (e) { /* gone */ } }
  for (const e of exps) select.append(el("option", { value: e.id, selected: e.id === wanted },
    "#" + e.id + " " + lossLabel(e.spec) + ", " + e.spec.dataset + " (" + (e.spec.model || "ffnn") + ")"));
  if (!exps.length) { flash("No succeeded experiment yet: train one first."); return; }
  let current = null, scatter = null;

  async function choose() {
    current = exps.find((e) => e.id === Number(select.value));
    const text = TEXT_DATASETS.includes(current.spec.dataset);
    document.getElementById("text-input").hidden = !text;
    document.getElementById("image-input").hidden = text;
    document.getElementById("exp-note").textContent = "test accuracy " + corel.pct(current.test_accuracy) + "%";
    history.replaceState(null, "", "/ui/playground?experiment_id=" + current.id);
    document.getElementById("prediction").textContent = "–";
    Plotly.purge("similarities");
    scatter = await api("/experiments/" + current.id + "/latent/scatter?max_points=2000");
    document.getElementById("latent-note").textContent = "The test latent space (PCA), with the class vectors as stars.";
    await corel.latentChart("latent", scatter);
  }

  function project(h) {
    const t = scatter.transform;
    let v = h.slice();
    if (t.normalize) { const n = Math.hypot(...v) || 1; v = v.map((x) => x / n); }
    const c = v.map((x, i) => x - t.mean[i]);
    return t.components.map((row) => row.reduce((s, w, i) => s + w * c[i], 0));
  }

  async function run(input) {
    flash("");
    try {
      const body = Object.assign({ experiment_id: current.id }, input);
      const [pred, emb] = await Promise.all([api("/predict", { method: "POST", json: body }), api("/embed", { method: "POST", json: body })]);
      const p = pred.predictions[0];
      document.getElementById("prediction").textContent = p.class_name;
      document.getElementById("prediction").dataset.classIndex = p.class_index;
      const colours = pred.class_names.map((_, k) => (k === p.class_index ? "#3559e0" : "#b8c2d6"));
      Plotly.react("similarities", [{ type: "bar", x: pred.class_names, y: p.similarities, marker: { color: colours } }],
        { margin: { t: 10, r: 10, b: 80, l: 55 }, xaxis: { type: "category", tickangle: -30 },
          yaxis: { title: { text: "similarity (" + pred.similarity + ")" } } },
        { responsive: true, displaylogo: false });
      const xy = project(emb.embeddings[0]);
      await corel.latentChart("latent", scatter, [{ type: "scatter", mode: "markers+text", name: "your input", x: [xy[0]], y: [xy[1]],
        text: ["your input"], textposition: "bottom center",
        marker: { symbol: "x", size: 16, color: "#000", line: { width: 2 } }, hovertemplate: "your input: " + p.class_name + "<extra></extra>" }]);
      document.getElementById("latent-note").textContent = "Your input (✕) lands here; predicted " + p.class_name + ".";
      await neighbors(input);
    } catch (e) { flash(e.message); }
  }

  async function neighbors(input) {
    // The same input through /neighbors: its nearest training rows, and their classes' vote.
    const table = document.getElementById("neighbors");
    try {
      const nn = await api("/experiments/" + current.id + "/neighbors", { method: "POST", json: Object.assign({ k: 10 }, input) });
      const r = nn.results[0];
      table.querySelector("tbody").replaceChildren(...r.neighbors.map((n, i) => el("tr", { "data-row": n.row },
        el("td", { class: "num" }, i + 1), el("td", { class: "num" }, n.row), el("td", {}, n.class_name),
        el("td", { class: "num" }, num(n.distance, 4)))));
      table.hidden = false;
      const searched = nn.index_id === null ? "exact search over the training split" : "index " + nn.index_id;
      document.getElementById("neighbors-note").textContent = "The " + nn.k + " nearest of the " + nn.n_reference +
        " rows (" + nn.geometry + ", " + searched + "); their majority class: " + r.knn_prediction.class_name + ".";
    } catch (e) {
      table.hidden = true;
      document.getElementById("neighbors-note").textContent = e.message;
    }
  }

  function b64(dataUrl) { return dataUrl.slice(dataUrl.indexOf(",") + 1); }
  function readFile(file) {
    const reader = new FileReader();
    reader.onload = () => {
      const img = document.getElementById("preview");
      img.src = reader.result; img.hidden = false;
      run({ images: [b64(reader.result)] });
    };
    reader.readAsDataURL(file);
  }
  const drop = document.getElementById("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); if (e.dataTransfer.files[0]) readFile(e.dataTransfer.files[0]); });
  document.getElementById("file").addEventListener("change", (e) => { if (e.target.files[0]) readFile(e.target.files[0]); });

  const canvas = document.getElementById("canvas"), ctx = canvas.getContext("2d");
  function clear() { ctx.fillStyle = "#000"; ctx.fillRect(0, 0, canvas.width, canvas.height); }
  clear();
  let drawing = false;
  const at = (e) => { const r = canvas.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
  canvas.addEventListener("pointerdown", (e) => { drawing = true; ctx.beginPath(); ctx.moveTo(...at(e)); });
  canvas.addEventListener("pointermove", (e) => {
    if (!drawing) return;
    ctx.lineTo(...at(e)); ctx.strokeStyle = "#fff"; ctx.lineWidth = 22; ctx.lineCap = "round"; ctx.lineJoin = "round"; ctx.stroke();
  });
  window.addEventListener("pointerup", () => (drawing = false));
  document.getElementById("clear").onclick = clear;
  document.getElementById("predict-drawing").onclick = () => run({ images: [b64(canvas.toDataURL("image/png"))] });
  document.getElementById("predict-text").onclick = () => run({ texts: [document.getElementById("text").value] });
  select.addEventListener("change", () => choose().catch((e) => flash(e.message)));
  await choose();
};
