/* Harvester page in the Airflow UI: a small router, API calls and rendering.
   Safety rule: nothing from the API is ever parsed as markup. Every node is made with
   document.createElement and every text with textContent (see h()); links to portal URLs go
   through safeUrl() so only http(s) is ever an href. No innerHTML, no eval, no inline handlers. */
(function () {
  "use strict";

  // "/harvester" (or "<prefix>/harvester" when Airflow is served under a sub-path)
  const BASE = (location.pathname.match(/^(.*?\/harvester)(?:\/|$)/) || [null, "/harvester"])[1];
  const ROOT = BASE.slice(0, -"/harvester".length) || "/";
  const app = document.getElementById("app");
  let me = { user: null, can_review: false };
  let renderSeq = 0;
  let flash = null; // a status message shown once after the next render

  const CHANGE_TYPES = ["new", "content_updated", "title_changed", "date_changed", "metadata_updated", "removed", "restored"];
  const PAGE = 25;

  // -- DOM helpers ----------------------------------------------------------------------------

  // h("a", {href, class, "data-test", on: {click}}, child, ...) and append(node, children): dom.js
  const { h, append } = window.HarvesterDom;

  /* Replace a node's children (null/false children are skipped, text becomes text nodes). */
  function show(node, ...children) {
    node.replaceChildren();
    return append(node, children);
  }

  /* Only http(s) URLs from portals become links; anything else (javascript:, data:...) is text. */
  function safeUrl(url) {
    if (typeof url !== "string" || !url) return null;
    try {
      const parsed = new URL(url, location.href);
      return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
    } catch (_) {
      return null;
    }
  }

  function extLink(url, text, attrs) {
    const safe = safeUrl(url);
    const label = text === undefined ? url : text;
    if (!safe) return h("span", { class: "muted" }, label || "—");
    return h("a", { href: safe, target: "_blank", rel: "noopener noreferrer", ...(attrs || {}) }, label);
  }

  const enc = encodeURIComponent;
  const portalHref = (name) => `${BASE}/portals/${enc(name)}`;
  const datasetHref = (portal, id) => `${BASE}/datasets/${enc(portal)}/${enc(id)}`;
  const runHref = (id) => `${BASE}/runs/${enc(id)}`;

  // -- formatting -----------------------------------------------------------------------------

  const pad = (n) => String(n).padStart(2, "0");
  function fmtDate(iso, withSeconds) {
    if (!iso) return "—";
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    const s = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
    return withSeconds ? `${s}:${pad(d.getSeconds())}` : s;
  }
  function shortDate(iso) {
    const d = new Date(iso);
    if (!iso || Number.isNaN(d.getTime())) return "?";
    return `${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }
  function span(seconds) {
    const s = Math.abs(seconds);
    if (s < 60) return `${Math.round(s)}s`;
    if (s < 3600) return `${Math.round(s / 60)}m`;
    if (s < 86400 * 2) return `${Math.round(s / 3600)}h`;
    return `${Math.round(s / 86400)}d`;
  }
  const ago = (seconds) => (typeof seconds === "number" ? (seconds < 5 ? "just now" : `${span(seconds)} ago`) : "");
  function relative(iso) {
    const d = new Date(iso);
    if (!iso || Number.isNaN(d.getTime())) return "";
    const diff = (d.getTime() - Date.now()) / 1000;
    return diff >= 0 ? `in ${span(diff)}` : `${span(diff)} ago`;
  }
  function fmtDuration(seconds) {
    if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "—";
    if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)}s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${pad(Math.round(seconds % 60))}s`;
    return `${Math.floor(seconds / 3600)}h ${pad(Math.round((seconds % 3600) / 60))}m`;
  }
  const fmtNum = (v) => (typeof v === "number" ? v.toLocaleString() : v === null || v === undefined ? "—" : String(v));
  function fmtBytes(v) {
    if (typeof v !== "number") return "—";
    const units = ["B", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (v >= 1000 && i < units.length - 1) { v /= 1000; i += 1; }
    return `${v.toFixed(i && v < 10 ? 1 : 0)} ${units[i]}`;
  }
  /* any value from the API as plain text */
  function asText(v) {
    if (v === null || v === undefined) return "(none)";
    if (typeof v === "string") return v;
    return JSON.stringify(v, null, typeof v === "object" ? 2 : 0);
  }
  function clip(text, max) {
    return text.length > max ? `${text.slice(0, max - 1)}…` : text;
  }

  const time = (iso) => h("time", { datetime: iso || null, title: iso || null }, fmtDate(iso));
  const pill = (text, kind, attrs) => h("span", { class: `pill pill-${kind || "neutral"}`, ...(attrs || {}) }, text);
  const STATUS_KIND = { success: "ok", succeeded: "ok", completed: "ok", running: "info", queued: "info",
    failed: "bad", error: "bad", abandoned: "bad", degraded: "warn", partial: "warn", skipped: "warn" };
  const statusPill = (status) => (status ? pill(status, STATUS_KIND[String(status).toLowerCase()] || "neutral") : h("span", { class: "muted" }, "—"));
  const BREAKER_KIND = { closed: "ok", open: "bad", half_open: "warn", "half-open": "warn" };

  // -- API ------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function detailOf(data, fallback) {
    if (data && typeof data === "object") {
      const d = data.detail !== undefined ? data.detail : data.message !== undefined ? data.message : data.error;
      if (typeof d === "string") return d;
      if (Array.isArray(d)) {
        return d.map((e) => (e && e.msg ? `${(e.loc || []).slice(1).join(".") || "request"}: ${e.msg}` : asText(e))).join("; ");
      }
      if (d !== undefined) return asText(d);
    }
    return fallback;
  }

  async function api(path, params, options) {
    const url = new URL(`${BASE}/api${path}`, location.origin);
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== null && value !== undefined && value !== "") url.searchParams.set(key, String(value));
    }
    const init = { credentials: "same-origin", headers: { Accept: "application/json" }, method: "GET" };
    if (options && options.body !== undefined) {
      init.method = options.method || "POST";
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    let response;
    try {
      response = await fetch(url.pathname + url.search, init);
    } catch (err) {
      throw new ApiError(0, `Could not reach the server (${err.message})`);
    }
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = null;
    }
    if (!response.ok) throw new ApiError(response.status, detailOf(data, clip(text || response.statusText || "", 300)));
    return data;
  }

  const STATUS_TEXT = {
    0: "Network error", 400: "Bad request", 401: "Sign in to Airflow", 403: "You do not have access",
    404: "Not found", 409: "Conflict", 422: "Invalid request", 500: "Server error", 502: "Bad gateway",
    503: "Service unavailable", 504: "Gateway timeout",
  };

  function errorBox(err) {
    const status = err && typeof err.status === "number" ? err.status : null;
    const title = status === null ? "Error" : STATUS_TEXT[status] || (status >= 500 ? "Server error" : "Request failed");
    const detail = err && err.message && err.message !== title ? err.message : "";
    return h("div", { class: "error", "data-test": "error", role: "alert" },
      h("strong", {}, status ? `${status} ${title}` : title),
      detail ? `: ${detail}` : "",
      status === 401 ? [" ", h("a", { href: ROOT, target: "_top" }, "Open Airflow to sign in")] : null);
  }

  // -- page scaffolding -----------------------------------------------------------------------

  function query() {
    return new URLSearchParams(location.search);
  }
  /* Put page state (filters, offsets) into the address bar, then re-render the page. */
  function navigate(params, replace) {
    const search = new URLSearchParams();
    for (const [key, value] of Object.entries(params)) {
      if (value !== null && value !== undefined && value !== "") search.set(key, String(value));
    }
    const qs = search.toString();
    const url = location.pathname + (qs ? `?${qs}` : "");
    if (replace) history.replaceState(null, "", url);
    else history.pushState(null, "", url);
    render();
  }

  function pager(total, limit, offset, onPage) {
    const first = total ? offset + 1 : 0;
    const last = Math.min(offset + limit, total);
    return h("div", { class: "pager", "data-test": "pager" },
      h("span", { class: "muted" }, total ? `${first}–${last} of ${fmtNum(total)}` : "Nothing to show"),
      h("button", { type: "button", class: "btn", "data-test": "prev", disabled: offset <= 0,
        on: { click: () => onPage(Math.max(0, offset - limit)) } }, "‹ Prev"),
      h("button", { type: "button", class: "btn", "data-test": "next", disabled: offset + limit >= total,
        on: { click: () => onPage(offset + limit) } }, "Next ›"));
  }

  function table(attrs, headers, rows) {
    return h("div", { class: "table-wrap" },
      h("table", attrs,
        h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col", class: x.cls || null, title: x.title || null }, x.text === undefined ? x : x.text)))),
        h("tbody", {}, rows)));
  }

  function portalSelect(portals, value, attrs) {
    return h("select", attrs,
      h("option", { value: "" }, "All portals"),
      portals.map((p) => h("option", { value: p.name, selected: p.name === value }, p.name)));
  }

  async function portalList() {
    try {
      return (await api("/portals", { limit: 500 })).items || [];
    } catch (_) {
      return [];
    }
  }

  // -- Portals --------------------------------------------------------------------------------

  function breakerCell(breaker) {
    if (!breaker || !breaker.state) return h("span", { class: "muted" }, "—");
    const details = Object.entries(breaker).filter(([k, v]) => k !== "state" && v !== null)
      .map(([k, v]) => `${k}: ${asText(v)}`).join("\n");
    return pill(String(breaker.state).replace("_", "-"), BREAKER_KIND[breaker.state] || "neutral",
      { title: details || null, "data-test": "breaker" });
  }

  function lastRunCell(run) {
    if (!run) return h("span", { class: "muted" }, "never run");
    const notes = [];
    if (run.skipped) notes.push(`${fmtNum(run.skipped)} skipped`);
    if (run.removals_withheld) notes.push(`${fmtNum(run.removals_withheld)} removals withheld`);
    return h("div", {},
      h("div", {}, h("span", { class: "mode" }, run.mode || "?"), " ",
        run.run_id !== undefined && run.run_id !== null
          ? h("a", { href: runHref(run.run_id), class: "plain-link", title: `Run ${run.run_id}: its report`, "data-test": "last-run-link" }, statusPill(run.status))
          : statusPill(run.status)),
      h("div", { class: "small muted" }, fmtDate(run.started_at), run.duration_seconds !== null && run.duration_seconds !== undefined ? ` · ${fmtDuration(run.duration_seconds)}` : ""),
      notes.length ? h("div", { class: "small warn-text" }, notes.join(", ")) : null,
      run.error ? h("div", { class: "small bad-text", title: run.error }, clip(String(run.error), 120)) : null);
  }

  async function pagePortals(alive) {
    const [portals, queue] = await Promise.all([
      api("/portals", { limit: 500 }),
      api("/changes", { queue: true, limit: 1 }).catch(() => null),
    ]);
    if (!alive()) return;
    const items = portals.items || [];
    const configured = items.filter((p) => p.configured !== false);
    const unlisted = items.filter((p) => p.configured === false);
    const nameCell = (p) => h("td", {},
      h("a", { href: portalHref(p.name), class: "strong" }, p.name),
      p.badge ? [" ", h("span", { class: `badge badge-${p.badge === "failed" ? "failed" : "degraded"}`, "data-test": "badge" }, p.badge)] : null,
      p.enabled === false ? [" ", pill("disabled", "neutral")] : null,
      p.configured === false ? [" ", pill("not in portals.yaml", "neutral", { "data-test": "not-configured" })] : null,
      p.url ? h("div", { class: "small" }, extLink(p.url, clip(String(p.url), 60))) : null);
    const syncCell = (p) => h("td", {}, p.last_successful_sync ? [time(p.last_successful_sync), h("div", { class: "small muted" }, ago(p.last_sync_age_seconds))] : h("span", { class: "muted" }, "never"));
    const rows = configured.map((p) => h("tr", { "data-test": "portal-row", "data-portal": p.name },
      nameCell(p),
      h("td", { class: "num" }, fmtNum(p.live_datasets)),
      syncCell(p),
      h("td", {}, lastRunCell(p.last_run)),
      h("td", {}, p.next_run ? [time(p.next_run), h("div", { class: "small muted" }, relative(p.next_run))] : h("span", { class: "muted" }, p.schedule ? "—" : "not scheduled")),
      h("td", { class: "num" }, fmtNum(p.pending_embeddings)),
      h("td", {}, breakerCell(p.breaker))));
    // Portals only the harvester database knows: their state, no schedule, no Airflow links.
    const unlistedRows = unlisted.map((p) => h("tr", { "data-test": "portal-row", "data-portal": p.name, "data-configured": "false" },
      nameCell(p),
      h("td", { class: "num" }, fmtNum(p.live_datasets)),
      syncCell(p),
      h("td", {}, lastRunCell(p.last_run)),
      h("td", { class: "num" }, fmtNum(p.pending_embeddings))));
    const queueCount = queue && typeof queue.total === "number" ? queue.total : null;
    show(app, 
      h("div", { class: "page-head" },
        h("h1", {}, "Portals"),
        h("a", { class: "queue-link", href: `${BASE}/changes`, "data-test": "queue-link" },
          "Review queue", h("span", { class: `count${queueCount ? " count-hot" : ""}`, "data-test": "queue-count" }, queueCount === null ? "?" : fmtNum(queueCount)))),
      configured.length
        ? table({ class: "grid", "data-test": "portals-table" },
          ["Portal", { text: "Live datasets", cls: "num" }, "Last successful sync", "Last run", "Next run", { text: "Pending embeddings", cls: "num" }, "Breaker"], rows)
        : h("p", { class: "empty", "data-test": "portals-table" }, "No portals configured."),
      unlisted.length
        ? h("section", { class: "card", "data-test": "unlisted-portals" },
          h("h2", {}, "Known only to the database"),
          h("p", { class: "small muted" }, "Not in portals.yaml: harvested from the CLI with another portals file, or removed from ",
            "portals.yaml. Their runs, changes and datasets are kept; Airflow does not harvest them."),
          table({ class: "grid", "data-test": "unlisted-portals-table" },
            ["Portal", { text: "Live datasets", cls: "num" }, "Last successful sync", "Last run", { text: "Pending embeddings", cls: "num" }], unlistedRows))
        : null);
  }

  // -- Runs of one portal ---------------------------------------------------------------------

  const RUN_SERIES = [
    { key: "created", name: "created", color: "#16a34a" },
    { key: "updated", name: "updated", color: "#2563eb" },
    { key: "removed", name: "removed", color: "#7c3aed" },
    { key: "failed", name: "failed", color: "#dc2626" },
    { key: "skipped", name: "skipped", color: "#d97706" },
  ];

  const REPORT_SERIES = [
    { key: "errors", name: "record errors", color: "#991b1b" },
    { key: "warnings", name: "record warnings", color: "#ca8a04", dash: "5 3" },
  ];

  function runCharts(runs) {
    const ordered = runs.slice().reverse(); // oldest left, newest right
    const labels = ordered.map((r) => shortDate(r.started_at));
    const titles = ordered.map((r) => `${fmtDate(r.started_at)} · ${r.mode || "?"} · ${r.status || "?"}`);
    const stat = (r, key) => (r.stats && typeof r.stats[key] === "number" ? r.stats[key] : null);
    const durMax = Math.max(0, ...ordered.map((r) => r.duration_seconds || 0));
    const unit = durMax >= 7200 ? ["h", 3600] : durMax >= 120 ? ["min", 60] : ["s", 1];
    const width = Math.max(480, Math.min(1400, app.clientWidth - 82));
    const Charts = window.HarvesterCharts;
    if (!Charts) return h("p", { class: "error" }, "charts.js did not load");
    const reported = (r, key) => (typeof r[key] === "number" ? r[key] : null);
    const counts = Charts.combo({
      labels, titles, width, height: 260, stacked: true, xLabel: "run started", ariaLabel: "Datasets, errors and warnings per run",
      bars: RUN_SERIES.map((s) => ({ name: s.name, color: s.color, values: ordered.map((r) => stat(r, s.key)) })),
      barAxis: { label: "datasets", format: fmtNum },
      // the run's report (its page): record errors and warnings, on their own axis
      lines: REPORT_SERIES.map((s) => ({ name: s.name, color: s.color, dash: s.dash, values: ordered.map((r) => reported(r, s.key)) })),
      lineAxis: { label: "errors / warnings", integer: true, format: fmtNum },
      empty: "No runs yet",
    });
    const durations = Charts.combo({
      labels, titles, width, height: 260, stacked: false, xLabel: "run started", ariaLabel: "Duration and embeddings per run",
      bars: [
        { name: "embedding requests", color: "#0ea5e9", values: ordered.map((r) => stat(r, "embedding_requests")) },
        { name: "vectors reused", color: "#a3a3a3", values: ordered.map((r) => stat(r, "embeddings_reused")) },
      ],
      barAxis: { label: "embeddings", format: fmtNum },
      lines: [{ name: "duration", color: "#f97316", values: ordered.map((r) => (typeof r.duration_seconds === "number" ? r.duration_seconds : null)) }],
      lineAxis: { label: `duration (${unit[0]})`, divisor: unit[1], integer: false, format: fmtDuration, tick: (v) => fmtNum(v) },
      empty: "No runs yet",
    });
    counts.querySelector("svg").setAttribute("data-test", "runs-chart");
    durations.querySelector("svg").setAttribute("data-test", "duration-chart");
    return h("div", { class: "charts" },
      h("section", { class: "card" }, h("h2", {}, runs.length ? `Datasets, errors and warnings per run (last ${runs.length})` : "Datasets per run"), counts),
      h("section", { class: "card" }, h("h2", {}, "Duration and embeddings per run"), durations));
  }

  const EMBEDDED_HELP = "Texts embedded: texts this run sent to the embedding provider (not the requests, " +
    "which batch many texts) / vectors reused: new or changed datasets whose text already had a vector " +
    "(stored before this run, e.g. by another portal's), so not embedded again";

  function runRow(r) {
    const s = r.stats || {};
    const links = [];
    if (safeUrl(r.dag_run_url)) links.push(h("a", { href: safeUrl(r.dag_run_url), target: "_top", "data-test": "dag-run-link" }, "DAG run"));
    if (safeUrl(r.logs_url)) links.push(h("a", { href: safeUrl(r.logs_url), target: "_top", "data-test": "logs-link" }, "logs"));
    const note = r.error || r.reconcile_reason;
    return h("tr", { "data-test": "run-row", "data-run-id": r.run_id },
      h("td", { class: "nowrap" }, h("a", { href: runHref(r.run_id), "data-test": "run-link", title: `Run ${r.run_id}: its report` }, time(r.started_at)),
        h("div", { class: "small muted ellipsis", title: r.dag_run_id || null }, r.dag_run_id || "")),
      h("td", {}, h("div", { class: "nowrap" }, h("span", { class: "mode" }, r.mode || "?"), " ",
        h("a", { href: runHref(r.run_id), class: "plain-link", "data-test": "run-status-link" }, statusPill(r.status))),
        note ? h("div", { class: `small ellipsis ${r.error ? "bad-text" : "muted"}`, title: note }, String(note)) : null),
      h("td", { class: "num" }, fmtDuration(r.duration_seconds)),
      h("td", { class: "num", title: `${fmtBytes(s.portal_bytes)} in ${fmtNum(s.portal_requests)} portal requests` }, fmtNum(s.fetched)),
      ["created", "updated", "unchanged", "removed", "failed", "skipped"].map((k) =>
        h("td", { class: `num${k === "failed" && s[k] ? " bad-text" : ""}${k === "skipped" && s[k] ? " warn-text" : ""}` }, fmtNum(s[k]))),
      h("td", { class: "num", "data-test": "run-embedded", title: `${fmtNum(s.embedded)} texts embedded in ${fmtNum(s.embedding_requests)} requests to the provider; ${fmtNum(s.embeddings_reused)} vectors reused` },
        `${fmtNum(s.embedded)} / ${fmtNum(s.embeddings_reused)}`),
      h("td", { class: "report-cell" }, reportLink(r)),
      h("td", { class: "links" }, links.length ? links : h("span", { class: "muted" }, "—")));
  }

  /* "2 errors · 5 warnings", a link to the run's report. */
  function reportLink(r) {
    const errors = typeof r.errors === "number" ? r.errors : 0;
    const warnings = typeof r.warnings === "number" ? r.warnings : 0;
    const parts = [];
    if (errors) parts.push(h("span", { class: "bad-text", "data-test": "run-errors" }, `${fmtNum(errors)} error${errors === 1 ? "" : "s"}`));
    if (warnings) parts.push(h("span", { class: "warn-text", "data-test": "run-warnings" }, `${fmtNum(warnings)} warning${warnings === 1 ? "" : "s"}`));
    return h("a", { href: runHref(r.run_id), "data-test": "run-report-link", class: "plain-link" },
      parts.length ? parts.flatMap((p, i) => (i ? [" · ", p] : [p])) : h("span", { class: "muted" }, "none"));
  }

  async function pageRuns(alive, name) {
    const offset = Math.max(0, parseInt(query().get("offset") || "0", 10) || 0);
    const [portal, chartRuns, tableRuns] = await Promise.all([
      api(`/portals/${enc(name)}`),
      api(`/portals/${enc(name)}/runs`, { limit: 50, offset: 0 }),
      api(`/portals/${enc(name)}/runs`, { limit: PAGE, offset }),
    ]);
    if (!alive()) return;
    const facts = [
      ["Live datasets", fmtNum(portal.live_datasets)],
      ["Last successful sync", portal.last_successful_sync ? `${fmtDate(portal.last_successful_sync)} (${ago(portal.last_sync_age_seconds)})` : "never"],
      ["Next run", portal.next_run ? `${fmtDate(portal.next_run)} (${relative(portal.next_run)})` : "—"],
      ["Schedule", portal.schedule || "—"],
      ["Pending embeddings", fmtNum(portal.pending_embeddings)],
      ["Breaker", breakerCell(portal.breaker)],
    ];
    show(app, 
      h("div", { class: "crumbs" }, h("a", { href: `${BASE}/` }, "Portals"), " / ", portal.name),
      h("div", { class: "page-head" },
        h("h1", {}, portal.name,
          portal.badge ? [" ", h("span", { class: `badge badge-${portal.badge === "failed" ? "failed" : "degraded"}`, "data-test": "badge" }, portal.badge)] : null),
        portal.url ? extLink(portal.url) : null),
      portal.configured === false ? h("p", { class: "note-box", "data-test": "not-configured" },
        "Not in portals.yaml: harvested from the CLI, or removed from portals.yaml. Its runs, changes and datasets ",
        "are kept in the harvester database; Airflow does not harvest it.") : null,
      h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v)))),
      duplicatesNote(portal.duplicates),
      portalActions(portal.name),
      runCharts(chartRuns.items || []),
      h("section", { class: "card" },
        h("h2", {}, "Runs"),
        table({ class: "grid", "data-test": "runs-table" },
          ["Started", "Run", { text: "Duration", cls: "num" }, { text: "Fetched", cls: "num" },
            { text: "Created", cls: "num" }, { text: "Updated", cls: "num" }, { text: "Unchanged", cls: "num" },
            { text: "Removed", cls: "num" }, { text: "Failed", cls: "num" }, { text: "Skipped", cls: "num" },
            { text: "Embedded / reused", cls: "num", title: EMBEDDED_HELP }, "Report", "Links"],
          (tableRuns.items || []).length ? tableRuns.items.map(runRow)
            : h("tr", {}, h("td", { colspan: 13, class: "muted" }, "No runs yet."))),
        pager(tableRuns.total || 0, PAGE, offset, (o) => navigate({ offset: o }))));
  }

  /* "N of its datasets are copies of X's" / "M of its datasets are copied by Y", one line each. */
  function duplicatesNote(dup) {
    if (!dup || (!(dup.copies_of || []).length && !(dup.copied_by || []).length)) return null;
    const its = (n) => `${fmtNum(n)} of its dataset${n === 1 ? " is a copy" : "s are copies"} of `;
    const by = (n) => `${fmtNum(n)} of its dataset${n === 1 ? " is" : "s are"} copied by `;
    return h("section", { class: "card duplicates-note", "data-test": "portal-duplicates" },
      h("h2", {}, "Same datasets on other portals"),
      h("ul", { class: "plain" },
        (dup.copies_of || []).map((c) => h("li", { "data-test": "copies-of" }, its(c.datasets), h("a", { href: portalHref(c.portal) }, c.portal), "'s")),
        (dup.copied_by || []).map((c) => h("li", { "data-test": "copied-by" }, by(c.datasets), h("a", { href: portalHref(c.portal) }, c.portal)))));
  }

  // -- One run and its report ------------------------------------------------------------------

  const SEVERITIES = [["", "All"], ["error", "Errors"], ["warning", "Warnings"]];
  const SEVERITY_KIND = { error: "bad", warning: "warn" };

  async function pageRun(alive, runId) {
    const q = query();
    const state = {
      severity: ["error", "warning"].includes(q.get("severity")) ? q.get("severity") : "",
      code: q.get("code") || "",
      offset: Math.max(0, parseInt(q.get("offset") || "0", 10) || 0),
    };
    const data = await api(`/runs/${enc(runId)}/outcomes`, { severity: state.severity, code: state.code, limit: PAGE, offset: state.offset });
    if (!alive()) return;
    const run = data.run || {};
    const counts = data.counts || { errors: 0, warnings: 0 };
    const groups = data.groups || [];
    const items = data.items || [];
    const go = (patch) => navigate({ ...state, ...patch });
    const portalName = run.portal || run.portal_url || "?";
    // a node lives in one place: a new link each time it is shown (a portal not in portals.yaml has its page too)
    const portalLink = () => h("a", { href: portalHref(portalName) }, portalName);
    const s = run.stats || {};

    const links = [];
    if (safeUrl(run.dag_run_url)) links.push(h("a", { href: safeUrl(run.dag_run_url), target: "_top", "data-test": "dag-run-link" }, "DAG run"));
    if (safeUrl(run.logs_url)) links.push(h("a", { href: safeUrl(run.logs_url), target: "_top", "data-test": "logs-link" }, "logs"));
    const facts = [
      ["Portal", [portalLink(), run.portal_configured ? null : h("span", { class: "small muted", "data-test": "not-configured" }, " (not in portals.yaml)")]],
      ["Mode", h("span", { class: "mode" }, run.mode || "?")],
      ["Status", statusPill(run.status)],
      ["Started", time(run.started_at)],
      ["Finished", run.finished_at ? time(run.finished_at) : "—"],
      ["Duration", fmtDuration(run.duration_seconds)],
      ["DAG run", run.dag_run_id ? [h("span", { class: "mono small" }, run.dag_run_id), links.length ? [" ", links.flatMap((l, i) => (i ? [" · ", l] : [l]))] : null] : h("span", { class: "muted" }, "— (the CLI)")],
    ];
    const STAT_ORDER = ["fetched", "created", "updated", "unchanged", "removed", "failed", "skipped", "removals_withheld",
      "embedded", "embedding_requests", "embeddings_reused", "portal_requests"];
    const statKeys = STAT_ORDER.filter((k) => k in s).concat(Object.keys(s).filter((k) => !STAT_ORDER.includes(k)).sort());

    const tab = (value, label) => h("button", { type: "button", role: "tab", class: `tab${state.severity === value ? " active" : ""}`,
      "aria-selected": state.severity === value ? "true" : "false", "data-test": `severity-${value || "all"}`,
      on: { click: () => go({ severity: value, code: "", offset: 0 }) } },
      label, value ? h("span", { class: "count" }, fmtNum(value === "error" ? counts.errors : counts.warnings)) : null);
    const csv = new URL(`${BASE}/api/runs/${enc(runId)}/outcomes.csv`, location.origin);
    if (state.severity) csv.searchParams.set("severity", state.severity);
    if (state.code) csv.searchParams.set("code", state.code);

    const groupRows = groups.map((g) => h("tr", { "data-test": "outcome-group", "data-code": g.code, "data-severity": g.severity },
      h("td", {}, pill(g.severity, SEVERITY_KIND[g.severity])),
      h("td", {}, h("button", { type: "button", class: "btn-link mono", title: "Show only these rows", "data-test": "group-code",
        on: { click: () => go({ code: g.code, offset: 0 }) } }, g.code),
        h("div", { class: "small muted" }, g.stage || "")),
      h("td", { class: "num", "data-test": "group-count" }, fmtNum(g.count)),
      h("td", { class: "examples", "data-test": "group-examples" }, (g.examples || []).map((x) => h("div", { class: "mono small ellipsis", title: x }, x))),
      h("td", { class: "message", "data-test": "group-message" }, g.message || "")));

    const recordCell = (row) => {
      const id = row.source_id;
      // a stored record (a warning) has a page; a failed one was not stored
      const label = id ? (row.severity === "warning"
        ? h("a", { href: datasetHref(portalName, id), class: "mono" }, id) : h("span", { class: "mono" }, id))
        : h("span", { class: "muted" }, "(no id)");
      return h("td", { class: "record-cell" }, h("div", { class: "small muted" }, row.position === null || row.position === undefined ? "" : `#${row.position}`), label);
    };
    const rowRows = items.map((row) => h("tr", { "data-test": "outcome-row", "data-code": row.code, "data-severity": row.severity },
      recordCell(row),
      h("td", {}, pill(row.severity, SEVERITY_KIND[row.severity]), h("div", { class: "mono small" }, row.code)),
      h("td", { class: "mono small" }, row.field || "—"),
      h("td", { class: "val-cell" }, row.value === null || row.value === undefined ? h("span", { class: "muted" }, "—") : h("span", { class: "mono small" }, row.value)),
      h("td", { class: "message", "data-test": "row-message" }, row.message || "")));

    const filterNote = state.code ? h("p", { class: "small", "data-test": "code-filter" }, "Showing reason ", h("span", { class: "mono strong" }, state.code), " only · ",
      h("button", { type: "button", class: "btn-link", on: { click: () => go({ code: "", offset: 0 }) } }, "show all reasons")) : null;

    show(app,
      h("div", { class: "crumbs" }, h("a", { href: `${BASE}/` }, "Portals"), " / ", portalLink(), " / ", `run ${run.run_id ?? runId}`),
      h("div", { class: "page-head" },
        h("h1", { "data-test": "run-title" }, `Run ${run.run_id ?? runId}`, " ", statusPill(run.status)),
        run.portal_url ? extLink(run.portal_url) : null),
      h("dl", { class: "facts", "data-test": "run-facts" }, facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v)))),
      run.error || run.reconcile_reason ? h("p", { class: `small ${run.error ? "bad-text" : "muted"}`, "data-test": "run-note" }, String(run.error || run.reconcile_reason)) : null,
      statKeys.length ? h("dl", { class: "facts stats", "data-test": "run-stats" },
        statKeys.map((k) => h("div", { "data-stat": k }, h("dt", {}, k.replace(/_/g, " ")), h("dd", { class: "num" }, typeof s[k] === "number" ? fmtNum(s[k]) : asText(s[k]))))) : null,
      h("section", { class: "card" },
        h("div", { class: "card-head" },
          h("h2", {}, "Report: what became of the records"),
          h("a", { href: csv.pathname + csv.search, download: `harvester-run-${run.run_id ?? runId}-outcomes.csv`, class: "btn", "data-test": "download-csv" }, "Download CSV")),
        h("p", { class: "small muted", "data-test": "run-counts" },
          `${fmtNum(counts.errors)} error${counts.errors === 1 ? "" : "s"} (records not stored) · ${fmtNum(counts.warnings)} warning${counts.warnings === 1 ? "" : "s"} (stored all the same)`),
        h("div", { class: "tabs", role: "tablist", "aria-label": "Severity", "data-test": "severity-filter" }, SEVERITIES.map(([v, l]) => tab(v, l))),
        groups.length
          ? table({ class: "grid outcomes", "data-test": "outcome-groups" },
            ["Severity", "Reason", { text: "Count", cls: "num" }, "Examples", "Message (first)"], groupRows)
          : h("p", { class: "empty", "data-test": "outcomes-empty" }, state.severity ? `No ${state.severity}s in this run.` : "Every record was taken as it is: nothing to report.")),
      h("section", { class: "card" },
        h("h2", {}, `Rows (${fmtNum(data.total || 0)})`),
        filterNote,
        items.length
          ? table({ class: "grid outcomes", "data-test": "outcome-rows" }, ["Record", "Reason", "Field", "Value", "Message"], rowRows)
          : h("p", { class: "empty" }, "No rows."),
        pager(data.total || 0, PAGE, state.offset, (o) => go({ offset: o }))));
  }

  // -- Changes --------------------------------------------------------------------------------

  /* changed_fields as a list of "field: old → new" lines, built from text nodes only. */
  function fieldsList(changed) {
    const ul = h("ul", { class: "fields" });
    const isObj = (v) => v && typeof v === "object" && !Array.isArray(v);
    const line = (name, ...rest) => ul.append(h("li", {}, h("span", { class: "field" }, name), ": ", rest));
    // strings quoted (“…”) so empty and blank values show; long values clipped, whole in the tooltip
    const value = (v) => {
      const text = typeof v === "string" ? `“${v}”` : asText(v);
      return h("span", { class: "val", title: text.length > 80 ? text : null }, clip(text, 80));
    };
    function walk(name, v) {
      if (isObj(v) && ("old" in v || "new" in v)) {
        const label = v.url ? `${name} ${v.url}` : name;
        if (isObj(v.old) && isObj(v.new)) {
          for (const k of new Set([...Object.keys(v.old), ...Object.keys(v.new)])) line(`${label} ${k}`, value(v.old[k]), " → ", value(v.new[k]));
        } else {
          line(label, value(v.old), " → ", value(v.new));
        }
      } else if (isObj(v) && ("length_old" in v || "diff" in v)) {
        line(name, `${fmtNum(v.length_old)} → ${fmtNum(v.length_new)} characters`,
          v.diff ? h("details", {}, h("summary", {}, "diff"), h("pre", { class: "diff" }, asText(v.diff))) : null);
      } else if (isObj(v) && ("added" in v || "removed" in v || "changed" in v)) {
        const parts = [];
        if (v.added && v.added.length) parts.push(h("span", { class: "ok-text" }, `+ ${v.added.map(asText).join(", ")}`));
        if (v.removed && v.removed.length) parts.push(h("span", { class: "bad-text" }, `− ${v.removed.map(asText).join(", ")}`));
        if (parts.length) line(name, parts.flatMap((p, i) => (i ? ["; ", p] : [p])));
        for (const c of v.changed || []) walk(name, c);
      } else if (isObj(v)) {
        const entries = Object.entries(v);
        if (!entries.length) line(name, "(empty)");
        for (const [k, sub] of entries) walk(`${name}.${k}`, sub);
      } else if (Array.isArray(v)) {
        line(name, v.map(asText).join(", "));
      } else {
        line(name, value(v));
      }
    }
    if (isObj(changed)) for (const [k, v] of Object.entries(changed)) walk(k, v);
    else if (changed !== null && changed !== undefined) ul.append(h("li", {}, asText(changed)));
    return ul;
  }

  function reviewState(c) {
    if (c.reviewed_at) {
      return h("div", {},
        pill(c.review_outcome || "reviewed", c.review_outcome === "dismissed" ? "neutral" : "ok"),
        h("div", { class: "small muted" }, `${c.reviewed_by || "?"}, ${fmtDate(c.reviewed_at)}`),
        c.review_note ? h("div", { class: "small note" }, c.review_note) : null);
    }
    return c.requires_review ? pill("needs review", "warn") : h("span", { class: "muted" }, "—");
  }

  function reviewActions(c, onDone) {
    const cell = h("td", { class: "actions" });
    function buttons() {
      show(cell, 
        h("button", { type: "button", class: "btn btn-primary", "data-test": "review-button", on: { click: () => form("reviewed") } }, "Mark reviewed"),
        h("button", { type: "button", class: "btn", "data-test": "dismiss-button", on: { click: () => form("dismissed") } }, "Dismiss"));
    }
    function form(action) {
      const note = h("input", { type: "text", class: "note-input", placeholder: "Note (optional)", maxlength: 2000, "data-test": "review-note", "aria-label": "Review note" });
      const submit = h("button", { type: "submit", class: "btn btn-primary", "data-test": "review-confirm" }, action === "reviewed" ? "Mark reviewed" : "Dismiss");
      const problem = h("div");
      show(cell, h("form", { class: "review-form", "data-action": action, on: {
        submit: async (event) => {
          event.preventDefault();
          submit.disabled = true;
          show(problem, );
          try {
            await api(`/changes/${enc(c.id)}/review`, null, { body: { action, note: note.value } });
            onDone(`Change ${c.id} (${c.dataset_title || c.source_id}) ${action === "reviewed" ? "marked reviewed" : "dismissed"}.`);
          } catch (err) {
            submit.disabled = false;
            show(problem, errorBox(err));
          }
        },
      } }, note, submit, h("button", { type: "button", class: "btn btn-link", on: { click: buttons } }, "Cancel"), problem));
      note.focus();
    }
    buttons();
    return cell;
  }

  function changeRow(c, opts) {
    const sig = typeof c.significance === "number" ? c.significance : null;
    const meter = h("span", { class: "meter" }, h("span", { class: `meter-fill${c.requires_review ? " hot" : ""}` }));
    meter.firstChild.style.width = `${Math.round(Math.max(0, Math.min(1, sig || 0)) * 100)}%`;
    return h("tr", { "data-test": "change-row", "data-change-id": c.id, class: c.requires_review && !c.reviewed_at ? "needs-review" : null },
      h("td", { class: "nowrap" }, time(c.detected_at)),
      opts.portal ? h("td", {}, h("a", { href: portalHref(c.portal) }, c.portal)) : null,
      opts.dataset ? h("td", { class: "title-cell" },
        h("a", { href: datasetHref(c.portal, c.source_id), "data-test": "dataset-link" }, c.dataset_title || c.source_id || "(untitled)")) : null,
      h("td", {}, pill(c.change_type || "?", `type-${c.change_type}`),
        c.old_version || c.new_version ? h("div", { class: "small muted" }, `v${c.old_version ?? "–"} → v${c.new_version ?? "–"}`) : null),
      h("td", { class: "num" }, sig === null ? "—" : sig.toFixed(2), meter),
      h("td", {}, fieldsList(c.changed_fields)),
      h("td", {}, reviewState(c)),
      c.can_review ? reviewActions(c, opts.onReviewed) : h("td", { class: "actions" }));
  }

  function changesTable(items, opts) {
    return table({ class: "grid changes", "data-test": opts.test || "changes-table" },
      ["Detected", opts.portal ? "Portal" : null, opts.dataset ? "Dataset" : null, "Change", { text: "Significance", cls: "num" },
        "Changed fields", "Review", ""].filter((x) => x !== null),
      items.map((c) => changeRow(c, opts)));
  }

  function statusMessage() {
    if (!flash) return null;
    const text = flash;
    flash = null;
    return h("div", { class: "status", role: "status", "data-test": "status" }, text);
  }

  async function pageChanges(alive) {
    const q = query();
    const state = {
      queue: q.get("queue") === "false" ? "false" : "true",
      portal: q.get("portal") || "",
      change_type: q.get("change_type") || "",
      since: q.get("since") || "",
      min_significance: q.get("min_significance") || "",
      offset: Math.max(0, parseInt(q.get("offset") || "0", 10) || 0),
    };
    const [portals, changes] = await Promise.all([
      portalList(),
      api("/changes", { ...state, limit: PAGE, since: state.since || null }),
    ]);
    if (!alive()) return;
    const go = (patch) => navigate({ ...state, queue: state.queue === "true" ? null : "false", ...patch });
    const controls = {
      portal: portalSelect(portals, state.portal, { name: "portal", "data-test": "filter-portal" }),
      change_type: h("select", { name: "change_type", "data-test": "filter-change-type" },
        h("option", { value: "" }, "All types"),
        CHANGE_TYPES.map((t) => h("option", { value: t, selected: t === state.change_type }, t))),
      since: h("input", { type: "date", name: "since", value: state.since, "data-test": "filter-since" }),
      min_significance: h("input", { type: "number", name: "min_significance", min: 0, max: 1, step: 0.05,
        value: state.min_significance, placeholder: "0–1", "data-test": "filter-min-significance" }),
    };
    const apply = () => go({ portal: controls.portal.value, change_type: controls.change_type.value, since: controls.since.value,
      min_significance: controls.min_significance.value, offset: 0 });
    const tab = (queue, label, test) => h("button", { type: "button", role: "tab", class: `tab${state.queue === queue ? " active" : ""}`,
      "aria-selected": state.queue === queue ? "true" : "false", "data-test": test,
      on: { click: () => go({ queue: queue === "true" ? null : "false", offset: 0 }) } }, label);
    const items = changes.items || [];
    const onReviewed = (message) => { flash = message; render(); };
    show(app, 
      h("div", { class: "page-head" }, h("h1", {}, "Changes"),
        me.user ? h("span", { class: "muted small" }, me.can_review ? "You can review changes." : "Read-only: you cannot review changes.") : null),
      h("div", { class: "tabs", role: "tablist" },
        tab("true", "Review queue", "tab-queue"), tab("false", "All changes", "tab-all")),
      h("form", { class: "filters", "data-test": "filters", on: { submit: (e) => { e.preventDefault(); apply(); }, change: apply } },
        h("label", {}, "Portal", controls.portal),
        h("label", {}, "Change type", controls.change_type),
        h("label", {}, "Since", controls.since),
        h("label", {}, "Min. significance", controls.min_significance),
        h("button", { type: "button", class: "btn btn-link", on: { click: () => go({ portal: "", change_type: "", since: "", min_significance: "", offset: 0 }) } }, "Clear")),
      exportLinks("changes", { queue: state.queue === "true", portal: state.portal, change_type: state.change_type, since: state.since,
        min_significance: state.min_significance }, "Download every change these filters keep: "),
      statusMessage(),
      items.length
        ? withBulkReview(changesTable(items, { portal: true, dataset: true, onReviewed }), items, onReviewed)
        : h("p", { class: "empty", "data-test": "changes-empty" }, state.queue === "true" ? "Nothing waiting for review." : "No changes match."),
      pager(changes.total || 0, PAGE, state.offset, (o) => go({ offset: o })));
  }

  // -- Dataset --------------------------------------------------------------------------------

  async function pageDataset(alive, portal, sourceId) {
    const ds = await api(`/datasets/${enc(portal)}/${enc(sourceId)}`);
    if (!alive()) return;
    const versions = (ds.versions || []).slice().sort((a, b) => a.version_number - b.version_number);
    const q = query();
    const current = versions.find((v) => v.is_current) || versions[versions.length - 1];
    const numbers = versions.map((v) => v.version_number);
    const pick = (key, fallback) => {
      const n = parseInt(q.get(key) || "", 10);
      return numbers.includes(n) ? n : fallback;
    };
    const to = pick("to", current ? current.version_number : null);
    const before = numbers.filter((n) => n < to);
    const from = pick("from", before.length ? before[before.length - 1] : to);
    const diffBox = h("div", { class: "diff-box" });
    const onReviewed = (message) => { flash = message; render(); };

    const select = (key, value) => h("select", { name: key, "data-test": `diff-${key}`, on: { change: () => navigate({ from: fromSel.value, to: toSel.value }, true) } },
      versions.map((v) => h("option", { value: v.version_number, selected: v.version_number === value },
        `v${v.version_number}${v.is_current ? " (current)" : ""} · ${fmtDate(v.first_seen_at)}`)));
    const fromSel = select("from", from);
    const toSel = select("to", to);

    const timeline = h("ol", { class: "timeline", "data-test": "timeline" },
      versions.slice().reverse().map((v) => h("li", { class: `${v.is_current ? "current" : ""}${v.version_number === to || v.version_number === from ? " picked" : ""}`, "data-version": v.version_number },
        h("div", { class: "tl-head" },
          h("button", { type: "button", class: "btn-link tl-version", title: "Compare with the previous version",
            on: { click: () => navigate({ from: Math.max(...numbers.filter((n) => n < v.version_number), v.version_number), to: v.version_number }, true) } },
          `Version ${v.version_number}`),
          " ", pill(v.change_type || "?", `type-${v.change_type}`),
          v.is_current ? [" ", pill("current", "ok")] : null),
        h("div", { class: "tl-title" }, v.title || "(untitled)"),
        h("div", { class: "small muted" }, `first seen ${fmtDate(v.first_seen_at)} · last seen ${fmtDate(v.last_seen_at)}`),
        v.content_hash ? h("div", { class: "small muted mono", title: v.content_hash }, clip(String(v.content_hash), 16)) : null)));

    show(app, 
      h("div", { class: "crumbs" }, h("a", { href: `${BASE}/` }, "Portals"), " / ", h("a", { href: portalHref(ds.portal || portal) }, ds.portal || portal), " / ", ds.source_id || sourceId),
      h("div", { class: "page-head" }, h("h1", { "data-test": "dataset-title" }, ds.title || "(untitled)"),
        ds.removed_at ? pill(`removed ${fmtDate(ds.removed_at)}`, "bad", { "data-test": "removed" }) : null),
      h("dl", { class: "facts" },
        h("div", {}, h("dt", {}, "URL"), h("dd", {}, ds.url ? extLink(ds.url, ds.url, { "data-test": "dataset-url" }) : "—")),
        h("div", {}, h("dt", {}, "Organization"), h("dd", { "data-test": "dataset-organization" }, ds.organization ? asText(ds.organization) : "—")),
        h("div", {}, h("dt", {}, "Source id"), h("dd", { class: "mono" }, ds.source_id || sourceId))),
      h("div", { class: "dataset-grid" },
        h("section", { class: "card" }, h("h2", {}, `Versions (${versions.length})`), versions.length ? timeline : h("p", { class: "empty" }, "No versions.")),
        h("section", { class: "card" }, h("h2", {}, "Compare versions"),
          versions.length ? h("div", { class: "filters" }, h("label", {}, "From", fromSel), h("label", {}, "To", toSel)) : null,
          diffBox)),
      groupCard(ds, portal, sourceId, onReviewed),
      h("section", { class: "card" }, h("h2", {}, "Changes"),
        statusMessage(),
        (ds.changes || []).length ? changesTable(ds.changes, { portal: false, dataset: false, onReviewed, test: "dataset-changes" })
          : h("p", { class: "empty" }, "No changes recorded.")));

    if (!versions.length) return;
    if (versions.length < 2) {
      show(diffBox, h("p", { class: "muted" }, "Only one version so far: nothing to compare."));
      return;
    }
    show(diffBox, h("p", { class: "muted" }, "Loading diff…"));
    try {
      const diff = await api(`/datasets/${enc(portal)}/${enc(sourceId)}/diff`, { from, to });
      if (!alive()) return;
      const fields = diff.fields || [];
      const nChanged = fields.filter((f) => f.changed).length;
      const cell = (v) => h("td", { class: "val-cell" }, v === null || v === undefined ? h("span", { class: "muted" }, "(none)") : h("pre", {}, asText(v)));
      show(diffBox, 
        h("p", { class: "small muted" }, from === to ? `Version ${to} only.` : `${nChanged} of ${fields.length} fields changed between v${diff.from ?? from} and v${diff.to ?? to}.`),
        table({ class: "grid diff", "data-test": "dataset-diff" },
          ["Field", `v${diff.from ?? from}`, `v${diff.to ?? to}`],
          fields.map((f) => h("tr", { class: f.changed ? "changed" : null, "data-changed": f.changed ? "true" : "false" },
            h("th", { scope: "row" }, f.field, f.changed ? h("span", { class: "changed-mark", title: "changed" }, " ●") : null),
            cell(f.old), cell(f.new)))));
    } catch (err) {
      if (alive()) show(diffBox, errorBox(err));
    }
  }

  // -- Duplicate groups: one dataset on several portals -------------------------------------------

  /* POST a decision about the group (split / merge / forget), then show the page again with a message. */
  function groupAction(path, body, message, problem, onDone) {
    return async (event) => {
      if (event) event.preventDefault();
      const button = event && event.currentTarget && event.currentTarget.tagName === "BUTTON" ? event.currentTarget : null;
      if (button) button.disabled = true;
      show(problem);
      try {
        await api(`/duplicates/${path}`, null, { body });
        onDone(message);
      } catch (err) {
        if (button) button.disabled = false;
        show(problem, errorBox(err));
      }
    };
  }

  function groupCard(ds, portal, sourceId, onDone) {
    const group = ds.group || { group_id: null, members: [], overrides: [] };
    const self = { portal: ds.portal || portal, source_id: ds.source_id || sourceId };
    const problem = h("div", { "data-test": "group-problem" });
    const editable = !!ds.can_edit_group;
    const members = group.members || [];
    const byId = Object.fromEntries(members.map((m) => [m.dataset_id, m]));
    const isSelf = (m) => m.portal === self.portal && m.source_id === self.source_id;
    const memberRow = (m) => h("tr", { "data-test": "group-member", class: isSelf(m) ? "picked" : null },
      h("td", {}, h("a", { href: portalHref(m.portal) }, m.portal)),
      h("td", { class: "title-cell" }, isSelf(m) ? h("strong", {}, m.title || m.source_id) : h("a", { href: datasetHref(m.portal, m.source_id), "data-test": "group-member-link" }, m.title || m.source_id || "(untitled)"),
        m.live ? null : [" ", pill(`removed ${fmtDate(m.removed_at)}`, "bad")]),
      h("td", {}, m.is_canonical ? pill("canonical", "ok", { "data-test": "canonical" }) : m.copy_of ? pill("copy", "neutral") : h("span", { class: "muted" }, "—")),
      h("td", {}, m.evidence || "—"),
      h("td", { class: "num" }, typeof m.confidence === "number" ? m.confidence.toFixed(2) : "—"),
      editable ? h("td", { class: "actions" }, isSelf(m) ? null : h("button", { type: "button", class: "btn", "data-test": "split-from",
        title: "Keep this dataset and that one apart", on: { click: groupAction("split", { ...self, from: [{ portal: m.portal, source_id: m.source_id }] },
          `${self.source_id} is kept apart from ${m.source_id} of ${m.portal}.`, problem, onDone) } }, "Not the same")) : null);
    const who = (id) => (byId[id] ? `${byId[id].portal} ${byId[id].source_id}` : `dataset ${id}`);
    const overrides = group.overrides || [];
    const mergePortal = h("input", { type: "text", name: "portal", placeholder: "Portal", "aria-label": "Other portal", "data-test": "merge-portal" });
    const mergeId = h("input", { type: "text", name: "source_id", placeholder: "Dataset id on that portal", "aria-label": "Other dataset id", "data-test": "merge-source-id" });
    const mergeForm = editable ? h("form", { class: "filters", "data-test": "merge-form", on: { submit: (event) => groupAction("merge",
      { ...self, other_portal: mergePortal.value.trim(), other_source_id: mergeId.value.trim() },
      `${self.source_id} is now grouped with ${mergeId.value.trim()} of ${mergePortal.value.trim()}.`, problem, onDone)(event) } },
      h("label", {}, "Same dataset as", mergePortal), mergeId,
      h("button", { type: "submit", class: "btn", "data-test": "merge-button" }, "Merge")) : null;
    return h("section", { class: "card", "data-test": "dataset-group" },
      h("h2", {}, group.group_id === null ? "Other portals" : `Same dataset on ${members.length - 1} other portal${members.length === 2 ? "" : "s"}`),
      group.group_id === null ? h("p", { class: "empty", "data-test": "group-alone" }, "Not found on any other portal.")
        : table({ class: "grid", "data-test": "group-members" },
          ["Portal", "Dataset", "Role", "Evidence", { text: "Confidence", cls: "num" }, editable ? "" : null].filter((x) => x !== null),
          members.map(memberRow)),
      overrides.length ? h("div", {}, h("h3", {}, "Decisions"),
        h("ul", { class: "plain", "data-test": "group-overrides" }, overrides.map((o) => h("li", {},
          pill(o.decision, o.decision === "same" ? "ok" : "neutral"), ` ${who(o.a)} and ${who(o.b)} — ${o.decided_by || "?"}, ${fmtDate(o.decided_at)}`,
          o.note ? h("span", { class: "small note" }, ` (${o.note})`) : null)))) : null,
      editable ? h("div", { class: "group-actions" },
        group.group_id !== null ? h("button", { type: "button", class: "btn", "data-test": "split-button",
          on: { click: groupAction("split", self, `${self.source_id} is taken out of its group.`, problem, onDone) } }, "Split: not the same dataset") : null,
        overrides.length ? h("button", { type: "button", class: "btn btn-link", "data-test": "forget-button",
          on: { click: groupAction("forget", self, `The decisions about ${self.source_id} are dropped: the evidence decides again.`, problem, onDone) } }, "Forget decisions") : null,
        mergeForm) : null,
      problem);
  }

  // -- Search ---------------------------------------------------------------------------------

  /* A snippet's matching words (the API puts them, and only them, between "**") as <mark>, the rest as text. */
  function snippetNodes(snippet) {
    return String(snippet).split("**").map((part, i) => (i % 2 ? h("mark", {}, part) : part));
  }

  async function pageSearch(alive) {
    const q = query();
    const text = q.get("q") || "";
    const portal = q.get("portal") || "";
    const allCopies = q.get("all_copies") === "true";
    const portals = await portalList();
    if (!alive()) return;
    const box = h("input", { type: "search", name: "q", value: text, placeholder: "Search datasets by words or meaning…", "data-test": "search-box", "aria-label": "Search", autocomplete: "off" });
    const select = portalSelect(portals, portal, { name: "portal", "data-test": "search-portal", "aria-label": "Portal" });
    const copies = h("input", { type: "checkbox", name: "all_copies", checked: allCopies, "data-test": "search-all-copies" });
    const results = h("div", { class: "results-box" });
    const filters = searchFilterControls(q);
    const filtered = Object.fromEntries([...SEARCH_FILTERS.map(([key]) => [key, q.get(key) || null]), ["include_removed", q.get("include_removed") === "true" ? "true" : null]]);
    const go = () => navigate({ q: box.value.trim(), portal: select.value, ...filters.values(), all_copies: copies.checked ? "true" : null });
    copies.addEventListener("change", () => { if (box.value.trim()) go(); });
    show(app, 
      h("div", { class: "page-head" }, h("h1", {}, "Search")),
      h("form", { class: "search-form", role: "search", on: { submit: (e) => { e.preventDefault(); go(); } } },
        box, select, h("label", { class: "toggle", title: "Show each portal's copy of a dataset as its own result" }, copies, " all copies"),
        h("button", { type: "submit", class: "btn btn-primary", "data-test": "search-button" }, "Search"),
        filters.node),
      exportLinks("datasets", { portal, ...filtered, format: null, resource_format: filtered.format }, "Download the datasets these filters keep (the search words aside): "),
      results);
    if (!text) {
      box.focus();
      return;
    }
    show(results, h("p", { class: "muted" }, "Searching…"));
    const data = await api("/search", { q: text, portal, ...filtered, limit: 20, all_copies: allCopies ? "true" : null });
    if (!alive()) return;
    const items = data.items || [];
    show(results, 
      h("p", { class: "small muted" }, `${items.length} result${items.length === 1 ? "" : "s"}${data.model ? ` · model ${data.model}` : ""}`),
      items.length ? h("ol", { class: "results", "data-test": "search-results" }, items.map((r) => h("li", { "data-test": "search-result" },
        h("span", { class: "rank" }, `#${r.rank}`),
        h("div", {},
          h("a", { href: datasetHref(r.portal, r.source_id), class: "strong" }, r.title || r.source_id || "(untitled)"),
          h("div", { class: "small muted" }, r.portal, r.organization ? ` · ${r.organization}` : "", " · score ",
            typeof r.score === "number" ? r.score.toFixed(4) : "—", r.matched ? ` · ${r.matched.join(" + ")}` : ""),
          r.snippet ? h("div", { class: "small snippet", "data-test": "snippet" }, snippetNodes(r.snippet)) : null,
          r.url ? h("div", { class: "small" }, extLink(r.url)) : null,
          (r.also_on || []).length ? h("div", { class: "small also-on", "data-test": "also-on" }, "also on: ",
            r.also_on.map((c, i) => [i ? ", " : "", h("a", { href: datasetHref(c.portal, c.source_id), title: c.title || c.source_id }, c.portal)])) : null))))
        : h("p", { class: "empty" }, "No results."));
  }

  // -- Acting from the page: run a portal's DAG now, review many, export, validate -------------------

  /* "Run now", "Full sync now", "Reconcile now" on a portal's page: a DAG run of its DAG through
     Airflow (POST /api/portals/{name}/trigger), linked to Airflow's grid once made. Shown to users
     Airflow lets trigger the DAG; a paused or unknown DAG says why nothing can start. */
  function portalActions(name) {
    const box = h("div");
    const card = h("section", { class: "card portal-actions", "data-test": "portal-actions" }, box,
      h("div", { class: "downloads" }, exportLinks("datasets", { portal: name }, "Its datasets: "), " ",
        exportLinks("changes", { portal: name }, "Its changes: ")));
    const status = h("div", { "data-test": "trigger-status" });
    const ACTIONS = [["run", "Run now", "An incremental run, as scheduled"],
      ["full_sync", "Full sync now", "List every dataset of the portal"],
      ["reconcile", "Reconcile now", "List every identifier: fetch what is missing or stale, remove what the portal no longer lists"]];
    (async () => {
      let state;
      try {
        state = await api(`/portals/${enc(name)}/trigger`);
      } catch (err) {
        show(box, h("h2", {}, "Run now"), errorBox(err));
        return;
      }
      if (state.dag_id === null) { // a portal only the harvester database knows: no DAG to run
        show(box, h("h2", {}, "Run now"), h("p", { class: "muted small", "data-test": "trigger-problem" }, state.problem));
        return;
      }
      if (!state.can_trigger) {
        show(box, h("h2", {}, "Run now"), h("p", { class: "muted small", "data-test": "trigger-not-allowed" },
          `Airflow does not let you trigger ${state.dag_id}.`));
        return;
      }
      const force = h("input", { type: "checkbox", name: "force_removals", "data-test": "trigger-force-removals" });
      const buttons = ACTIONS.map(([action, label, title]) => h("button", { type: "button", class: `btn${action === "run" ? " btn-primary" : ""}`,
        "data-test": `trigger-${action}`, title, disabled: !!state.problem, on: { click: async (event) => {
          const button = event.currentTarget;
          for (const b of buttons) b.disabled = true;
          show(status, h("p", { class: "muted small" }, "Asking Airflow…"));
          try {
            const run = await api(`/portals/${enc(name)}/trigger`, null, { body: { action, force_removals: force.checked && action !== "run" } });
            const link = safeUrl(run.dag_run_url);
            show(status, h("div", { class: "status", role: "status", "data-test": "trigger-done" },
              `${label.replace(" now", "")}: DAG run `, link ? h("a", { href: link, target: "_top", "data-test": "triggered-run-link" }, run.dag_run_id) : run.dag_run_id,
              ` of ${run.dag_id} is ${run.state} (params ${Object.entries(run.conf).filter(([, v]) => v).map(([k]) => k).join(", ") || "defaults"}).`));
          } catch (err) {
            show(status, errorBox(err));
          } finally {
            for (const b of buttons) b.disabled = !!state.problem;
            button.blur();
          }
        } } }, label));
      const dagLink = safeUrl(state.dag_url);
      show(box, h("h2", {}, "Run now"),
        h("div", { class: "filters" }, buttons,
          h("label", { class: "toggle", title: "On a full sync or a reconciliation: remove what the portal no longer lists even past the removal guard" }, force, " force removals"),
          dagLink ? h("a", { href: dagLink, target: "_top", class: "small" }, `${state.dag_id} in Airflow`) : null),
        state.problem ? h("p", { class: "small warn-text", "data-test": "trigger-problem" }, state.problem) : null,
        status);
    })();
    return card;
  }

  /* Links downloading what a list shows, with its filters: CSV and JSON Lines. */
  function exportLinks(what, params, label) {
    const link = (format) => {
      const url = new URL(`${BASE}/api/export/${what}`, location.origin);
      url.searchParams.set("format", format);
      for (const [key, value] of Object.entries(params)) {
        if (value !== null && value !== undefined && value !== "" && value !== false) url.searchParams.set(key, String(value));
      }
      return h("a", { href: url.pathname + url.search, class: "btn", download: "", "data-test": `export-${what}-${format}` }, format === "csv" ? "CSV" : "JSON Lines");
    };
    return h("span", { class: "export-links", "data-test": `export-${what}` }, h("span", { class: "small muted" }, label || "Download: "), link("csv"), " ", link("jsonl"));
  }

  /* Checkboxes on the rows of a changes table the user may review, "select all shown", and one
     review of the selection (POST /api/changes/review). */
  function withBulkReview(tableWrap, items, onDone) {
    const reviewable = new Map(items.filter((c) => c.can_review && !c.reviewed_at).map((c) => [String(c.id), c]));
    if (!reviewable.size) return tableWrap;
    const boxes = [];
    const count = h("span", { class: "small muted", "data-test": "bulk-count" });
    const all = h("input", { type: "checkbox", "aria-label": "Select every change shown", "data-test": "bulk-select-all" });
    const headRow = tableWrap.querySelector("thead tr");
    headRow.prepend(h("th", { scope: "col", class: "select-col" }, all));
    for (const row of tableWrap.querySelectorAll("tbody tr[data-change-id]")) {
      const change = reviewable.get(row.getAttribute("data-change-id"));
      const box = change ? h("input", { type: "checkbox", value: change.id, "aria-label": `Select change ${change.id}`, "data-test": "bulk-select" }) : null;
      if (box) boxes.push(box);
      row.prepend(h("td", { class: "select-col" }, box));
    }
    const note = h("input", { type: "text", class: "note-input", placeholder: "Note (optional)", maxlength: 2000, "aria-label": "Note for the selected changes", "data-test": "bulk-note" });
    const problem = h("div");
    const picked = () => boxes.filter((b) => b.checked).map((b) => Number(b.value));
    const act = (action) => h("button", { type: "button", class: `btn${action === "reviewed" ? " btn-primary" : ""}`, "data-test": `bulk-${action}`, disabled: true,
      on: { click: async () => {
        const ids = picked();
        if (!ids.length) return;
        for (const b of actions) b.disabled = true;
        show(problem);
        try {
          const done = await api("/changes/review", null, { body: { ids, action, note: note.value } });
          const already = (done.already_reviewed || []).length;
          onDone(`${fmtNum(done.marked)} change${done.marked === 1 ? "" : "s"} ${action === "reviewed" ? "marked reviewed" : "dismissed"}${already ? ` (${fmtNum(already)} had a review already)` : ""}.`);
        } catch (err) {
          sync();
          show(problem, errorBox(err));
        }
      } } }, action === "reviewed" ? "Mark selected reviewed" : "Dismiss selected");
    const actions = [act("reviewed"), act("dismissed")];
    function sync() {
      const n = picked().length;
      count.textContent = n ? `${n} selected` : "None selected";
      all.checked = n === boxes.length;
      all.indeterminate = n > 0 && n < boxes.length;
      for (const b of actions) b.disabled = !n;
    }
    all.addEventListener("change", () => { for (const b of boxes) b.checked = all.checked; sync(); });
    for (const b of boxes) b.addEventListener("change", sync);
    sync();
    return h("div", {}, h("div", { class: "filters bulk-bar", "data-test": "bulk-bar" }, count, note, actions), problem, tableWrap);
  }

  /* The search page's filters (organization, tag, format, licence, modified from / until, removed
     datasets too) as inputs read from and written to the address bar. */
  const SEARCH_FILTERS = [["organization", "Organization", "text"], ["tag", "Tag", "text"], ["format", "Format", "text"],
    ["license", "Licence", "text"], ["since", "Modified from", "date"], ["until", "Modified until", "date"]];
  function searchFilterControls(q) {
    const inputs = {};
    for (const [key, label, type] of SEARCH_FILTERS) {
      inputs[key] = h("input", { type, name: key, value: q.get(key) || "", "aria-label": label, placeholder: type === "text" ? label : null, "data-test": `search-${key}` });
    }
    inputs.include_removed = h("input", { type: "checkbox", name: "include_removed", checked: q.get("include_removed") === "true", "data-test": "search-include-removed" });
    const values = () => ({ ...Object.fromEntries(SEARCH_FILTERS.map(([key]) => [key, inputs[key].value.trim()])),
      include_removed: inputs.include_removed.checked ? "true" : null });
    const node = h("div", { class: "filters search-filters", "data-test": "search-filters" },
      SEARCH_FILTERS.map(([key, label]) => h("label", {}, label, inputs[key])),
      h("label", { class: "toggle" }, inputs.include_removed, " removed too"));
    return { node, values, inputs };
  }

  // -- Validate a catalogue -------------------------------------------------------------------------

  const KINDS = [["", "Guess"], ["ckan", "CKAN"], ["dcat-json", "DCAT JSON / JSON-LD"], ["dcat-rdf", "DCAT RDF"]];

  /* A URL or an uploaded file checked as a harvest would (POST /api/validate), nothing stored. */
  async function pageValidate(alive) {
    const url = h("input", { type: "url", name: "url", placeholder: "https://catalogue.example/data.json", "aria-label": "Catalogue URL", "data-test": "validate-url" });
    const file = h("input", { type: "file", name: "file", "aria-label": "Catalogue file", "data-test": "validate-file" });
    const kind = h("select", { name: "type", "data-test": "validate-type", "aria-label": "Kind of catalogue" }, KINDS.map(([v, l]) => h("option", { value: v }, l)));
    const pages = h("input", { type: "number", name: "pages", min: 1, max: 100, value: 3, "aria-label": "CKAN pages", "data-test": "validate-pages" });
    const submit = h("button", { type: "submit", class: "btn btn-primary", "data-test": "validate-button" }, "Validate");
    const result = h("div", { "data-test": "validate-result" });
    async function run(event) {
      event.preventDefault();
      const upload = file.files && file.files[0];
      if (!upload && !url.value.trim()) {
        show(result, errorBox(new ApiError(422, "give a catalogue's URL or choose a file")));
        return;
      }
      submit.disabled = true;
      show(result, h("p", { class: "muted" }, upload ? `Validating ${upload.name}…` : `Fetching and validating ${url.value.trim()}…`));
      try {
        let report;
        if (upload) {
          const form = new FormData();
          form.append("file", upload, upload.name);
          if (kind.value) form.append("type", kind.value);
          const response = await fetch(`${BASE}/api/validate`, { method: "POST", body: form, credentials: "same-origin", headers: { Accept: "application/json" } });
          const text = await response.text();
          let data = null;
          try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
          if (!response.ok) throw new ApiError(response.status, detailOf(data, clip(text || response.statusText || "", 300)));
          report = data;
        } else {
          report = await api("/validate", null, { body: { url: url.value.trim(), type: kind.value || undefined, pages: parseInt(pages.value, 10) || 3 } });
        }
        if (alive()) show(result, validationReport(report));
      } catch (err) {
        if (alive()) show(result, errorBox(err));
      } finally {
        submit.disabled = false;
      }
    }
    show(app,
      h("div", { class: "page-head" }, h("h1", {}, "Validate a catalogue")),
      h("p", { class: "muted small" }, "Check a catalogue as a harvest would read it, before adding it to portals.yaml: nothing is stored."),
      h("form", { class: "card validate-form", "data-test": "validate-form", on: { submit: run } },
        h("div", { class: "filters" }, h("label", {}, "URL", url), h("span", { class: "muted" }, "or"), h("label", {}, "File", file)),
        h("div", { class: "filters" }, h("label", {}, "Kind", kind), h("label", { title: "Pages of package_search to read (CKAN)" }, "Pages", pages), submit)),
      result);
  }

  function validationReport(r) {
    const groups = r.groups || [];
    const rows = r.rows || [];
    return h("section", { class: "card", "data-test": "validate-report" },
      h("h2", {}, "Report: ", h("span", { class: "mono" }, r.source || "?")),
      h("p", { "data-test": "validate-summary" },
        `${r.kind || "?"}${r.guessed ? " (guessed)" : ""} · ${fmtNum(r.records)} record${r.records === 1 ? "" : "s"} read · `,
        h("span", { class: r.failed ? "bad-text" : null }, `${fmtNum(r.failed)} cannot be taken`), " · ",
        h("span", { class: r.warned ? "warn-text" : null }, `${fmtNum(r.warned)} taken with warnings`),
        r.complete === false ? h("span", { class: "muted" }, " · only the first pages were read") : null),
      groups.length
        ? table({ class: "grid outcomes", "data-test": "validate-groups" }, ["Severity", "Reason", { text: "Count", cls: "num" }, "Examples", "Message (first)"],
          groups.map((g) => h("tr", { "data-test": "validate-group", "data-code": g.code },
            h("td", {}, pill(g.severity, SEVERITY_KIND[g.severity])),
            h("td", {}, h("span", { class: "mono" }, g.code), h("div", { class: "small muted" }, g.stage || "")),
            h("td", { class: "num" }, fmtNum(g.count)),
            h("td", { class: "examples" }, (g.examples || []).map((x) => h("div", { class: "mono small ellipsis", title: x }, x))),
            h("td", { class: "message" }, g.message || ""))))
        : h("p", { class: "empty", "data-test": "validate-clean" }, "Every record can be taken as it is."),
      rows.length ? h("details", {}, h("summary", {}, `Rows (${fmtNum(rows.length)} of ${fmtNum(r.rows_total)})`),
        table({ class: "grid outcomes" }, ["Record", "Reason", "Field", "Value", "Message"], rows.map((row) => h("tr", {},
          h("td", { class: "mono small" }, row.source_id || (row.position !== null && row.position !== undefined ? `#${row.position}` : "—")),
          h("td", {}, pill(row.severity, SEVERITY_KIND[row.severity]), h("div", { class: "mono small" }, row.code)),
          h("td", { class: "mono small" }, row.field || "—"),
          h("td", { class: "val-cell" }, row.value === null || row.value === undefined ? "—" : h("span", { class: "mono small" }, String(row.value))),
          h("td", { class: "message" }, row.message || ""))))) : null);
  }

  // -- router ---------------------------------------------------------------------------------

  function route() {
    let rest = location.pathname.slice(BASE.length).replace(/\/+$/, "");
    const parts = rest.split("/").filter(Boolean).map((p) => {
      try { return decodeURIComponent(p); } catch (_) { return p; }
    });
    if (!parts.length) return { nav: "portals", page: pagePortals, args: [] };
    if (parts[0] === "portals" && parts.length === 2) return { nav: "portals", page: pageRuns, args: [parts[1]] };
    if (parts[0] === "runs" && parts.length === 2) return { nav: "portals", page: pageRun, args: [parts[1]] };
    if (parts[0] === "changes" && parts.length === 1) return { nav: "changes", page: pageChanges, args: [] };
    if (parts[0] === "datasets" && parts.length >= 3) {
      // the id is all that follows /datasets/<portal>/, as written: an IRI's "//" stays when the
      // address bar shows it unescaped
      const id = rest.match(/^\/datasets\/[^/]+\/(.+)$/);
      let sourceId = parts.slice(2).join("/");
      if (id) {
        try { sourceId = decodeURIComponent(id[1]); } catch (_) { /* keep the joined parts */ }
      }
      return { nav: "changes", page: pageDataset, args: [parts[1], sourceId] };
    }
    if (parts[0] === "search" && parts.length === 1) return { nav: "search", page: pageSearch, args: [] };
    if (parts[0] === "validate" && parts.length === 1) return { nav: "validate", page: pageValidate, args: [] };
    return { nav: null, page: null, args: [] };
  }

  async function render() {
    const seq = ++renderSeq;
    const alive = () => seq === renderSeq;
    const { nav, page, args } = route();
    for (const link of document.querySelectorAll("nav a[data-nav]")) {
      link.setAttribute("href", link.getAttribute("data-nav") === "portals" ? `${BASE}/` : `${BASE}/${link.getAttribute("data-nav")}`);
      if (link.getAttribute("data-nav") === nav) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    if (!page) {
      show(app, h("h1", {}, "Not found"), errorBox(new ApiError(404, `No page at ${location.pathname}`)));
      app.setAttribute("data-rendered", String(seq));
      return;
    }
    app.setAttribute("aria-busy", "true");
    try {
      await page(alive, ...args);
    } catch (err) {
      if (!alive()) return;
      console.error(err);
      show(app, errorBox(err instanceof ApiError ? err : new ApiError(null, err && err.message ? err.message : String(err))));
    } finally {
      if (alive()) {
        app.removeAttribute("aria-busy");
        app.setAttribute("data-rendered", String(seq)); // the page is shown (tests wait for it)
      }
    }
  }

  async function loadMe() {
    try {
      me = (await api("/me")) || me;
      const user = document.getElementById("user");
      if (user && me.user) user.textContent = me.user;
    } catch (_) {
      /* the page itself shows the error */
    }
  }

  window.addEventListener("popstate", render);
  document.querySelector(".brand")?.setAttribute("href", `${BASE}/`);
  loadMe().finally(render);
})();
