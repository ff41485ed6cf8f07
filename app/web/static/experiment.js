// One experiment: live curves and metrics while it trains; then its latent space,
// clustering report and downloads.
"use strict";

corel.latentChart = function (div, data, extra) {
  // The test latent space (PCA) coloured by class, the class vectors as the head reads them.
  const { COLOURS } = corel;
  const traces = [];
  const byClass = new Map();
  data.labels.forEach((c, i) => { if (!byClass.has(c)) byClass.set(c, []); byClass.get(c).push(i); });
  [...byClass.keys()].sort((a, b) => a - b).forEach((c) => {
    const idx = byClass.get(c), name = data.class_names[c] || String(c);
    traces.push({ type: "scattergl", mode: "markers", name, x: idx.map((i) => data.points[i][0]),
      y: idx.map((i) => data.points[i][1]), marker: { size: 4, opacity: 0.55, color: COLOURS[c % COLOURS.length] },
      hovertemplate: "class: " + name + "<extra></extra>" });
  });
  traces.push({ type: "scatter", mode: "markers+text", name: "class vectors W",
    x: data.class_vectors.map((w) => w[0]), y: data.class_vectors.map((w) => w[1]),
    text: data.class_vectors.map((_, c) => data.class_names[c] || String(c)), textposition: "top right",
    marker: { symbol: "star", size: 18, line: { width: 1.5, color: "#111" }, color: data.class_vectors.map((_, c) => COLOURS[c % COLOURS.length]) },
    hovertemplate: "class vector: %{text}<extra></extra>" });
  for (const t of extra || []) traces.push(t);
  const ev = data.explained_variance;
  // Room on the left for the y title, on top for the toolbar (it covered a tick).
  const layout = { margin: { t: 44, r: 10, b: 44, l: 64 }, legend: { orientation: "v" },
    title: { text: data.title + (data.class_vectors_note ? " (" + data.class_vectors_note + ")" : ""), font: { size: 13 } },
    xaxis: { title: { text: "PC 1 (" + Math.round(100 * ev[0]) + "% of variance)" } },
    yaxis: { title: { text: "PC 2 (" + Math.round(100 * ev[1]) + "% of variance)" } } };
  return Plotly.react(div, traces, layout, { responsive: true, displaylogo: false });
};

corel.pages.experiment = async function () {
  const { api, el, pct, num, badge, progressBar, stream, FINISHED, lossLabel } = corel;
  const id = window.EXPERIMENT_ID;
  let exp = await api("/experiments/" + id);
  const epochs = (await api("/experiments/" + id + "/metrics")).items;
  const seen = new Set(epochs.map((m) => m.epoch));
  const modelLabel = corel.modelLabel;

  function header() {
    document.getElementById("status").replaceChildren(badge(exp.status));
    document.getElementById("progress").replaceChildren(progressBar(exp));
    document.getElementById("subtitle").textContent =
      lossLabel(exp.spec) + " on " + exp.spec.dataset + " (" + modelLabel(exp.spec) + "), seed " + exp.spec.seed +
      (exp.owner ? "; owner " + exp.owner.name : "");
    document.getElementById("cancel").hidden = FINISHED.includes(exp.status);
    const phase = document.getElementById("phase");
    const preparing = exp.status === "running" && exp.phase;
    phase.hidden = !preparing;
    phase.textContent = preparing ? exp.phase + (exp.phase_detail ? ": " + exp.phase_detail : "") : "";
    const warn = document.getElementById("warning-box");
    warn.hidden = !(exp.warnings && exp.warnings.length);
    warn.textContent = warn.hidden ? "" : "Warning: " + exp.warnings.join("; ");
    if (FINISHED.includes(exp.status) && exp.status !== "succeeded") {
      // Nothing will come: say so instead of "available when the experiment has succeeded".
      const none = "None: the experiment " + (exp.status === "failed" ? "failed" : "was cancelled") + ".";
      document.getElementById("latent-note").textContent = none;
      document.getElementById("clustering-note").textContent = none;
      document.getElementById("retrieval-note").textContent = none;
      document.getElementById("downloads").replaceChildren(el("li", { class: "muted" }, none));
    }
    const box = document.getElementById("error-box");
    box.hidden = !exp.error;
    box.textContent = exp.error ? "Failed: " + exp.error : "";
    const k = document.getElementById("kpis");
    k.replaceChildren(
      el("div", { class: "kpi" }, el("b", { id: "kpi-epoch" }, exp.current_epoch + " / " + exp.epochs_total), el("span", {}, "epochs")),
      el("div", { class: "kpi" }, el("b", { id: "kpi-val" }, pct(exp.best_val_accuracy)), el("span", {}, "best val accuracy %")),
      el("div", { class: "kpi" }, el("b", { id: "kpi-test" }, pct(exp.test_accuracy)), el("span", {}, "test accuracy % (best-val epoch)")),
      el("div", { class: "kpi" }, el("b", {}, exp.best_epoch || "–"), el("span", {}, "best epoch")),
      el("div", { class: "kpi" }, el("b", {}, num(exp.train_seconds, 1)), el("span", {}, "train seconds")),
      el("div", { class: "kpi" }, el("b", { id: "kpi-prediction" }, exp.prediction || "–"), el("span", {}, "predicts with")),
      el("div", { class: "kpi" }, el("b", { id: "kpi-device" }, exp.device ? exp.device + " · " + exp.precision : "–"), el("span", {}, "trained on")));
  }

  function spec() {
    const dl = document.getElementById("spec");
    dl.replaceChildren();
    // The shared loss parameters this run's loss does not read (lam for ArcFace, ...) are
    // left out: they did not change the run.
    const shared = ["lam", "gamma", "learn_gamma", "alpha"];
    const reads = (corel.LOSSES[exp.spec.loss] || {}).params || shared;
    for (const [k, v] of Object.entries(exp.spec)) {
      if (v === null || v === undefined) continue;
      if (shared.includes(k) && !reads.includes(k)) continue;
      dl.append(el("dt", {}, k), el("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v)));
    }
  }

  function curves() {
    const empty = !epochs.length && FINISHED.includes(exp.status);
    document.getElementById("curves").hidden = empty;
    document.getElementById("curves-note").hidden = !empty;
    document.getElementById("curves-note").textContent = empty
      ? "No epoch was recorded: the run " + (exp.status === "cancelled" ? "was cancelled" : "ended") + " before its first epoch finished." : "";
    if (empty) return;
    const x = epochs.map((m) => m.epoch);
    const traces = [
      { x, y: epochs.map((m) => m.train_loss), name: "train loss", yaxis: "y2", mode: "lines+markers", line: { color: "#7f7f7f", dash: "dot" } },
      { x, y: epochs.map((m) => m.train_accuracy), name: "train acc", mode: "lines+markers", line: { color: "#1f77b4" } },
      { x, y: epochs.map((m) => m.val_accuracy), name: "val acc", mode: "lines+markers", line: { color: "#ff7f0e" } },
    ];
    const best = epochs.find((m) => m.is_best && m.epoch === exp.best_epoch) || [...epochs].reverse().find((m) => m.is_best);
    const shapes = best ? [{ type: "line", x0: best.epoch, x1: best.epoch, yref: "paper", y0: 0, y1: 1, line: { dash: "dash", color: "#999", width: 1 } }] : [];
    Plotly.react("curves", traces, {
      margin: { t: 36, r: 56, b: 40, l: 56 }, shapes, legend: { orientation: "h", y: -0.2 },
      xaxis: { title: { text: "epoch" }, range: [0.5, Math.max(exp.epochs_total, x.length) + 0.5] },
      yaxis: { title: { text: "accuracy" }, range: [0, 1] },
      yaxis2: { title: { text: "train loss" }, overlaying: "y", side: "right", showgrid: false },
    }, { responsive: true, displaylogo: false });
  }

  function metricsTable() {
    const tbody = document.querySelector("#metrics tbody");
    tbody.replaceChildren(...epochs.map((m) => el("tr", { "data-epoch": m.epoch },
      el("td", { class: "num" }, m.epoch), el("td", { class: "num" }, num(m.train_loss, 4)),
      el("td", { class: "num" }, pct(m.train_accuracy)), el("td", { class: "num" }, pct(m.val_accuracy)),
      el("td", { class: "num" }, pct(m.test_accuracy)), el("td", {}, m.is_best ? "★" : ""),
      el("td", { class: "num" }, num(m.seconds, 2)))));
  }

  async function results() {
    // A cancelled or pruned run with a best checkpoint serves too: the playground takes it.
    if ((exp.status === "cancelled" || exp.status === "pruned") && exp.best_epoch >= 1) {
      document.getElementById("playground-link").hidden = false;
      document.getElementById("playground-link").href = "/ui/playground?experiment_id=" + id;
    }
    if (exp.status !== "succeeded") return;
    document.getElementById("playground-link").hidden = false;
    document.getElementById("playground-link").href = "/ui/playground?experiment_id=" + id;
    const dl = document.getElementById("downloads");
    dl.replaceChildren(
      el("li", {}, el("a", { href: "#", "data-download": "/experiments/" + id + "/checkpoint", "data-name": "experiment-" + id + "-best.pt" }, "Best checkpoint (.pt)")),
      ...["npy", "csv", "parquet"].map((f) => el("li", {}, el("a", { href: "#", "data-download": "/experiments/" + id + "/latent?format=" + f,
        "data-name": "experiment-" + id + "-test-latent." + f }, "Test latent space (." + f + ")"))),
      el("li", {}, el("a", { href: "#", "data-download": "/experiments/" + id + "/curves.png", "data-name": "curves.png" }, "Curves (PNG)")));
    dl.querySelectorAll("a[data-download]").forEach((a) => a.addEventListener("click", async (ev) => {
      // Through fetch, so that the token goes along; then saved as a file.
      ev.preventDefault();
      const r = await api(a.dataset.download, { raw: true });
      const url = URL.createObjectURL(await r.blob());
      const tmp = el("a", { href: url, download: a.dataset.name });
      document.body.append(tmp); tmp.click(); tmp.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    }));
    try {
      const scatter = await api("/experiments/" + id + "/latent/scatter?max_points=3000");
      document.getElementById("latent").hidden = false;
      document.getElementById("latent-note").textContent =
        scatter.points.length + " of " + scatter.n_total + " test points; hover for the class. Stars: the class vectors W.";
      await corel.latentChart("latent", scatter);
    } catch (e) { document.getElementById("latent-note").textContent = e.message; }
    try {
      const rep = await api("/experiments/" + id + "/clustering");
      const table = document.getElementById("clustering");
      table.hidden = false;
      document.getElementById("clustering-note").textContent =
        "Test latent space, " + rep.n_samples + " points, in the loss's own geometry (" + rep.metric + ").";
      table.querySelector("tbody").replaceChildren(...Object.values(rep.results).map((r) => el("tr", { "data-algorithm": r.algorithm },
        el("td", {}, r.algorithm === "kmeans" ? "K-Means" : "Gaussian mixture"), el("td", {}, r.metric),
        el("td", { class: "num" }, pct(r.accuracy)), el("td", { class: "num" }, num(r.ari)),
        el("td", { class: "num" }, num(r.v_measure)), el("td", { class: "num" }, num(r.silhouette)))));
    } catch (e) { document.getElementById("clustering-note").textContent = e.message; }
    try {
      const ret = await api("/experiments/" + id + "/retrieval");
      const table = document.getElementById("retrieval");
      table.hidden = false;
      document.getElementById("retrieval-note").textContent = "Each of the " + ret.n_queries +
        " test rows among the " + ret.n_reference + " training rows, nearest first (Musgrave et al., 2020).";
      table.querySelector("tbody").replaceChildren(el("tr", {},
        el("td", {}, ret.geometry), el("td", { class: "num", id: "ret-p1" }, pct(ret.precision_at_1)),
        el("td", { class: "num" }, pct(ret.r_precision)),
        el("td", { class: "num", id: "ret-map" }, pct(ret.mean_average_precision_at_r))));
    } catch (e) { document.getElementById("retrieval-note").textContent = e.message; }
  }

  document.getElementById("cancel").onclick = async () => {
    try { exp = await api("/experiments/" + id + "/cancel", { method: "POST" }); header(); }
    catch (e) { corel.flash(e.message); }
  };

  header(); spec(); curves(); metricsTable();
  if (FINISHED.includes(exp.status)) { await results(); return; }
  // Before the first epoch a worker may be preparing the data (downloading the dataset,
  // computing a frozen encoder's features), and after the last one storing its results:
  // the events carry epochs and statuses, so the phase is read from the row meanwhile.
  const phases = setInterval(async () => {
    if (FINISHED.includes(exp.status)) { clearInterval(phases); return; }
    if (exp.current_epoch > 0 && exp.current_epoch < exp.epochs_total) return;
    try {
      const now = await api("/experiments/" + id);
      if (now.current_epoch >= exp.current_epoch) { exp.phase = now.phase; exp.phase_detail = now.phase_detail; exp.status = now.status; header(); }
    } catch (e) { /* the next tick tries again */ }
  }, 1000);
  stream("/experiments/" + id + "/events", async (kind, data) => {
    if (kind === "epoch" && !seen.has(data.epoch)) {
      seen.add(data.epoch);
      epochs.push(data);
      epochs.sort((a, b) => a.epoch - b.epoch);
      exp.current_epoch = Math.max(exp.current_epoch, data.epoch);
      if (data.is_best) { exp.best_val_accuracy = data.val_accuracy; exp.best_epoch = data.epoch; }
      header(); curves(); metricsTable();
    } else if (kind === "status") {
      const was = exp.status;
      Object.assign(exp, data);
      if (FINISHED.includes(exp.status) && was !== exp.status) exp = await api("/experiments/" + id);
      header(); curves();
      if (FINISHED.includes(exp.status)) await results();
    }
  });
};
