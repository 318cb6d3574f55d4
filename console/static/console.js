// LedgerMQ console: the pages work without this file. It (1) re-fetches the #live part of a page
// every data-refresh-ms and swaps it in when it changed, keeping keyboard focus; (2) asks before
// a form with data-confirm is sent; (3) fills a form's time-zone offset for time inputs; (4) filters
// a table's rows by name.
"use strict";
(function () {
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) ev.preventDefault();
  });
  document.querySelectorAll("[data-tz-offset]").forEach(function (el) {
    el.value = String(new Date().getTimezoneOffset());
  });

  // A filter box hides the rows of its table whose name does not contain the text; it is applied
  // again after each live refresh.
  function applyFilters() {
    document.querySelectorAll("input[data-filter]").forEach(function (box) {
      var needle = box.value.trim().toLowerCase();
      var rows = document.querySelectorAll('[data-testid="' + box.dataset.filter + '"] tbody tr[data-testid]');
      rows.forEach(function (row) {
        var name = (row.querySelector("th") || row).textContent.toLowerCase();
        row.hidden = needle !== "" && name.indexOf(needle) < 0;
      });
    });
  }
  document.addEventListener("input", function (ev) {
    if (ev.target.matches && ev.target.matches("input[data-filter]")) applyFilters();
  });

  var live = document.getElementById("live");
  var every = live ? parseInt(live.dataset.refreshMs || "0", 10) : 0;
  if (!every) return;
  var status = document.getElementById("live-status");
  var last = null;
  var busy = false;

  function focusKey() {
    var el = document.activeElement;
    if (!el || !live.contains(el)) return null;
    return el.outerHTML;
  }

  function restoreFocus(key) {
    if (!key) return;
    var all = live.querySelectorAll("a, button, input, select");
    for (var i = 0; i < all.length; i++) {
      if (all[i].outerHTML === key) { all[i].focus(); return; }
    }
  }

  async function tick() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      var r = await fetch(location.href, { headers: { "X-Console-Fragment": "live" }, cache: "no-store" });
      if (r.status === 401) {
        location.href = "/login?next=" + encodeURIComponent(location.pathname + location.search);
        return;
      }
      var html = await r.text();
      if (html !== last) {
        var key = focusKey();
        live.innerHTML = html;
        applyFilters();
        restoreFocus(key);
        last = html;
      }
      if (status) status.textContent = "last update " + new Date().toLocaleTimeString();
    } catch (e) {
      if (status) status.textContent = "the console does not answer (" + e + ")";
    } finally {
      busy = false;
    }
  }
  window.setInterval(tick, every);
})();
