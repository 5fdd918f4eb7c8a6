// Runs first, in <head>: records script errors, unhandled promise rejections and
// anything the page's Content-Security-Policy blocked (a fetch to the network) into
// #js-errors and the data-gpuproof-errors attribute, so a headless browser can tell.
(function () {
  "use strict";
  var errors = [];
  window.__gpuproofErrors = errors;
  function show() {
    document.documentElement.setAttribute("data-gpuproof-errors", String(errors.length));
    var box = document.getElementById("js-errors");
    if (box) {
      box.hidden = false;
      box.textContent = "This page had " + errors.length + " script error(s): " + errors.join(" | ");
    }
  }
  function record(text) {
    errors.push(text);
    show();
  }
  window.addEventListener("error", function (e) {
    if (e.target && e.target !== window && e.target.tagName) {
      record("failed to load " + e.target.tagName.toLowerCase() + " " + (e.target.src || e.target.href || ""));
    } else {
      record((e.message || "error") + " at " + (e.filename || "?") + ":" + (e.lineno || "?"));
    }
  }, true);
  window.addEventListener("unhandledrejection", function (e) {
    record("unhandled promise rejection: " + (e.reason && e.reason.message ? e.reason.message : String(e.reason)));
  });
  document.addEventListener("securitypolicyviolation", function (e) {
    record("blocked by the page's policy (no network allowed): " + e.violatedDirective + " " + e.blockedURI);
  });
  document.addEventListener("DOMContentLoaded", function () { if (errors.length) { show(); } });
})();
