// Models with names: each with its contract and versions (each a link to its run), and its share control.
"use strict";

corel.pages.models = async function () {
  const { api, el } = corel;
  const PAGE = 50;
  let offset = 0;
  function share(m) {
    document.getElementById("share-card").hidden = false;
    document.getElementById("share-title").textContent = "Sharing model " + m.name;
    return corel.shareControl(document.getElementById("share"), "model", m.name);
  }
  function inputs(contract) {
    if (!contract) return "–";
    return contract.inputs + (contract.shape ? " " + contract.shape.join("×") : "");
  }
  function gate(g) {
    if (!g) return "–";
    if (g.forced) return "forced (no gate)";
    const parts = ["accuracy", "map_at_r"].filter((k) => g[k]).map((k) =>
      (k === "accuracy" ? "accuracy " : "MAP@R ") + corel.num(g[k].delta, 3) +
      " [" + corel.num(g[k].interval[0], 3) + ", " + corel.num(g[k].interval[1], 3) + "]");
    return parts.length ? parts.join("; ") : (g.passed ? "passed (first alias)" : "refused");
  }
  async function alias(m, name) {
    document.getElementById("alias-card").hidden = false;
    document.getElementById("alias-title").textContent = m.name + "@" + name + " (version " + m.aliases[name] + ")";
    const moves = await api("/models/" + m.name + "/aliases/" + name + "/history");
    document.querySelector("#history tbody").replaceChildren(...moves.map((h) => el("tr", { "data-to": h.to_version },
      el("td", { class: "muted" }, corel.when(h.at)), el("td", {}, h.from_version === null ? "–" : "v" + h.from_version),
      el("td", {}, "v" + h.to_version), el("td", {}, h.user_id === null ? "–" : "user " + h.user_id),
      el("td", {}, h.promotion_id === null ? "–" : "#" + h.promotion_id), el("td", { class: "gate" }, gate(h.gate)))));
    const promotions = await api("/models/" + m.name + "/promotions?alias=" + encodeURIComponent(name));
    document.querySelector("#promotions tbody").replaceChildren(...promotions.map((p) => el("tr", { "data-id": p.promotion_id },
      el("td", {}, "#" + p.promotion_id), el("td", {}, "v" + p.version), el("td", { class: "status" }, p.status),
      el("td", { class: "reason" }, p.report ? (p.report.reason || gate(p.report.figures ? p.report.figures : p.report)) : "–"),
      el("td", { class: "muted" }, corel.when(p.created_at)))));
    const box = document.getElementById("recall-plot");
    box.hidden = true;
    const gated = promotions.find((p) => p.report && p.report.class_recall);
    if (gated) {
      const rows = gated.report.class_recall;
      {
        box.hidden = false;
        Plotly.newPlot(box, [
          { type: "bar", name: "incumbent", x: rows.map((r) => r.class_name), y: rows.map((r) => r.incumbent) },
          { type: "bar", name: "candidate", x: rows.map((r) => r.class_name), y: rows.map((r) => r.candidate) }],
          { title: { text: "Per-class recall, promotion #" + gated.promotion_id + " (" + gated.status + ")" },
            barmode: "group", height: 320, margin: { t: 50, r: 10, b: 40, l: 50 },
            xaxis: { type: "category" }, yaxis: { range: [0, 1], title: { text: "recall" } } }, { displayModeBar: false });
      }
    }
  }
  async function load() {
    const page = await api("/models?limit=" + PAGE + "&offset=" + offset);
    const tbody = document.querySelector("#models tbody");
    tbody.replaceChildren(...page.items.map((m) => el("tr", { "data-name": m.name },
      el("td", {}, el("code", {}, m.name)), el("td", {}, m.description || ""),
      el("td", { class: "inputs" }, inputs(m.contract)),
      el("td", { class: "num" }, m.contract ? m.contract.class_names.length : "–"),
      el("td", { class: "versions" }, ...m.versions.flatMap((v, i) => [i ? ", " : "",
        el("a", { href: "/ui/experiments/" + v.experiment_id, "data-version": v.version,
                  title: "experiment #" + v.experiment_id }, "v" + v.version)])),
      el("td", { class: "aliases" }, ...Object.keys(m.aliases).flatMap((a, i) => [i ? ", " : "",
        el("a", { href: "#", "data-alias": a, onclick: (e) => { e.preventDefault(); alias(m, a).catch((x) => corel.flash(x.message)); } },
          a + " → v" + m.aliases[a] + (m.protected_aliases.includes(a) ? " 🔒" : ""))])),
      el("td", { class: "gate-rows" }, m.eval_dataset_id == null ? "the test split"
        : el("a", { href: "/ui/datasets", title: "PATCH /models/" + m.name + " sets it" }, "upload #" + m.eval_dataset_id)),
      el("td", { class: "owner" }, corel.owner(m.owner)),
      el("td", { class: "muted" }, corel.when(m.created_at)),
      el("td", {}, el("button", { type: "button", class: "secondary", "data-action": "share", onclick: () => share(m) }, "Share…")))));
    if (!page.items.length) tbody.append(el("tr", {}, el("td", { colspan: 10, class: "muted" }, "No model yet.")));
    corel.pager(page, PAGE, offset, (o) => { offset = o; load().catch((e) => corel.flash(e.message)); });
  }
  await load();
};
