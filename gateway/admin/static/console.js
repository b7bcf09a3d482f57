// b2bgw operations console: small progressive enhancements; every page works without them.
(function () {
  "use strict";

  // Parts marked data-refresh="URL" are reloaded from that URL (an HTML fragment) every few seconds.
  function refresher(el) {
    var url = el.getAttribute("data-refresh");
    var every = parseInt(el.getAttribute("data-every") || "5", 10) * 1000;
    function tick() {
      if (document.hidden) { return; }
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) { el.innerHTML = html; } })
        .catch(function () { /* the next tick tries again */ });
    }
    setInterval(tick, every);
  }
  document.querySelectorAll("[data-refresh]").forEach(refresher);

  // Buttons with data-confirm ask first.
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-confirm]");
    if (button && !window.confirm(button.getAttribute("data-confirm"))) {
      event.preventDefault();
    }
  });

  // "Select all" for message checkboxes.
  document.querySelectorAll("input[data-select-all]").forEach(function (all) {
    all.addEventListener("change", function () {
      var form = document.getElementById(all.getAttribute("data-select-all"));
      if (!form) { return; }
      form.querySelectorAll("input[name=message_id]").forEach(function (box) { box.checked = all.checked; });
    });
  });
})();
