/* The DOM builder every Harvester page uses (harvester.js, apidocs.js), in one place, because it
   is where the safety rule lives: nothing from the API is ever parsed as markup. Every node is made
   with document.createElement and every text with textContent; event handlers only through
   {on: {...}}, never as attributes (on*, style and srcdoc are refused). */
(function () {
  "use strict";

  /* h("a", {href, class, "data-test", on: {click}}, child, ...): children are nodes or text. */
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "on") {
        for (const [type, fn] of Object.entries(value)) node.addEventListener(type, fn);
      } else if (key === "class") {
        node.className = value;
      } else if (key === "value" || key === "checked" || key === "disabled" || key === "hidden") {
        node[key] = value;
      } else if (/^on/i.test(key) || key === "style" || key === "srcdoc") {
        throw new Error(`refusing attribute ${key}`);
      } else {
        node.setAttribute(key, value === true ? "" : String(value));
      }
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      if (Array.isArray(child)) append(node, child);
      else if (child instanceof Node) node.append(child);
      else node.append(document.createTextNode(String(child)));
    }
    return node;
  }

  window.HarvesterDom = Object.freeze({ h, append });
})();
