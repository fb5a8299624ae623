// The dashboard's one script (batchd ui), served from /assets/ui.js. Pages work without it; it only
// (1) refreshes the page's <main> every data-refresh-secs seconds without reloading the page, unless the
// "refresh" box is unticked, the tab is hidden or a form field has the focus, (2) asks before an action
// whose form carries data-confirm, and (3) disables an action's button once its form is submitted, so a double
// click or an impatient second click sends one request (the server's actions are idempotent as well), and (4) on
// the "Redis unreachable" and "Dashboard busy" pages (503), tries again every few seconds and loads the page once
// it answers.
(function () {
  "use strict";
  var secs = Number(document.body.getAttribute("data-refresh-secs") || "0");
  var box = document.getElementById("auto-refresh");

  function busy() {
    var active = document.activeElement;
    return active && active.closest && active.closest("main form") !== null && active.tagName !== "BUTTON";
  }

  // The "Redis unreachable" page (503) tries again until the page answers, then loads it whole.
  var unavailable = document.body.hasAttribute("data-unavailable");

  // The page's own URL, fetched again. Built from the origin, not from the page's URL: one with credentials in it
  // (http://user:token@host/) cannot be fetched, nor can a relative URL resolved against it; the browser sends the
  // basic-auth credentials it holds for this origin by itself.
  function load() {
    return fetch(window.location.origin + window.location.pathname + window.location.search, {
      headers: { "Accept": "text/html" },
      credentials: "same-origin"
    });
  }

  function refresh() {
    if (unavailable) {
      load()
        .then(function (response) { if (response.ok) window.location.reload(); })
        .catch(function () { /* the next round tries again */ });
      return;
    }
    if ((box && !box.checked) || document.hidden || busy()) return;
    load()
      // A 503 is the "Redis unreachable" or "Dashboard busy" page: shown in place, and replaced again once the
      // page answers.
      .then(function (response) { return response.ok || response.status === 503 ? response.text() : null; })
      .then(function (text) {
        if (text === null) return;
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("content");
        var current = document.getElementById("content");
        if (fresh && current && !busy()) {
          current.replaceWith(fresh);
          document.body.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () { /* Redis or the dashboard away: the next round tries again. */ });
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.classList.contains("action")) return;
    if (form.getAttribute("data-submitted") !== null) {
      event.preventDefault();
      return;
    }
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
      return;
    }
    form.setAttribute("data-submitted", "");
    var buttons = form.querySelectorAll("button");
    for (var i = 0; i < buttons.length; i++) buttons[i].disabled = true;
  });

  if (secs > 0) window.setInterval(refresh, secs * 1000);
})();
