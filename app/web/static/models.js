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
      el("td", { class: "owner" }, corel.owner(m.owner)),
      el("td", { class: "muted" }, corel.when(m.created_at)),
      el("td", {}, el("button", { type: "button", class: "secondary", "data-action": "share", onclick: () => share(m) }, "Share…")))));
    if (!page.items.length) tbody.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "No model yet.")));
    corel.pager(page, PAGE, offset, (o) => { offset = o; load().catch((e) => corel.flash(e.message)); });
  }
  await load();
};
