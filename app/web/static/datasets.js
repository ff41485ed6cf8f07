// Uploaded datasets: the list with their owners, and each one's share control.
"use strict";

corel.pages.datasets = async function () {
  const { api, el } = corel;
  const PAGE = 50;
  let offset = 0;
  function share(d) {
    document.getElementById("share-card").hidden = false;
    document.getElementById("share-title").textContent = "Sharing upload #" + d.id + " (" + d.filename + ")";
    const box = document.getElementById("share");
    box.dataset.id = d.id;
    return corel.shareControl(box, "dataset", d.id);
  }
  async function load() {
    const page = await api("/datasets?limit=" + PAGE + "&offset=" + offset);
    const tbody = document.querySelector("#datasets tbody");
    tbody.replaceChildren(...page.items.map((d) => el("tr", { "data-id": d.id },
      el("td", {}, "#" + d.id), el("td", {}, d.filename), el("td", {}, d.kind),
      el("td", { class: "num" }, d.summary.n === undefined ? "–" : d.summary.n),
      el("td", { class: "num" }, d.summary.num_classes === undefined ? "–" : d.summary.num_classes),
      el("td", { class: "num" }, d.size),
      el("td", { class: "owner" }, corel.owner(d.owner)),
      el("td", { class: "muted" }, corel.when(d.created_at)),
      el("td", {}, el("button", { type: "button", class: "secondary", "data-action": "share", onclick: () => share(d) }, "Share…")))));
    if (!page.items.length) tbody.append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No upload yet.")));
    corel.pager(page, PAGE, offset, (o) => { offset = o; load().catch((e) => corel.flash(e.message)); });
  }
  await load();
};
