// The audit log (GET /audit, admins only): filters by user, action, resource; paged.
"use strict";

corel.pages.audit = async function () {
  const { api, el } = corel;
  const PAGE = 50;
  const form = document.getElementById("audit-filters");
  const FIELDS = ["user_id", "action", "resource", "resource_id"];
  const params = corel.query();
  let offset = Number(params.get("offset") || 0);
  const users = new Map((await api("/users")).map((u) => [u.id, u.name]));
  form.elements.user_id.append(...[...users].map(([id, name]) => el("option", { value: id }, name + " (#" + id + ")")));
  for (const name of FIELDS) if (params.get(name)) form.elements[name].value = params.get(name);
  function who(e) {
    if (e.user_id === null && (e.client || "").startsWith("cli ")) return el("span", { class: "muted" }, "the CLI");
    if (e.user_id === null) return el("span", { class: "muted" }, e.token_id === null ? "admin token / open" : "?");
    return users.get(e.user_id) || "user " + e.user_id;
  }
  async function load() {
    const q = new URLSearchParams({ limit: PAGE, offset });
    for (const name of FIELDS) if (form.elements[name].value) q.set(name, form.elements[name].value);
    history.replaceState(null, "", "/ui/audit?" + q.toString());
    const page = await api("/audit?" + q.toString());
    const tbody = document.querySelector("#audit tbody");
    tbody.replaceChildren(...page.items.map((e) => el("tr", { "data-id": e.id, "data-outcome": e.outcome },
      el("td", { class: "muted" }, corel.when(e.at)), el("td", { class: "user" }, who(e)),
      el("td", { class: "muted" }, e.client || "–"), el("td", {}, el("code", {}, e.action)),
      el("td", {}, e.resource ? e.resource + (e.resource_id ? " #" + e.resource_id : "") : "–"),
      el("td", {}, el("span", { class: "badge " + (e.outcome === "ok" ? "succeeded" : "failed") }, e.outcome)),
      el("td", { class: "num" }, e.status === null ? "–" : e.status), el("td", { class: "muted" }, e.detail || ""))));
    if (!page.items.length) tbody.append(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "No entry matches.")));
    corel.pager(page, PAGE, offset, (o) => { offset = o; load().catch((e) => corel.flash(e.message)); });
  }
  form.addEventListener("submit", (ev) => { ev.preventDefault(); offset = 0; load().catch((e) => corel.flash(e.message)); });
  await load();
};
