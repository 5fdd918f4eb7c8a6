// report.html behaviour: legend toggles, sortable tables, the checks filter.
// The last statement marks the page as ready; the error recorder in <head> marks
// it with data-gpuproof-errors when any script (or a blocked fetch) failed.
(function () {
  "use strict";

  function toggleSeries(item) {
    var chart = document.getElementById(item.getAttribute("data-chart"));
    if (!chart) { throw new Error("legend refers to a missing chart " + item.getAttribute("data-chart")); }
    var idx = item.getAttribute("data-series");
    var off = item.classList.toggle("off");
    chart.querySelectorAll('.series[data-series="' + idx + '"]').forEach(function (g) {
      g.classList.toggle("off", off);
    });
  }

  document.querySelectorAll("ul.legend li[data-chart]").forEach(function (item) {
    item.addEventListener("click", function () { toggleSeries(item); });
  });

  function cellValue(row, col) {
    var cell = row.children[col];
    var text = cell ? cell.textContent.trim() : "";
    var num = parseFloat(text.replace(/[ ,%+]/g, ""));
    return { text: text, num: /^[-+]?[\d.,\s]+(%|\s.*)?$/.test(text) && !isNaN(num) ? num : null };
  }

  function sortTable(table, col, th) {
    var body = table.tBodies[0];
    var dir = th.getAttribute("data-sort") === "asc" ? "desc" : "asc";
    table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("data-sort"); });
    th.setAttribute("data-sort", dir);
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, col), y = cellValue(b, col), r;
      if (x.num !== null && y.num !== null) { r = x.num - y.num; }
      else { r = x.text.localeCompare(y.text, undefined, { numeric: true }); }
      return dir === "asc" ? r : -r;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("thead th").forEach(function (th, col) {
      th.title = "click to sort";
      th.addEventListener("click", function () { sortTable(table, col, th); });
    });
  });

  var search = document.getElementById("check-filter");
  var problemsOnly = document.getElementById("check-problems");
  var checksTable = document.querySelector("#checks table");
  function filterChecks() {
    if (!checksTable) { return; }
    var q = (search ? search.value : "").toLowerCase();
    var only = problemsOnly ? problemsOnly.checked : false;
    var shown = 0;
    Array.prototype.forEach.call(checksTable.tBodies[0].rows, function (row) {
      var verdict = row.cells[0] ? row.cells[0].textContent.trim() : "";
      var ok = (!q || row.textContent.toLowerCase().indexOf(q) >= 0) &&
               (!only || verdict === "fail" || verdict === "warn");
      row.hidden = !ok;
      if (ok) { shown += 1; }
    });
    var counter = document.getElementById("check-shown");
    if (counter) { counter.textContent = shown + " shown"; }
  }
  if (search) { search.addEventListener("input", filterChecks); }
  if (problemsOnly) { problemsOnly.addEventListener("change", filterChecks); }
  filterChecks();

  var root = document.documentElement;
  root.setAttribute("data-gpuproof-plots", String(document.querySelectorAll("figure.plot svg.chart").length));
  // milliseconds from the page's navigation to here: the page parsed and its script done (the browser test reads it)
  root.setAttribute("data-gpuproof-ready-ms", String(Math.round(window.performance ? performance.now() : 0)));
  root.setAttribute("data-gpuproof-ready", "ok");
  window.addEventListener("load", function () {     // ... and laid out, with everything in it loaded
    root.setAttribute("data-gpuproof-load-ms", String(Math.round(window.performance ? performance.now() : 0)));
  });
})();
