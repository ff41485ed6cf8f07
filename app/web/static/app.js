// corel dashboard: what every page shares. Plain JavaScript, no build step.
"use strict";

const corel = (() => {
  const TOKEN_KEY = "corel-api-token";
  let tokenWaiters = null;

  function token() { return sessionStorage.getItem(TOKEN_KEY); }

  function authHeaders(extra) {
    const h = Object.assign({}, extra || {});
    const t = token();
    if (t) h["Authorization"] = "Bearer " + t;
    return h;
  }

  // Ask once for the token; every request that met a 401 meanwhile waits for the answer.
  function askToken(message) {
    if (tokenWaiters) return new Promise((resolve) => tokenWaiters.push(resolve));
    tokenWaiters = [];
    const dialog = document.getElementById("token-dialog");
    const input = document.getElementById("token-input");
    document.getElementById("token-error").textContent = message || "";
    input.value = "";
    return new Promise((resolve) => {
      const form = document.getElementById("token-form");
      form.onsubmit = (ev) => {
        ev.preventDefault();
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        dialog.close();
        const waiting = tokenWaiters;
        tokenWaiters = null;
        resolve();
        waiting.forEach((r) => r());
      };
      dialog.showModal();
    });
  }

  class ApiError extends Error {
    constructor(status, body) {
      super((body && body.detail) || ("HTTP " + status));
      this.status = status;
      this.body = body || {};
    }
  }

  // fetch() against the API: the bearer token when there is one, JSON in and out,
  // the API's own error sentence in the thrown error.
  async function api(path, opts) {
    opts = opts || {};
    for (let attempt = 0; attempt < 4; attempt++) {
      const headers = authHeaders(opts.headers);
      let body = opts.body;
      if (opts.json !== undefined) {
        headers["Content-Type"] = "application/json";
        body = JSON.stringify(opts.json);
      }
      const r = await fetch(path, { method: opts.method || "GET", headers, body });
      if (r.status === 401) {
        const b = await r.json().catch(() => ({}));
        await askToken(token() ? "That token was refused: " + (b.detail || "") : "");
        continue;
      }
      if (opts.raw) {
        if (!r.ok) throw new ApiError(r.status, await r.json().catch(() => ({})));
        return r;
      }
      const text = await r.text();
      let data = null;
      try { data = text ? JSON.parse(text) : null; } catch (e) { data = { detail: text }; }
      if (!r.ok) throw new ApiError(r.status, data);
      return data;
    }
    throw new ApiError(401, { detail: "no valid token" });
  }

  // Server-sent events read with fetch(), so that the bearer header goes along
  // (EventSource cannot send one). Reconnects with Last-Event-ID until the server
  // ends the stream after the final status.
  function stream(path, onEvent) {
    let lastId = null;
    let stopped = false;
    const controller = { stop() { stopped = true; if (this.abort) this.abort.abort(); } };
    async function run() {
      while (!stopped) {
        controller.abort = new AbortController();
        let ended = false;
        try {
          const headers = authHeaders({ Accept: "text/event-stream" });
          if (lastId) headers["Last-Event-ID"] = lastId;
          const r = await fetch(path, { headers, signal: controller.abort.signal });
          if (r.status === 401) { await askToken(""); continue; }
          if (!r.ok || !r.body) { await sleep(3000); continue; }
          const reader = r.body.getReader();
          const decoder = new TextDecoder();
          let buf = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) { ended = true; break; }
            buf += decoder.decode(value, { stream: true });
            let cut;
            while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
              const block = buf.slice(0, cut);
              buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
              const ev = { event: "message", data: "", id: null };
              for (const line of block.split(/\r?\n/)) {
                if (!line || line.startsWith(":")) continue;
                const i = line.indexOf(":");
                const field = i < 0 ? line : line.slice(0, i);
                const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
                if (field === "event") ev.event = val;
                else if (field === "data") ev.data += (ev.data ? "\n" : "") + val;
                else if (field === "id") ev.id = val;
              }
              if (ev.id) lastId = ev.id;
              if (ev.data) {
                try { onEvent(ev.event, JSON.parse(ev.data)); } catch (e) { console.error(e); }
              }
            }
          }
        } catch (e) {
          if (stopped) return;
        }
        if (ended) return;  // the server closed it: the run is over
        await sleep(1000);
      }
    }
    run();
    return controller;
  }

  function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "html") e.innerHTML = v;
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  // Declared once, in corel/loss_catalog.py; the page carries them (base.html).
  const LOSSES = window.COREL_LOSSES || {};
  const LOSS_NAMES = Object.fromEntries(Object.entries(LOSSES).map(([name, d]) => [name, d.short]));
  const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                   "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39",
                   "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363"];

  function pct(x, digits) { return x === null || x === undefined ? "–" : (100 * x).toFixed(digits === undefined ? 2 : digits); }
  function num(x, digits) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits === undefined ? 3 : digits); }
  function lossLabel(spec) {
    const name = LOSS_NAMES[spec.loss] || spec.loss;
    return LOSSES[spec.loss] && !LOSSES[spec.loss].lam ? name : name + " λ " + spec.lam;
  }
  // Pretrained encoders' display names, declared in corel/encoder_catalog.py (base.html).
  const ENCODERS = window.COREL_ENCODERS || {};
  function modelLabel(spec) {
    if (!spec.encoder) return spec.model || "ffnn";
    const name = ENCODERS[spec.encoder] || spec.encoder;
    return name + ", " + (spec.encoder_mode || "frozen");
  }
  function badge(status) { return el("span", { class: "badge " + status, "data-status": status }, status); }
  function progressBar(exp) {
    const done = exp.current_epoch || 0, total = exp.epochs_total || 1;
    return el("div", { class: "progress " + exp.status, role: "progressbar",
      "aria-valuenow": done, "aria-valuemax": total },
      el("i", {}, el("span", { style: "width:" + Math.round((100 * done) / total) + "%" })),
      el("em", {}, "epoch " + done + " of " + total));
  }
  function flash(message, ok) {
    const f = document.getElementById("flash");
    f.textContent = message;
    f.className = "flash" + (ok ? " ok" : "");
    f.hidden = !message;
  }
  function query() { return new URLSearchParams(location.search); }
  const FINISHED = ["succeeded", "failed", "cancelled", "pruned"];

  // The pager under a list: "a–b of n", and Previous / Next calling go(new offset).
  function pager(page, size, offset, go) {
    document.getElementById("page-info").textContent = page.total
      ? (offset + 1) + "–" + (offset + page.items.length) + " of " + page.total : "";
    const prev = document.getElementById("prev"), next = document.getElementById("next");
    prev.disabled = offset === 0;
    next.disabled = offset + size >= page.total;
    prev.onclick = () => go(Math.max(0, offset - size));
    next.onclick = () => go(offset + size);
  }

  // A row's owner as the API gives it ({id, name} or null: made with no users, or by the
  // bootstrap admin).
  // "unowned": users can be handed such rows with `corel users adopt`.
  function owner(o) { return o ? o.name : "unowned"; }

  // A timestamp of the API (ISO 8601 with its offset) in the browser's own zone, the same
  // way on every page. One without an offset (an API older than this page) is UTC, as
  // the service writes every time.
  function when(iso) {
    if (!iso) return "–";
    const zoned = /([zZ]|[+-]\d\d:?\d\d)$/.test(iso) ? iso : iso + "Z";
    return new Date(zoned).toLocaleString(undefined, {
      year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }

  // Who the token is (GET /me): its name and scope in the header; the admin pages' links
  // shown only to an admin. "Change token" asks for another one.
  async function whoami() {
    const me = await api("/me");
    document.querySelectorAll("[data-admin-only]").forEach((a) => { a.hidden = !me.admin; });
    const who = document.getElementById("whoami");
    who.replaceChildren(me.name + " · " + me.scope,
      el("button", { type: "button", class: "link", id: "change-token",
        onclick: async () => { await askToken(""); location.reload(); } }, "change token"));
    who.hidden = false;
    return me;
  }

  // Sharing a row (an experiment, a sweep, an upload) through its /shares routes: who has
  // it, share it with a user id for reading or writing, remove a share, make it public.
  const SHARE_PATHS = { experiment: "/experiments/", sweep: "/sweeps/", dataset: "/datasets/", model: "/models/" };
  function shareControl(box, kind, id) {
    const base = SHARE_PATHS[kind] + id + "/shares";
    const note = el("p", { class: "error share-error" });
    async function change(opts) {
      note.textContent = "";
      try { render(await api(base + (opts.path || ""), opts)); }
      catch (e) { note.textContent = e.message; }
    }
    function render(state) {
      const user = el("input", { type: "number", min: 1, name: "user_id", placeholder: "user id", class: "share-user" });
      const accessSel = el("select", { name: "access", class: "share-access" },
        el("option", { value: "read" }, "read"), el("option", { value: "write" }, "write"));
      const list = el("ul", { class: "shares" }, ...state.shares.map((s) => el("li", { "data-user": s.user_id },
        "user " + s.user_id + ": " + s.access + " ",
        el("button", { type: "button", class: "link danger", "data-action": "unshare",
          onclick: () => change({ method: "DELETE", path: "/" + s.id }) }, "remove"))));
      if (!state.shares.length) list.append(el("li", { class: "muted" }, "Not shared with anyone."));
      box.replaceChildren(
        el("p", { class: "muted" }, "Owner: " + (state.owner_id === null ? "none (made with no users or by the admin token)" : "user " + state.owner_id) +
          ". " + (state.public ? "Readable by every user." : "Private to its owner and those below.")),
        list,
        el("form", { class: "toolbar share-form", onsubmit: (ev) => {
          ev.preventDefault();
          if (!user.value) { note.textContent = "Give the id of the user to share with."; return; }
          change({ method: "POST", json: { user_id: Number(user.value), access: accessSel.value } });
        } }, el("label", {}, "User id", user), el("label", {}, "Access", accessSel),
          el("button", { type: "submit", class: "share-add" }, "Share"),
          el("span", { style: "flex:1" }),
          el("button", { type: "button", class: "secondary share-public", "data-public": String(state.public),
            onclick: () => change({ method: "POST", json: { public: !state.public } }) },
            state.public ? "Make private" : "Make public")),
        note);
    }
    return api(base).then(render).catch((e) => { box.replaceChildren(el("p", { class: "muted" }, e.message)); });
  }

  const pages = {};
  document.addEventListener("DOMContentLoaded", () => {
    const page = document.body.dataset.page;
    whoami().catch(() => {});
    if (pages[page]) pages[page]().catch((e) => flash(e.message));
    // A share control wherever a page asks for one (experiment, sweep).
    document.querySelectorAll("[data-share-kind]").forEach((box) =>
      shareControl(box, box.dataset.shareKind, Number(box.dataset.shareId)));
  });

  return { api, stream, el, pct, num, lossLabel, modelLabel, badge, progressBar, flash, query, pages,
           ApiError, COLOURS, LOSSES, LOSS_NAMES, FINISHED, sleep, owner, when, shareControl, pager };
})();
