// Sweeps: the list, and one sweep with live member progress and the paper's tables.
"use strict";

corel.pages.sweeps = async function () {
  const { api, el } = corel;
  const PAGE = 25;
  let offset = 0;
  function doneBar(s) {
    // The bar counts finished members here, not epochs.
    const bar = corel.progressBar({ status: s.finished ? "succeeded" : "running", current_epoch: s.done, epochs_total: s.size });
    bar.querySelector("em").textContent = s.done + " of " + s.size + " done";
    return bar;
  }
  async function load() {
    const page = await api("/sweeps?limit=" + PAGE + "&offset=" + offset);
    const tbody = document.querySelector("#sweeps tbody");
    tbody.replaceChildren(...page.items.map((s) => el("tr", { "data-id": s.id },
      el("td", {}, el("a", { href: "/ui/sweeps/" + s.id }, "#" + s.id)),
      el("td", {}, (s.base.dataset || "?") + " / " + corel.modelLabel(s.base)),
      el("td", { class: "loss" }, s.losses.map((l) => corel.LOSS_NAMES[l] || l).join(", ")),
      el("td", { class: "muted" }, Object.entries(s.grid).map(([k, v]) => k + ": " + v.join(", ")).join("; ")),
      el("td", {}, doneBar(s)),
      el("td", { class: "num" }, s.counts.failed),
      el("td", { class: "owner" }, corel.owner(s.owner)),
      el("td", { class: "muted" }, corel.when(s.created_at)))));
    if (!page.items.length) tbody.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "No sweep yet.")));
    corel.pager(page, PAGE, offset, (o) => { offset = o; load().catch((e) => corel.flash(e.message)); });
  }
  await Promise.all([load(), newSweepForm()]);
};

// The new-sweep form: its choices, defaults and help come from the API (the spec's and
// PruneCreate's schemas, the built-in datasets) and the page (the losses); the server
// checks the sweep and its 422 is shown beside the field it names, else under the form.
async function newSweepForm() {
  const { api, el } = corel;
  const form = document.getElementById("sweep-form");
  const f = form.elements;
  const doc = await api("/openapi.json");
  const spec = doc.components.schemas.ExperimentCreate.properties;
  const pruneSchema = doc.components.schemas.PruneCreate.properties;

  // Built-in datasets, as the experiment form offers them (uploads need a dataset_id).
  const builtin = await api("/datasets/builtin");
  const status = Object.fromEntries(builtin.items.map((d) => [d.dataset, d]));
  for (const name of spec.dataset.enum.filter((d) => status[d])) {
    const d = status[name];
    f.dataset.append(el("option", { value: name, title: d.why || null, disabled: d.status === "unavailable" },
      name + (d.status === "downloadable" ? " (downloaded on its first run)"
        : d.status === "unavailable" ? " (unavailable: see COREL_DATA_DIR)" : "")));
  }
  if (status.digits && status.digits.status !== "unavailable") f.dataset.value = "digits";

  // A named budget fills lr, epochs and batch size; the form starts at quick, as the
  // experiment form does, and an epochs filled in wins.
  const budget = spec.budget.anyOf ? spec.budget.anyOf.find((t) => t.enum) : spec.budget;
  const BUDGETS = spec.budget["x-budgets"] || {};
  for (const name of budget.enum) f.budget.append(el("option", { value: name }, name));
  f.budget.value = BUDGETS.quick ? "quick" : budget.enum[0];
  function showBudget() {
    const b = BUDGETS[f.budget.value] || {};
    document.getElementById("s-budget-help").textContent = "lr " + b.lr + ", " + b.epochs + " epochs, batch " + b.batch_size + ".";
    f.epochs.placeholder = f.budget.value + ": " + b.epochs;
    document.getElementById("s-epochs-help").textContent = "Left empty: " + b.epochs + " (the " + f.budget.value + " budget).";
  }
  f.budget.addEventListener("change", showBudget);
  showBudget();

  // Losses: declared once (corel/loss_catalog.py), carried by the page.
  document.getElementById("s-losses").replaceChildren(...Object.entries(corel.LOSSES).map(([name, d]) =>
    el("label", { title: d.display || name },
      el("input", { type: "checkbox", name: "loss", value: name }), " " + (d.short || name),
      d.lam ? null : el("span", { class: "muted" }, " (no λ)"))));

  // Pruning: PruneCreate's metrics (one, or all of them: their Pareto front) and defaults.
  const metrics = (pruneSchema.metric.anyOf || [pruneSchema.metric]).find((t) => t.enum).enum;
  const METRIC_WORDS = { val_accuracy: "validation accuracy", val_map_at_r: "validation MAP@R" };
  for (const m of metrics) f.metric.append(el("option", { value: m }, METRIC_WORDS[m] || m));
  if (metrics.length > 1) f.metric.append(el("option", { value: "both" }, "both (Pareto front)"));
  f.metric.value = pruneSchema.metric.default;
  for (const name of ["eta", "min_epochs"]) {
    const p = pruneSchema[name];
    f[name].value = p.default;
    f[name].min = p.minimum;
    document.getElementById("s-prune-" + name + "-help").textContent =
      p.description + " Default " + p.default + ", at least " + p.minimum + ".";
  }
  document.getElementById("s-prune-help").textContent = doc.components.schemas.SweepCreate.properties.prune.description;
  function showPrune() {
    for (const name of ["metric", "eta", "min_epochs"]) f[name].disabled = !f.prune.checked;
    document.getElementById("s-prune-box").classList.toggle("off", !f.prune.checked);
  }
  f.prune.addEventListener("change", showPrune);
  showPrune();

  // "0.5, 0.7" -> [0.5, 0.7]; what is not a number goes as typed, and the API says why.
  function list(text) {
    return text.split(/[\s,;]+/).filter(Boolean).map((v) => (Number.isFinite(Number(v)) ? Number(v) : v));
  }
  function number(text) { return Number.isFinite(Number(text)) ? Number(text) : text; }

  function body() {
    const base = { dataset: f.dataset.value, budget: f.budget.value };
    if (f.epochs.value !== "") base.epochs = number(f.epochs.value);
    const grid = {};
    const losses = [...form.querySelectorAll("input[name=loss]:checked")].map((c) => c.value);
    if (losses.length === 1) base.loss = losses[0];
    else grid.loss = losses;
    const lam = list(f.lambdas.value), seed = list(f.seeds.value);
    if (lam.length) grid.lam = lam;
    if (seed.length) grid.seed = seed;
    const out = { base, grid };
    if (f.prune.checked) {
      out.prune = { metric: f.metric.value === "both" ? metrics : f.metric.value };
      for (const name of ["eta", "min_epochs"]) if (f[name].value !== "") out.prune[name] = number(f[name].value);
    }
    return out;
  }

  const note = document.getElementById("sweep-error");
  function showError(slot, message) {
    const box = slot && document.getElementById("serr-" + slot);
    if (!box) return false;
    box.textContent = message;
    box.closest(".field").classList.add("invalid");
    return true;
  }
  function clearErrors() {
    form.querySelectorAll(".field").forEach((x) => x.classList.remove("invalid"));
    form.querySelectorAll(".field-error").forEach((x) => (x.textContent = ""));
    note.textContent = "";
    note.hidden = true;
  }
  // The server's field (prune.eta, grid.lam, ...) -> the form's error slot.
  const SLOTS = { "grid.lam": "lambdas", "grid.seed": "seeds", "grid.loss": "losses", "base.dataset": "dataset",
    "base.epochs": "epochs", "base.budget": "budget", "prune.metric": "prune-metric", "prune.eta": "prune-eta",
    "prune.min_epochs": "prune-min_epochs" };
  function slotOf(field) {
    const path = String(field || "").split(".").filter((p) => p !== "body");
    return SLOTS[path.slice(0, 2).join(".")];
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    if (!form.querySelector("input[name=loss]:checked")) {
      showError("losses", "Choose at least one loss.");
      return;
    }
    const button = document.getElementById("sweep-submit");
    button.disabled = true;
    try {
      const queued = await api("/sweeps", { method: "POST", json: body() });
      location.href = "/ui/sweeps/" + queued.id;
    } catch (e) {
      button.disabled = false;
      const errors = (e.body && e.body.errors) || [];
      // A 422 of the schema lists its fields; one of the sweep's own checks names its field
      // at the start of its sentence ("prune.min_epochs is 2, but ...").
      const named = errors.length ? errors : [{ field: (/^(\w+\.\w+)\b/.exec(e.message) || [])[1], message: e.message }];
      const placed = named.filter((err) => showError(slotOf(err.field), err.message)).length;
      if (placed < named.length) {
        note.textContent = e.message;
        note.hidden = false;
      }
    }
  });
  form.setAttribute("data-ready", "true");
}

corel.pages.sweep = async function () {
  const { api, el, pct, num, badge, progressBar, stream, FINISHED, LOSS_NAMES, COLOURS } = corel;
  const id = window.SWEEP_ID;
  let sweep = await api("/sweeps/" + id);
  const members = new Map();
  // Members a page of 200 at a time (a sweep may have up to 2,000), oldest first.
  async function listMembers() {
    const exps = [];
    for (let offset = 0; offset < sweep.size; offset += 200) {
      const page = await api("/experiments?sweep_id=" + id + "&limit=200&offset=" + offset);
      exps.push(...page.items);
      if (page.items.length < 200) break;
    }
    return exps.sort((a, b) => a.id - b.id);
  }
  (await listMembers()).forEach((e) => members.set(e.id, e));
  const allDone = () => [...members.values()].every((e) => FINISHED.includes(e.status));

  // Which members trained together: each member's stacked group (1, 2, ...), in queue order.
  const groups = sweep.member_groups || [];
  const stackOf = new Map(groups.flatMap((ids, g) => ids.map((id) => [id, g])));
  function stackCell(e) {
    const g = stackOf.get(e.id);
    if (g === undefined) return el("td", { class: "num muted" }, "–");
    const mates = groups[g].filter((id) => id !== e.id);
    return el("td", { class: "num", "data-stack": g + 1,
      title: mates.length ? "trained together with " + mates.map((id) => "#" + id).join(", ") : "trained alone" }, g + 1);
  }
  document.getElementById("stacks").textContent = !groups.length ? "" :
    sweep.size + " members in " + groups.length + (groups.length === 1 ? " stacked group" : " stacked groups") +
    ": the members of a group train together, as one model, over the same batches" +
    (groups.some((ids) => ids.length === 1) ? " (a group of one trains alone)." : ".");

  function memberRow(e) {
    return el("tr", { "data-id": e.id, "data-status": e.status },
      el("td", {}, el("a", { href: "/ui/experiments/" + e.id }, "#" + e.id)),
      stackCell(e),
      el("td", {}, LOSS_NAMES[e.spec.loss] || e.spec.loss),
      el("td", { class: "num" }, corel.LOSSES[e.spec.loss] && !corel.LOSSES[e.spec.loss].lam ? "–" : e.spec.lam),
      el("td", { class: "num" }, e.spec.fewshot ? "N=" + e.spec.fewshot.shots + ", draw " + (e.spec.fewshot.split + 1) : e.spec.seed),
      el("td", {}, badge(e.status)), el("td", {}, progressBar(e)),
      el("td", { class: "num" }, pct(e.best_val_accuracy)), el("td", { class: "num" }, pct(e.test_accuracy)));
  }

  function renderMembers() {
    const all = [...members.values()];
    const done = all.filter((e) => FINISHED.includes(e.status)).length;
    document.getElementById("sweep-progress").replaceChildren(
      progressBar({ status: done === all.length ? "succeeded" : "running", current_epoch: done, epochs_total: all.length }));
    document.querySelector("#sweep-progress .progress em").textContent = done + " of " + all.length + " done";
    document.querySelector("#members tbody").replaceChildren(...all.map(memberRow));
    fitRows();
    document.getElementById("cancel").hidden = done === all.length;
    const b = sweep.base;
    document.getElementById("subtitle").textContent = (b.dataset || "?") + " / " + corel.modelLabel(b) + ", " +
      sweep.losses.map((l) => LOSS_NAMES[l] || l).join(", ") + ", " +
      (sweep.fewshot ? "a head over the inputs, full batch" : (b.epochs || ({ quick: 10 }[b.budget]) || 150) + " epochs") + "; grid " + Object.entries(sweep.grid).map(([k, v]) => k + " " + v.join(", ")).join("; ") +
      (sweep.lam_by_loss ? "; λ by loss " + JSON.stringify(sweep.lam_by_loss) : "") +
      (sweep.fewshot ? "; few-shot: N = " + sweep.fewshot.shots.join(", ") + ", " + sweep.fewshot.splits + " draws each" + (sweep.fewshot.unlabeled ? ", with the pool's other rows, unlabeled (self-training)" : "") : "");
  }

  // What a table's paired t-test says, of the table's own figure ("test accuracy", "MAP@R").
  function words(cmp, figure) {
    if (!cmp) return "There is one loss only: nothing to test.";
    const name = (l) => LOSS_NAMES[l] || l;
    if (cmp.p === null || cmp.p === undefined) {
      return "The paired t-test of " + name(cmp.best) + " against " + name(cmp.runner_up) +
        " needs at least two seeds both have, with differences that vary; it was not computed.";
    }
    const sig = cmp.p < 0.05;
    return name(cmp.best) + " has the best mean " + figure + ". Against the runner-up, " + name(cmp.runner_up) +
      ", a paired two-tailed t-test over " + cmp.paired_seeds.length + " seeds gives p = " + cmp.p.toPrecision(2) +
      ": the difference is " + (sig ? "significant at the 5% level" + (cmp.p < 0.001 ? " (p < 0.001)" : "") : "not significant") + ".";
  }

  // The grid as parallel coordinates: each member a line across its grid fields and its
  // best validation and test accuracy, coloured by how it ended (pruned members grey).
  function parcoords() {
    const all = [...members.values()];
    const keys = Object.keys(sweep.grid);
    const dims = keys.map((k) => {
      const values = all.map((e) => e.spec[k]);
      if (values.every((v) => typeof v === "number")) return { label: k === "lam" ? "λ" : k, values };
      const names = [...new Set(values.map(String))];
      return { label: k, values: values.map((v) => names.indexOf(String(v))), tickvals: names.map((_, i) => i),
               ticktext: names.map((n) => LOSS_NAMES[n] || n) };
    });
    if (sweep.fewshot) dims.push({ label: "N", values: all.map((e) => e.spec.fewshot.shots) });
    dims.push({ label: "best val %", values: all.map((e) => e.best_val_accuracy === null ? 0 : 100 * e.best_val_accuracy) });
    dims.push({ label: "test %", values: all.map((e) => e.test_accuracy === null ? 0 : 100 * e.test_accuracy) });
    const ended = all.map((e) => (e.status === "pruned" ? 0 : e.status === "succeeded" ? 1 : 0.5));
    Plotly.react("parcoords", [{ type: "parcoords", dimensions: dims,
      line: { color: ended, cmin: 0, cmax: 1, colorscale: [[0, "#b8bfcc"], [0.5, "#e0a43a"], [1, "#2f6fdf"]] } }],
      // Room either side for the outer axes' tick labels ("Gaussian-COREL" was cut to "n-COREL").
      { margin: { t: 40, r: 70, b: 20, l: 120 } }, { responsive: true, displaylogo: false });
  }

  function pruning(p) {
    const box = document.getElementById("pruning-box");
    box.hidden = !p;
    if (!p) return;
    document.getElementById("pruning-note").textContent = "Successive halving inside each stacked group on " +
      p.prune.metric.join(" and ") + ": at each rung (epoch " + p.prune.min_epochs + ", then times " + p.prune.eta +
      ") the best 1/" + p.prune.eta + " of the configurations stay; the others end pruned, with their best checkpoint.";
    document.querySelector("#rungs tbody").replaceChildren(...p.rungs.map((r) => el("tr", {},
      el("td", { class: "num" }, r.epoch), el("td", { class: "num" }, r.members), el("td", { class: "num" }, r.kept))));
    document.querySelector("#pruned tbody").replaceChildren(...p.pruned.map((r) => el("tr", { "data-id": r.experiment_id },
      el("td", {}, el("a", { href: "/ui/experiments/" + r.experiment_id }, "#" + r.experiment_id)),
      el("td", {}, LOSS_NAMES[r.loss] || r.loss), el("td", { class: "num" }, r.lam === null ? "–" : r.lam),
      el("td", { class: "num" }, r.seed), el("td", { class: "num" }, r.rung), el("td", {}, r.reason))));
  }

  // A few-shot sweep: each method's mean test accuracy against N, its sd over the draws as
  // error bars; the table beside it (paired differences against the best at each N).
  function fewshot(f) {
    document.getElementById("fewshot-box").hidden = !f;
    document.getElementById("report-box").hidden = !!f;
    if (!f) return;
    const complete = f.shots.map((n) => "N=" + n + ": " + f.draws[String(n)] + " of " + f.splits).join(", ");
    document.getElementById("fewshot-note").textContent = "Each method trained on " + f.splits + " seeded draws (seed " +
      f.seed + ") of N examples per class, every one tested on the same evaluation rows; compared over the draws " +
      "every method has finished (" + complete + ").";
    const traces = f.methods.map((m, i) => {
      const rows = f.summary.filter((r) => r.method === m).sort((a, b) => a.shots - b.shots);
      return { x: rows.map((r) => r.shots), y: rows.map((r) => 100 * r.mean), name: LOSS_NAMES[m] || m,
        error_y: { type: "data", array: rows.map((r) => 100 * r.sd), visible: true },
        mode: "lines+markers", line: { color: COLOURS[i % COLOURS.length] } };
    }).filter((t) => t.x.length);
    Plotly.react("fewshot-plot", traces, { margin: { t: 10, r: 10, b: 45, l: 55 },
      xaxis: { title: { text: "examples per class (N)" }, type: "log", tickvals: f.shots },
      yaxis: { title: { text: "test accuracy %" } }, legend: { orientation: "h", y: -0.25 } }, { responsive: true, displaylogo: false });
    document.querySelector("#fewshot-table tbody").replaceChildren(...f.summary.map((r) => el("tr", { "data-shots": r.shots, "data-method": r.method },
      el("td", { class: "num" }, r.shots), el("td", {}, (LOSS_NAMES[r.method] || r.method) + (r.method === r.best ? " ★" : "")),
      el("td", { class: "num" }, pct(r.mean)), el("td", { class: "num" }, pct(r.sd)), el("td", { class: "num" }, pct(r.min)),
      el("td", { class: "num" }, pct(r.max)), el("td", { class: "num" }, r.method === r.best ? "–" : (100 * r.diff).toFixed(1)),
      el("td", { class: "num" }, r.p === null ? "–" : r.p.toPrecision(2)), el("td", { class: "num" }, r.splits))));
  }

  async function report() {
    const rep = await api("/sweeps/" + id + "/report");
    pruning(rep.pruning);
    fewshot(rep.fewshot);
    parcoords();
    const paper = rep.paper_table1 || {};
    document.querySelector("#table1 tbody").replaceChildren(...rep.test_accuracy.rows.map((r) => el("tr", { "data-loss": r.loss },
      el("td", {}, LOSS_NAMES[r.loss] || r.loss), el("td", { class: "num" }, r.lam === null ? "–" : r.lam),
      el("td", { class: "num" }, pct(r.mean)), el("td", { class: "num" }, r.std === null ? "–" : pct(r.std)),
      el("td", { class: "num" }, r.n), el("td", { class: "num" }, paper[r.loss] !== undefined ? paper[r.loss].toFixed(2) : "–"),
      el("td", { class: "num" }, paper[r.loss] !== undefined ? (100 * r.mean - paper[r.loss] >= 0 ? "+" : "") + (100 * r.mean - paper[r.loss]).toFixed(2) : "–"))));
    document.getElementById("ttest").textContent = words(rep.test_accuracy.comparison, "test accuracy");
    const t2 = [], traces = [];
    Object.entries(rep.lambda_tuning).forEach(([loss, t], i) => {
      for (const r of t.by_lambda) {
        t2.push(el("tr", {}, el("td", {}, LOSS_NAMES[loss] || loss), el("td", { class: "num" }, r.lam === null ? "–" : r.lam + (r.lam === t.tuned_lambda ? " ★" : "")),
          el("td", { class: "num" }, pct(r.mean_val)), el("td", { class: "num" }, r.std_val === null ? "–" : pct(r.std_val)), el("td", { class: "num" }, r.n)));
      }
      const pts = t.by_lambda.filter((r) => r.lam !== null);
      const colour = COLOURS[i % COLOURS.length];
      if (pts.length) traces.push({ x: pts.map((r) => r.lam), y: pts.map((r) => r.mean_val),
        error_y: { type: "data", array: pts.map((r) => r.std_val || 0), visible: true }, name: LOSS_NAMES[loss] || loss, mode: "lines+markers", line: { color: colour } });
      else if (t.by_lambda.length) traces.push({ x: [0, 1], y: [t.by_lambda[0].mean_val, t.by_lambda[0].mean_val], name: (LOSS_NAMES[loss] || loss) + " (no λ)", mode: "lines", line: { dash: "dash", color: colour } });
    });
    // A pruned sweep's tables are its survivors'; the members it pruned are points of their
    // own (their best validation accuracy up to their rung), so the plot shows the whole grid.
    const cut = [...members.values()].filter((e) => e.status === "pruned" && e.spec.lam !== undefined && e.spec.lam !== null
                                              && e.best_val_accuracy !== null);
    if (cut.length) traces.push({ x: cut.map((e) => e.spec.lam), y: cut.map((e) => e.best_val_accuracy), mode: "markers",
      name: "pruned (best up to its rung)", marker: { color: "#b8bfcc", symbol: "x", size: 9 },
      text: cut.map((e) => "#" + e.id + " " + (LOSS_NAMES[e.spec.loss] || e.spec.loss)), hovertemplate: "%{text}: λ %{x}, %{y:.3f}<extra></extra>" });
    document.querySelector("#table2 tbody").replaceChildren(...t2);
    Plotly.react("lambda-plot", traces, { margin: { t: 10, r: 10, b: 40, l: 55 }, xaxis: { title: { text: "λ" } },
      yaxis: { title: { text: "validation accuracy" } }, legend: { orientation: "h", y: -0.2 } }, { responsive: true, displaylogo: false });
    document.querySelector("#table34 tbody").replaceChildren(...rep.clustering.map((r) => el("tr", {},
      el("td", {}, LOSS_NAMES[r.loss] || r.loss), el("td", {}, r.algorithm === "kmeans" ? "K-Means" : "GMM"), el("td", {}, r.metric),
      el("td", { class: "num" }, pct(r.accuracy)), el("td", { class: "num" }, num(r.ari)), el("td", { class: "num" }, num(r.v_measure)),
      el("td", { class: "num" }, num(r.silhouette)))));
    document.getElementById("clustering-note").textContent = rep.clustering.length
      ? "At each loss's tuned λ, mean over seeds, each in its loss's own geometry." : "No succeeded member yet.";
    const ret = rep.retrieval || { rows: [], comparison: null };
    document.querySelector("#table-map tbody").replaceChildren(...ret.rows.map((r) => el("tr", { "data-loss": r.loss },
      el("td", {}, LOSS_NAMES[r.loss] || r.loss), el("td", { class: "num" }, r.lam === null ? "–" : r.lam),
      el("td", { class: "num" }, pct(r.mean)), el("td", { class: "num" }, r.std === null ? "–" : pct(r.std)),
      el("td", { class: "num" }, r.n))));
    document.getElementById("ttest-map").textContent = ret.comparison ? words(ret.comparison, "MAP@R") : "";
    fitRows();
  }

  // A scrolled table's box ends at a row's bottom, never across a row (the pruning table's
  // last visible row was cut in half).
  function fitRows() {
    for (const [selector, most] of [["#members", 360], ["#pruned", 300], ["#table2", 360]]) {
      const table = document.querySelector(selector), box = table && table.parentElement;
      if (!box || !box.style.maxHeight) continue;
      const rowHeight = (r) => r.getBoundingClientRect().height;  // fractional: offsetHeight rounds
      let height = rowHeight(table.querySelector("thead"));
      for (const tr of table.querySelectorAll("tbody tr")) {
        if (height + rowHeight(tr) > most) break;
        height += rowHeight(tr);
      }
      box.style.maxHeight = height + "px";
    }
  }

  // Once every member has finished, the list and the tables are read once more from the
  // API: the page ends as a reload would show it, whatever the live updates crossed.
  async function reconcile() {
    (await listMembers()).forEach((e) => members.set(e.id, e));
    renderMembers();
    await report();
  }

  document.getElementById("cancel").onclick = async () => {
    try { sweep = await api("/sweeps/" + id + "/cancel", { method: "POST" }); } catch (e) { corel.flash(e.message); }
  };
  renderMembers();
  await report().catch((e) => corel.flash(e.message));
  if (allDone()) return;
  let pending = null;
  stream("/sweeps/" + id + "/events", (kind, data) => {
    const e = members.get(data.experiment_id);
    if (!e) {  // a member the first listing did not have: read it, never drop its event
      api("/experiments/" + data.experiment_id).then((fresh) => { members.set(fresh.id, fresh); renderMembers(); }).catch(() => {});
      return;
    }
    if (kind === "epoch") {
      e.current_epoch = Math.max(e.current_epoch, data.epoch);
      if (data.is_best) e.best_val_accuracy = data.val_accuracy;
    } else if (kind === "status") {
      Object.assign(e, data);
      if (FINISHED.includes(e.status)) {
        // Tables follow finished members, at most once a second.
        clearTimeout(pending);
        pending = setTimeout(() => (allDone() ? reconcile() : report()).catch(() => {}), 1000);
        api("/experiments/" + e.id).then((fresh) => { members.set(e.id, fresh); renderMembers(); }).catch(() => {});
      }
    }
    renderMembers();
  });
};
