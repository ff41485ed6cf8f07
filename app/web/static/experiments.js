// The experiments table: filters, paging, live progress, cancel and delete.
"use strict";

corel.pages.experiments = async function () {
  const { api, el, pct, badge, progressBar, flash, stream, FINISHED, LOSS_NAMES } = corel;
  const PAGE = 25;
  const form = document.getElementById("filters");
  const tbody = document.querySelector("#experiments tbody");
  const params = corel.query();
  for (const name of ["status", "dataset", "loss"]) if (params.get(name)) form.elements[name].value = params.get(name);
  let offset = Number(params.get("offset") || 0);
  let streams = [];
  const selected = new Set();

  function row(e) {
    const spec = e.spec;
    const actions = el("td", {});
    if (!FINISHED.includes(e.status)) {
      actions.append(el("button", { class: "danger", "data-action": "cancel", onclick: () => act("cancel", e.id) }, "Cancel"));
    } else {
      actions.append(el("button", { class: "danger", "data-action": "delete", onclick: () => act("delete", e.id) }, "Delete"));
    }
    const box = el("input", { type: "checkbox", "aria-label": "select " + e.id, checked: selected.has(e.id) });
    box.addEventListener("change", () => { box.checked ? selected.add(e.id) : selected.delete(e.id); sync(); });
    return el("tr", { "data-id": e.id, "data-status": e.status },
      el("td", {}, box),
      el("td", {}, el("a", { href: "/ui/experiments/" + e.id }, "#" + e.id)),
      el("td", { class: "status" }, ...statusCell(e)),
      el("td", { class: "progress-cell" }, progressBar(e)),
      el("td", {}, spec.dataset), el("td", {}, corel.modelLabel(spec)),
      el("td", {}, LOSS_NAMES[spec.loss] || spec.loss),
      el("td", { class: "num" }, corel.LOSSES[spec.loss] && !corel.LOSSES[spec.loss].lam ? "–" : spec.lam),
      el("td", { class: "num best-val" }, pct(e.best_val_accuracy)),
      el("td", { class: "num test" }, pct(e.test_accuracy)),
      el("td", { class: "owner" }, corel.owner(e.owner)),
      el("td", { class: "muted" }, corel.when(e.created_at)),
      actions);
  }

  // A running row's phase under its badge (preparing data, computing features, storing
  // results, and how far), as its own page shows it.
  function statusCell(e) {
    const cell = [badge(e.status)];
    if (e.status === "running" && e.phase) {
      cell.push(el("div", { class: "row-phase muted", title: e.phase_detail || "" },
        e.phase + (e.phase_detail ? ": " + e.phase_detail : "")));
    }
    return cell;
  }

  function sync() {
    document.getElementById("compare-selected").disabled = selected.size < 2;
  }

  async function act(what, id) {
    try {
      if (what === "cancel") await api("/experiments/" + id + "/cancel", { method: "POST" });
      else {
        if (!confirm("Delete experiment " + id + " with its checkpoints and metrics?")) return;
        await api("/experiments/" + id, { method: "DELETE" });
      }
      flash((what === "cancel" ? "Cancelled" : "Deleted") + " experiment " + id, true);
      await load();
    } catch (e) { flash(e.message); }
  }

  function follow(exp) {
    // One stream per unfinished row on this page: the bar moves with each epoch.
    return stream("/experiments/" + exp.id + "/events", (kind, data) => {
      const tr = tbody.querySelector('tr[data-id="' + exp.id + '"]');
      if (!tr) return;
      if (kind === "epoch") {
        exp.current_epoch = data.epoch;
        if (data.is_best) exp.best_val_accuracy = data.val_accuracy;
      } else if (kind === "status") {
        Object.assign(exp, data);
      }
      if (FINISHED.includes(exp.status)) {
        api("/experiments/" + exp.id).then((fresh) => tr.replaceWith(row(fresh))).catch(() => {});
        return;
      }
      tr.dataset.status = exp.status;
      tr.querySelector(".status").replaceChildren(...statusCell(exp));
      tr.querySelector(".progress-cell").replaceChildren(progressBar(exp));
      tr.querySelector(".best-val").textContent = pct(exp.best_val_accuracy);
    });
  }

  async function load() {
    streams.forEach((s) => s.stop());
    streams = [];
    const q = new URLSearchParams({ limit: PAGE, offset });
    for (const name of ["status", "dataset", "loss"]) if (form.elements[name].value) q.set(name, form.elements[name].value);
    history.replaceState(null, "", "/?" + q.toString());
    const page = await api("/experiments?" + q.toString());
    tbody.replaceChildren(...page.items.map(row));
    if (!page.items.length) tbody.append(el("tr", {}, el("td", { colspan: 13, class: "muted" }, "No experiment matches.")));
    document.getElementById("page-info").textContent = page.total
      ? (offset + 1) + "–" + (offset + page.items.length) + " of " + page.total : "";
    document.getElementById("prev").disabled = offset === 0;
    document.getElementById("next").disabled = offset + PAGE >= page.total;
    streams = page.items.filter((e) => !FINISHED.includes(e.status)).slice(0, 20).map(follow);
    watched = page.items.filter((e) => !FINISHED.includes(e.status)).slice(0, 20);
  }

  // The events carry epochs and statuses, not phases: a running row before its first epoch
  // or after its last (where the phases are) reads its phase from its row, once a second.
  let watched = [];
  setInterval(async () => {
    for (const exp of watched) {
      if (exp.status !== "running" || (exp.current_epoch > 0 && exp.current_epoch < exp.epochs_total)) continue;
      try {
        const now = await api("/experiments/" + exp.id);
        Object.assign(exp, { phase: now.phase, phase_detail: now.phase_detail, status: now.status });
        const tr = tbody.querySelector('tr[data-id="' + exp.id + '"]');
        if (tr && !FINISHED.includes(now.status)) tr.querySelector(".status").replaceChildren(...statusCell(exp));
      } catch (e) { /* the next tick tries again */ }
    }
  }, 1000);

  form.addEventListener("change", () => { offset = 0; load().catch((e) => flash(e.message)); });
  document.getElementById("prev").onclick = () => { offset = Math.max(0, offset - PAGE); load(); };
  document.getElementById("next").onclick = () => { offset += PAGE; load(); };
  document.getElementById("compare-selected").onclick = () => {
    location.href = "/ui/compare?ids=" + [...selected].sort((a, b) => a - b).join(",");
  };
  await load();
};
