/* The Harvester API's reference page (/harvester/docs): the app's OpenAPI description
   (/harvester/openapi.json) rendered here, with nothing loaded from another host, so it works
   offline. Same safety rule as harvester.js: every node is made with document.createElement and
   every text with textContent; no innerHTML, no eval, no inline handlers. */
(function () {
  "use strict";

  const BASE = (location.pathname.match(/^(.*?\/harvester)(?:\/|$)/) || [null, "/harvester"])[1];
  const app = document.getElementById("app");

  const { h, append } = window.HarvesterDom; // dom.js

  /* The descriptions' little markdown: paragraphs, "- " lists, **strong** and `code`; all as text nodes. */
  function inline(text) {
    return String(text).split(/(\*\*[^*]+\*\*|`[^`]+`)/).map((part) => {
      if (/^\*\*[^*]+\*\*$/.test(part)) return h("strong", {}, part.slice(2, -2));
      if (/^`[^`]+`$/.test(part)) return h("code", {}, part.slice(1, -1));
      return part;
    });
  }
  function prose(text) {
    if (!text) return null;
    return h("div", { class: "api-prose" }, String(text).split(/\n\s*\n/).map((para) => {
      const lines = para.split("\n");
      if (lines.every((l) => /^\s*- /.test(l))) return h("ul", {}, lines.map((l) => h("li", {}, inline(l.replace(/^\s*- /, "")))));
      return h("p", {}, inline(lines.join(" ")));
    }));
  }

  const refName = (ref) => String(ref || "").split("/").pop();

  function typeOf(schema, spec) {
    if (!schema) return "";
    if (schema.$ref) return refName(schema.$ref);
    if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
    if (schema.anyOf || schema.oneOf) {
      return (schema.anyOf || schema.oneOf).map((s) => typeOf(s, spec)).filter((t) => t && t !== "null").join(" | ") || "null";
    }
    if (schema.type === "array") return `${typeOf(schema.items, spec) || "any"}[]`;
    const limits = [];
    for (const [key, sign] of [["minimum", "≥"], ["exclusiveMinimum", ">"], ["maximum", "≤"], ["exclusiveMaximum", "<"]]) {
      if (typeof schema[key] === "number") limits.push(`${sign} ${schema[key]}`);
    }
    if (typeof schema.minLength === "number") limits.push(`length ≥ ${schema.minLength}`);
    if (typeof schema.maxLength === "number") limits.push(`length ≤ ${schema.maxLength}`);
    return `${schema.type || "any"}${schema.format ? ` (${schema.format})` : ""}${limits.length ? `, ${limits.join(", ")}` : ""}`;
  }

  function grid(headers, rows) {
    return h("div", { class: "table-wrap" }, h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, rows)));
  }

  function parameters(op) {
    const params = op.parameters || [];
    if (!params.length) return null;
    return h("div", {}, h("h4", {}, "Parameters"), grid(["Name", "In", "Type", "Default", "Description"],
      params.map((p) => h("tr", { "data-test": "api-parameter" },
        h("td", { class: "mono" }, p.name, p.required ? h("span", { class: "bad-text", title: "required" }, " *") : null),
        h("td", {}, p.in), h("td", { class: "mono small" }, typeOf(p.schema)),
        h("td", { class: "mono small" }, p.schema && p.schema.default !== undefined ? JSON.stringify(p.schema.default) : ""),
        h("td", {}, p.description || (p.schema && p.schema.description) || "")))));
  }

  function schemaTable(schema, spec) {
    const resolved = schema && schema.$ref ? (spec.components && spec.components.schemas || {})[refName(schema.$ref)] : schema;
    if (!resolved || !resolved.properties) return h("p", { class: "mono small" }, typeOf(schema, spec));
    const required = new Set(resolved.required || []);
    return grid(["Field", "Type", "Description"], Object.entries(resolved.properties).map(([name, prop]) => h("tr", {},
      h("td", { class: "mono" }, name, required.has(name) ? h("span", { class: "bad-text", title: "required" }, " *") : null),
      h("td", { class: "mono small" }, typeOf(prop, spec)),
      h("td", {}, prop.description || ""))));
  }

  function body(op, spec) {
    const content = op.requestBody && op.requestBody.content;
    if (!content) return null;
    return h("div", {}, h("h4", {}, "Body"), Object.entries(content).map(([type, media]) => h("div", {},
      h("p", { class: "small muted" }, type), schemaTable(media.schema, spec))));
  }

  function responses(op) {
    const entries = Object.entries(op.responses || {});
    if (!entries.length) return null;
    return h("div", {}, h("h4", {}, "Responses"), h("ul", { class: "plain" }, entries.map(([code, r]) => h("li", {},
      h("span", { class: "mono strong" }, code), " ", r.description || "",
      r.content ? h("span", { class: "small muted" }, ` (${Object.keys(r.content).join(", ")})`) : null))));
  }

  const anchor = (method, path) => `op-${method}-${path.replace(/[^A-Za-z0-9]+/g, "-").replace(/^-|-$/g, "")}`;

  function operation(method, path, op, spec) {
    return h("section", { class: "card api-op", id: anchor(method, path), "data-test": "api-operation", "data-path": path, "data-method": method },
      h("h3", {}, h("span", { class: `pill api-method api-${method}` }, method.toUpperCase()), " ", h("span", { class: "mono" }, path)),
      op.summary ? h("p", { class: "strong" }, op.summary) : null,
      prose(op.description), parameters(op), body(op, spec), responses(op));
  }

  function render(spec) {
    const groups = new Map();
    for (const [path, item] of Object.entries(spec.paths || {})) {
      for (const [method, op] of Object.entries(item)) {
        if (!["get", "post", "put", "patch", "delete"].includes(method)) continue;
        const tag = (op.tags && op.tags[0]) || "other";
        if (!groups.has(tag)) groups.set(tag, []);
        groups.get(tag).push([method, path, op]);
      }
    }
    const info = spec.info || {};
    app.replaceChildren();
    append(app, [
      h("div", { class: "page-head" }, h("h1", { "data-test": "api-title" }, `${info.title || "Harvester"} API`),
        info.version ? h("span", { class: "pill pill-neutral" }, `version ${info.version}`) : null,
        h("a", { href: `${BASE}/openapi.json`, "data-test": "openapi-link" }, "openapi.json")),
      prose(info.description),
      h("nav", { class: "card api-toc", "aria-label": "Operations" }, h("h2", {}, "Operations"),
        [...groups].map(([tag, ops]) => h("div", {}, h("h3", {}, tag), h("ul", { class: "plain" }, ops.map(([method, path, op]) =>
          h("li", {}, h("a", { href: `#${anchor(method, path)}` }, h("span", { class: "mono" }, `${method.toUpperCase()} ${path}`)),
            op.summary ? h("span", { class: "small muted" }, ` — ${op.summary}`) : null)))))),
      [...groups].map(([tag, ops]) => h("div", {}, h("h2", { class: "api-tag" }, tag), ops.map(([method, path, op]) => operation(method, path, op, spec))))]);
    if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
  }

  async function load() {
    let response;
    try {
      response = await fetch(`${BASE}/openapi.json`, { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch (err) {
      throw new Error(`Could not reach the server (${err.message})`);
    }
    if (!response.ok) throw new Error(`${response.status} ${response.statusText}: ${(await response.text()).slice(0, 300)}`);
    return response.json();
  }

  for (const link of document.querySelectorAll("nav a[data-nav]")) {
    const nav = link.getAttribute("data-nav");
    link.setAttribute("href", nav === "portals" ? `${BASE}/` : `${BASE}/${nav}`);
  }
  document.querySelector(".brand")?.setAttribute("href", `${BASE}/`);
  load().then(render, (err) => {
    app.replaceChildren(h("div", { class: "error", role: "alert", "data-test": "error" }, h("strong", {}, "The API description did not load"), `: ${err.message}`));
  }).finally(() => app.setAttribute("data-rendered", "1")); // the page is shown (tests wait for it)
})();
