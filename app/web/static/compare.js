// Compare: overlaid curves and the side-by-side table of /experiments/compare.
"use strict";

corel.pages.compare = async function () {
  const { api, el, pct, num, lossLabel, COLOURS, flash } = corel;
  const wanted = (corel.query().get("ids") || "").split(",").map(Number).filter(Boolean);
  const recent = (await api("/experiments?status=succeeded&limit=100")).items;
  const known = new Set(recent.map((e) => e.id));
  for (const id of wanted) if (!known.has(id)) { try { recent.unshift(await api("/experiments/" + id)); } catch (e) { /* gone */ } }
  const choices = document.getElementById("choices");
  for (const e of recent) {
    choices.append(el("label", {}, el("input", { type: "checkbox", value: e.id, checked: wanted.includes(e.id) }),
      " #" + e.id + " " + lossLabel(e.spec) + ", " + e.spec.dataset + " (" + pct(e.test_accuracy) + "%)"));
  }
  if (!recent.length) choices.append(el("span", { class: "muted" }, "No succeeded experiment yet."));

  async function show(ids) {
    if (ids.length < 2) { flash("Pick at least two runs."); return; }
    flash("");
    history.replaceState(null, "", "/ui/compare?ids=" + ids.join(","));
    const [table, ...metrics] = await Promise.all([
      api("/experiments/compare?ids=" + ids.join(",")),
      ...ids.map((id) => api("/experiments/" + id + "/metrics"))]);
    const val = [], loss = [];
    ids.forEach((id, i) => {
      const m = metrics[i].items, colour = COLOURS[i % COLOURS.length];
      val.push({ x: m.map((r) => r.epoch), y: m.map((r) => r.val_accuracy), name: "#" + id, mode: "lines", line: { color: colour } });
      loss.push({ x: m.map((r) => r.epoch), y: m.map((r) => r.train_loss), name: "#" + id, mode: "lines", line: { color: colour } });
    });
    const layout = (y) => ({ margin: { t: 10, r: 10, b: 40, l: 55 }, xaxis: { title: { text: "epoch" } }, yaxis: { title: { text: y } }, legend: { orientation: "h", y: -0.2 } });
    document.getElementById("result").hidden = false;
    Plotly.react("val-curves", val, layout("validation accuracy"), { responsive: true, displaylogo: false });
    Plotly.react("loss-curves", loss, layout("train loss"), { responsive: true, displaylogo: false });
    const t = document.getElementById("compare-table");
    const fmt = (col, v) => {
      if (v === null || v === undefined) return "–";
      if (col === "test_accuracy" || col.endsWith("accuracy")) return pct(v);
      if (typeof v === "number" && !Number.isInteger(v)) return num(v);
      return String(v);
    };
    t.querySelector("thead").replaceChildren(el("tr", {}, ...table.columns.map((c) => el("th", {}, c.replaceAll("_", " ")))));
    t.querySelector("tbody").replaceChildren(...table.rows.map((r) => el("tr", { "data-id": r.id },
      ...table.columns.map((c) => el("td", { class: typeof r[c] === "number" ? "num" : "" },
        c === "id" ? el("a", { href: "/ui/experiments/" + r.id }, "#" + r.id) : fmt(c, r[c]))))));
  }

  document.getElementById("go").onclick = () => show([...choices.querySelectorAll("input:checked")].map((b) => Number(b.value)))
    .catch((e) => flash(e.message));
  if (wanted.length >= 2) await show(wanted);
};
