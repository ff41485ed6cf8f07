// The new-experiment form, generated from the ExperimentCreate schema of /openapi.json.
"use strict";

corel.pages.new = async function () {
  const { api, el, flash } = corel;
  // Server paths are not accepted over HTTP (uploads go by dataset_id).
  // fewshot: a few-shot sweep sets it on its members (POST /sweeps), not a run of its own.
  const HIDDEN = new Set(["dataset_path", "word_vectors", "fewshot"]);
  const LABELS = { lam: "λ (lam)", gamma: "γ (gamma)", learn_gamma: "Learn γ", alpha: "α (alpha)", lr: "Learning rate (lr)",
    batch_size: "Batch size", hidden: "Hidden width", train_subset: "Train subset", dataset_id: "Uploaded dataset id" };
  const form = document.getElementById("spec-form");
  // The upload's handler comes first, before anything is awaited: a file sent while the form
  // is still being built must not submit the page itself (a reload, and nothing uploaded).
  let formBuilt;
  const built = new Promise((resolve) => { formBuilt = resolve; });
  document.getElementById("upload-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const file = document.getElementById("upload-file").files[0];
    const out = document.getElementById("upload-result");
    if (!file) return;
    const data = new FormData();
    data.append("file", file);
    const up = document.getElementById("upload-form").elements;
    for (const name of ["label_column", "text_column"]) if (up[name].value.trim()) data.append(name, up[name].value.trim());
    if (up.standardize.checked) data.append("standardize", "true");
    out.textContent = "uploading…";
    try {
      const ds = await api("/datasets", { method: "POST", body: data });
      await built;  // the form's fields and defaults, which the upload's choice then overrides
      out.textContent = "dataset " + ds.id + " (" + ds.kind + ", " + ds.filename + ") is selected above";
      form.elements.dataset.value = ds.kind;  // npz (features become npz), text or ag-news
      form.elements.dataset_id.value = ds.id;
    } catch (e) { out.textContent = ""; flash(e.message); }
  });
  const doc = await api("/openapi.json");
  const schema = doc.components.schemas.ExperimentCreate;
  const required = new Set(schema.required || []);

  function plain(prop) {
    // anyOf [T, null] -> T, nullable
    if (prop.anyOf) {
      const t = prop.anyOf.find((p) => p.type !== "null");
      return Object.assign({}, t, { title: prop.title, description: prop.description, default: prop.default, nullable: true });
    }
    return prop;
  }

  function help(p) {
    const bits = [];
    if (p.description) bits.push(p.description);
    const lo = p.exclusiveMinimum !== undefined ? "> " + p.exclusiveMinimum : p.minimum !== undefined ? "≥ " + p.minimum : null;
    const hi = p.exclusiveMaximum !== undefined ? "< " + p.exclusiveMaximum : p.maximum !== undefined ? "≤ " + p.maximum : null;
    if (lo || hi) bits.push("Range: " + [lo, hi].filter(Boolean).join(", ") + ".");
    if (p.default !== undefined && p.default !== null) bits.push("Default " + p.default + ".");
    return bits.join(" ");
  }

  for (const [name, raw] of Object.entries(schema.properties)) {
    if (HIDDEN.has(name)) continue;
    const p = plain(raw);
    let input;
    if (p.enum) {
      input = el("select", { name, id: "f-" + name });
      if (!required.has(name) && p.default === undefined) input.append(el("option", { value: "" }, "–"));
      for (const v of p.enum) input.append(el("option", { value: v, selected: v === p.default }, v));
    } else if (p.type === "boolean") {
      input = el("input", { type: "checkbox", name, id: "f-" + name, checked: p.default === true });
    } else {
      const numeric = p.type === "integer" || p.type === "number";
      input = el("input", { type: numeric ? "number" : "text", name, id: "f-" + name,
        step: p.type === "integer" ? "1" : "any",
        value: p.default === undefined || p.default === null ? "" : p.default,
        placeholder: p.nullable ? "optional" : "" });
    }
    input.dataset.type = p.type || "string";
    input.dataset.helpBase = help(Object.assign({}, p, { default: undefined }));
    form.append(el("div", { class: "field", "data-field": name },
      el("label", { for: "f-" + name }, LABELS[name] || p.title || name, required.has(name) ? " *" : ""),
      input,
      el("span", { class: "help" }, help(p)),
      el("span", { class: "field-error", id: "err-" + name, role: "alert" }),
      el("span", { class: "field-warning", id: "warn-" + name, role: "status" })));
  }
  // A named budget fills lr, epochs and batch_size where they are left empty: the form starts
  // at quick (a good first result in about a minute); the empty fields show what it sets.
  const BUDGETS = (schema.properties.budget && schema.properties.budget["x-budgets"]) || {};
  function showBudget() {
    const chosen = BUDGETS[form.elements.budget.value] || BUDGETS.paper || {};
    for (const name of Object.keys(chosen)) {
      const input = form.elements[name];
      if (!input) continue;
      if (input.dataset.userSet !== "true") input.value = "";  // the schema's default: the budget's now
      input.placeholder = (form.elements.budget.value || "paper") + ": " + chosen[name];
      // The help says what an empty field means under this budget, not the schema's default.
      const box = input.closest(".field");
      if (box) box.querySelector(".help").textContent = (input.dataset.helpBase ? input.dataset.helpBase + " " : "") +
        "Left empty: " + chosen[name] + " (the " + (form.elements.budget.value || "paper") + " budget).";
    }
  }
  if (form.elements.budget) {
    form.elements.budget.value = "quick";
    for (const name of Object.keys(BUDGETS.quick || {})) {
      const input = form.elements[name];
      if (input) input.addEventListener("input", () => { input.dataset.userSet = input.value !== "" ? "true" : "false"; });
    }
    form.elements.budget.addEventListener("change", showBudget);
    showBudget();
  }
  // The schema's x-warn-below (per loss) is the API's rule for warnings: shown before submitting.
  const warnBelow = schema.properties.lam["x-warn-below"] || {};
  function warnLam() {
    const loss = form.elements.loss.value, lam = Number(form.elements.lam.value);
    const least = warnBelow[loss];
    document.getElementById("warn-lam").textContent =
      least !== undefined && form.elements.lam.value !== "" && lam < least
        ? "Gaussian-COREL needs λ ≥ " + least + ": below it the loss has no minimum, and the run will most likely fail as not learning."
        : "";
  }
  form.elements.loss.addEventListener("change", warnLam);

  // A loss's own options (margin, scale, ...): shown only for a loss that takes them, with
  // its default as the placeholder (empty: that default) and its own words as the help (what
  // the option does, what it allows, what it costs).
  const OPTION_FIELDS = ["margin", "scale", "scale_neg", "temperature", "miner"];
  function showOptions() {
    const loss = corel.LOSSES[form.elements.loss.value] || {};
    const own = loss.options || {}, docs = loss.option_docs || {};
    for (const name of OPTION_FIELDS) {
      const box = form.querySelector('[data-field="' + name + '"]');
      if (!box) continue;
      const takes = Object.prototype.hasOwnProperty.call(own, name);
      box.hidden = !takes;
      if (!takes) { form.elements[name].value = ""; continue; }
      form.elements[name].placeholder = "default " + own[name];
      box.querySelector(".help").textContent = (docs[name] || "") + " Default " + own[name] + ".";
    }
  }
  form.elements.loss.addEventListener("change", showOptions);
  showOptions();
  form.elements.lam.addEventListener("input", warnLam);
  warnLam();
  const q = corel.query();
  if (q.get("dataset_id")) { form.elements.dataset.value = q.get("dataset") || "npz"; form.elements.dataset_id.value = q.get("dataset_id"); }
  if (!q.get("dataset")) form.elements.dataset.value = "digits";
  formBuilt();
  // Built-in datasets that are not on this server are marked: one a worker will download
  // says so, and one that is unavailable cannot be chosen.
  const builtin = await api("/datasets/builtin");
  for (const d of builtin.items) {
    const option = form.elements.dataset.querySelector('option[value="' + d.dataset + '"]');
    if (!option || d.status === "present") continue;
    option.title = d.why || "";
    if (d.status === "downloadable") {
      option.textContent = d.dataset + " (downloaded on its first run)";
    } else {
      option.disabled = true;
      option.textContent = d.dataset + " (unavailable: see COREL_DATA_DIR)";
    }
  }
  // Defaults set and datasets marked: the form is the user's now. (Not form.dataset: on a
  // form that is its control named "dataset".)
  form.setAttribute("data-ready", "true");

  function body() {
    const out = {};
    for (const field of form.querySelectorAll("[name]")) {
      const t = field.dataset.type;
      if (field.type === "checkbox") { if (field.checked) out[field.name] = true; continue; }
      if (field.value === "") continue;
      // Numbers go as numbers (the API is strict about JSON types); what does not
      // parse goes as typed, and the API says what is wrong with it.
      if (t === "integer" || t === "number") {
        const n = Number(field.value);
        out[field.name] = Number.isFinite(n) ? n : field.value;
      } else out[field.name] = field.value;
    }
    if (out.loss && corel.LOSSES[out.loss] && !corel.LOSSES[out.loss].lam) delete out.lam;
    return out;
  }

  function clearErrors() {
    form.querySelectorAll(".field").forEach((f) => f.classList.remove("invalid"));
    form.querySelectorAll(".field-error").forEach((e) => (e.textContent = ""));
    flash("");
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    const button = document.getElementById("submit");
    button.disabled = true;
    try {
      const queued = await api("/experiments", { method: "POST", json: body() });
      location.href = "/ui/experiments/" + queued.id;
    } catch (e) {
      button.disabled = false;
      const errors = (e.body && e.body.errors) || [];
      let placed = 0;
      for (const err of errors) {
        const name = String(err.field || "").split(".").filter((p) => p !== "body")[0];
        const slot = name && document.getElementById("err-" + name);
        if (slot) {
          slot.textContent = err.message;
          slot.closest(".field").classList.add("invalid");
          placed++;
        }
      }
      if (!placed) flash(e.message);
    }
  });

};
