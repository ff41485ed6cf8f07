// Playground: predict and embed one input, show the similarities and the input in the latent scatter.
"use strict";

corel.pages.playground = async function () {
  const { api, el, num, lossLabel, flash } = corel;
  const TEXT_DATASETS = ["ag-news", "text"];
  const TABLE_DATASETS = ["npz"];  // uploaded feature tables (.npz, CSV or Parquet of numbers)
  const select = document.getElementById("experiment");
  // Every run that serves: succeeded, and cancelled or pruned ones with a best checkpoint
  // (marked as such: they stopped early).
  const lists = await Promise.all(["succeeded", "cancelled", "pruned"].map((s) =>
    api("/experiments?status=" + s + "&limit=100")));
  const exps = lists.flatMap((l) => l.items).filter(serves).sort((a, b) => b.id - a.id);
  const wanted = Number(corel.query().get("experiment_id") || 0);
  if (wanted && !exps.some((e) => e.id === wanted)) { try { exps.unshift(await api("/experiments/" + wanted)); } catch (e) { /* gone */ } }
  for (const e of exps) select.append(el("option", { value: e.id, selected: e.id === wanted },
    "#" + e.id + " " + lossLabel(e.spec) + ", " + e.spec.dataset + " (" + corel.modelLabel(e.spec) + ")" + stopped(e)));
  if (!exps.length) { flash("No experiment serves yet: train one first (a succeeded run, or one cancelled or pruned after an epoch)."); return; }
  let current = null, scatter = null;

  function serves(e) { return e.status === "succeeded" || ((e.status === "cancelled" || e.status === "pruned") && e.best_epoch >= 1); }
  function stopped(e) {
    if (e.status === "cancelled") return ", cancelled: best epoch " + e.best_epoch;
    if (e.status === "pruned") return ", pruned" + (e.pruned ? " at epoch " + e.pruned.rung : "") + ": best epoch " + e.best_epoch;
    return "";
  }

  async function choose() {
    current = exps.find((e) => e.id === Number(select.value));
    const dataset = current.spec.dataset;
    const kind = TEXT_DATASETS.includes(dataset) ? "text" : TABLE_DATASETS.includes(dataset) ? "rows" : "image";
    document.getElementById("text-input").hidden = kind !== "text";
    document.getElementById("image-input").hidden = kind !== "image";
    document.getElementById("rows-input").hidden = kind !== "rows";
    document.getElementById("warning").hidden = true;
    document.getElementById("row-predictions").hidden = true;
    if (kind === "rows") await prepareRows();
    document.getElementById("exp-note").textContent = "test accuracy " + corel.pct(current.test_accuracy) + "%" +
      (current.status === "succeeded" ? "" : " (" + current.status + " early: its best checkpoint so far serves)");
    history.replaceState(null, "", "/ui/playground?experiment_id=" + current.id);
    document.getElementById("prediction").textContent = "–";
    Plotly.purge("similarities");
    try {
      scatter = await api("/experiments/" + current.id + "/latent/scatter?max_points=2000");
    } catch (e) {  // a pruned member keeps its best checkpoint, not its latent spaces
      scatter = null;
      Plotly.purge("latent");
      document.getElementById("latent-note").textContent = "No stored latent space to show: " + e.message;
      return;
    }
    document.getElementById("latent-note").textContent = "The test latent space (PCA), with the class vectors as stars.";
    await corel.latentChart("latent", scatter);
  }

  // A feature-table model reads rows of numbers: its columns by name (a header row) where the
  // table named them, else so many numbers a line.
  async function prepareRows() {
    const area = document.getElementById("rows"), note = document.getElementById("rows-note");
    let summary = {};
    try { summary = (await api("/datasets/" + (current.dataset_id ?? current.spec.dataset_id))).summary || {}; } catch (e) { /* gone: say what we can */ }
    const columns = summary.feature_columns;
    if (columns && columns.length) {
      area.value = columns.join(",") + "\n";
      note.textContent = "Feature rows as CSV: the header row names the model's " + columns.length +
        " columns (other columns, such as the label, are ignored), then one row a line. Commas, semicolons or tabs.";
    } else {
      area.value = "";
      note.textContent = "Feature rows: " + (summary.num_features ? summary.num_features + " numbers" : "the numbers of one row") +
        " a line, separated by commas (this dataset's columns have no names, so no header row).";
    }
  }

  function rowsInput(text) {
    const lines = text.split(/\r?\n/).filter((l) => l.trim() !== "");
    if (!lines.length) throw new Error("Type or paste at least one row of features.");
    const header = lines[0].split(/[,;\t|]/).some((c) => c.trim() !== "" && Number.isNaN(Number(c.trim())));
    // With a header: the table as a CSV file, read by the server as an uploaded CSV is.
    if (header) return new File([text], "rows.csv", { type: "text/csv" });
    return { arrays: lines.map((l) => l.trim().split(/\s*[,;\t|]\s*|\s+/).map(Number)) };
  }

  // The same input for each endpoint: JSON, or a CSV file in a form.
  function request(input, extra) {
    if (input instanceof Blob) {
      const form = new FormData();
      form.append("files", input, input.name || "rows.csv");
      for (const [k, v] of Object.entries(extra)) form.append(k, String(v));
      return { method: "POST", body: form };
    }
    return { method: "POST", json: Object.assign({}, extra, input) };
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
      const extra = { experiment_id: current.id };
      const [pred, emb] = await Promise.all([api("/predict", request(input, extra)), api("/embed", request(input, extra))]);
      const p = pred.predictions[0], many = pred.predictions.length > 1;
      const label = (q, i) => q.input || (many ? "input " + (i + 1) : "your input");
      // An answer not to trust (a text the model could not read) says so.
      const warning = document.getElementById("warning");
      warning.textContent = p.warning || "";
      warning.hidden = !p.warning;
      const table = document.getElementById("row-predictions");
      table.querySelector("tbody").replaceChildren(...pred.predictions.map((q, i) => el("tr", { "data-class-index": q.class_index },
        el("td", {}, label(q, i)), el("td", {}, q.class_name), el("td", {}, q.warning || ""))));
      table.hidden = !many;
      document.getElementById("prediction").textContent = p.class_name;
      document.getElementById("prediction").dataset.classIndex = p.class_index;
      const colours = pred.class_names.map((_, k) => (k === p.class_index ? "#3559e0" : "#b8c2d6"));
      Plotly.react("similarities", [{ type: "bar", x: pred.class_names, y: p.similarities, marker: { color: colours } }],
        { margin: { t: 10, r: 10, b: 80, l: 55 }, xaxis: { type: "category", tickangle: -30 },
          yaxis: { title: { text: "similarity (" + pred.similarity + ")" } } },
        { responsive: true, displaylogo: false });
      const names = pred.predictions.map(label);
      if (!scatter) { await neighbors(input); return; }  // no stored latent space (a pruned member)
      const xy = emb.embeddings.map(project);
      await corel.latentChart("latent", scatter, [{ type: "scatter", mode: "markers+text", name: "your input", x: xy.map((v) => v[0]), y: xy.map((v) => v[1]),
        text: names, textposition: "bottom center", customdata: pred.predictions.map((q) => q.class_name),
        marker: { symbol: "x", size: 16, color: "#000", line: { width: 2 } }, hovertemplate: "%{text}: %{customdata}<extra></extra>" }]);
      document.getElementById("latent-note").textContent = many
        ? "Your " + names.length + " inputs (✕) land here; the first is predicted " + p.class_name + "."
        : "Your input (✕) lands here; predicted " + p.class_name + ".";
      await neighbors(input);
    } catch (e) { flash(e.message); }
  }

  async function neighbors(input) {
    // The same input through /neighbors: its nearest training rows, and their classes' vote.
    const table = document.getElementById("neighbors");
    try {
      const nn = await api("/experiments/" + current.id + "/neighbors", request(input, { k: 10 }));
      const r = nn.results[0];
      // Each neighbour itself: its id (its row of the data trained on), and its text or image.
      const what = (n) => n.image_url ? el("img", { src: n.image_url, alt: "row " + n.id, class: "thumb" })
        : (n.text !== undefined ? (n.text.length > 160 ? n.text.slice(0, 160) + "…" : n.text) : "");
      table.querySelector("tbody").replaceChildren(...r.neighbors.map((n, i) => el("tr", { "data-row": n.row },
        el("td", { class: "num" }, i + 1), el("td", { class: "num" }, n.id === null ? n.row : n.id),
        el("td", {}, what(n)), el("td", {}, n.class_name),
        el("td", { class: "num" }, num(n.distance, 4)))));
      table.hidden = false;
      const searched = nn.index_id === null ? "exact search over the training split" : "index " + nn.index_id;
      document.getElementById("neighbors-note").textContent = (nn.results.length > 1 ? "The first input's " : "The ") + nn.k + " nearest of the " + nn.n_reference +
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
  document.getElementById("predict-rows").onclick = () => {
    let input;
    try { input = rowsInput(document.getElementById("rows").value); } catch (e) { flash(e.message); return; }
    run(input);
  };
  document.getElementById("csv-file").addEventListener("change", async (e) => {
    const file = e.target.files[0];
    if (!file) return;
    document.getElementById("rows").value = await file.text();
    // Sent as the file it is: the server reads its delimiter and its header as for any CSV.
    run(file.name.toLowerCase().endsWith(".csv") ? file : new File([file], file.name + ".csv", { type: "text/csv" }));
    e.target.value = "";
  });
  select.addEventListener("change", () => choose().catch((e) => flash(e.message)));
  await choose();
};
