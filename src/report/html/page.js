"use strict";
// Sort a table by the column whose heading is clicked (or gets Enter or
// Space): numbers by their exact value (data-v), before text; again to
// reverse. Rows of a table's foot stay where they are.
(function () {
  function value(cell) {
    var v = cell.getAttribute("data-v");
    return v === null ? null : Number(v);
  }
  function order(x, y, i) {
    var a = value(x.cells[i]), b = value(y.cells[i]);
    if (a !== null && b !== null) { return a - b; }
    if (a !== null) { return -1; }
    if (b !== null) { return 1; }
    return x.cells[i].textContent.localeCompare(y.cells[i].textContent);
  }
  function sort(th) {
    var table = th.closest("table"), body = table.tBodies[0], i = th.cellIndex;
    var up = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th[aria-sort]").forEach(function (h) {
      h.removeAttribute("aria-sort");
    });
    th.setAttribute("aria-sort", up ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (x, y) { var c = order(x, y, i); return up ? c : -c; });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable thead th").forEach(function (th) {
    th.tabIndex = 0;
    th.title = "sort by this column";
    th.addEventListener("click", function () { sort(th); });
    th.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(th); }
    });
  });
}());
// The page's full height, for a screenshot of all of it (blklab's
// --screenshot reads it from the DOM).
document.documentElement.setAttribute(
  "data-height", String(document.documentElement.scrollHeight));
