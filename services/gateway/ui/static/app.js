// The dashboard's live updates: one EventSource per page (/ui/stream). Events are coalesced for 200 ms, then
// only the fragments whose data-on topics were touched are re-fetched and swapped: a burst costs one repaint.
(function () {
  "use strict";
  var COALESCE_MS = 200;
  var fragments = Array.prototype.slice.call(document.querySelectorAll("[data-fragment]"));
  var pending = {};
  var timer = null;
  var source = null;

  function topics(el) {
    return (el.getAttribute("data-on") || "").split(" ").filter(Boolean);
  }

  function toLogin() {
    window.location.assign("/ui/login");
  }

  function swap(el) {
    return fetch(el.getAttribute("data-fragment"), {credentials: "same-origin", headers: {Accept: "text/html"}})
      .then(function (r) {
        if (r.status === 401) { toLogin(); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html !== null) { el.innerHTML = html; }   // the server's own escaped HTML
      })
      .catch(function () { /* the next event or reconnect tries again */ });
  }

  function refresh() {
    var touched = pending;
    pending = {};
    timer = null;
    var due = fragments.filter(function (el) {
      return topics(el).some(function (t) { return touched[t]; });
    });
    Promise.all(due.map(swap)).then(function () {
      document.body.setAttribute("data-refreshed", String(Date.now()));
    });
  }

  function note(topic) {
    pending[topic] = true;
    if (timer === null) { timer = window.setTimeout(refresh, COALESCE_MS); }
  }

  function connect() {
    var after = document.body.getAttribute("data-after");
    var last = source && source.lastEventId && /^[0-9]+$/.test(source.lastEventId) ? source.lastEventId : after;
    source = new EventSource("/ui/stream" + (last ? "?after=" + encodeURIComponent(last) : ""));
    source.addEventListener("allocation", function (ev) {
      var d = JSON.parse(ev.data);
      note("allocation");
      note("allocation:" + d.allocation_id);
      document.body.setAttribute("data-after", String(d.seq));
    });
    source.addEventListener("node", function () { note("node"); });
    source.onerror = function () {
      if (source.readyState !== EventSource.CLOSED) { return; }   // the browser reconnects by itself
      fetch("/ui/fragments/counters", {credentials: "same-origin"}).then(function (r) {
        if (r.status === 401) { toLogin(); } else { window.setTimeout(connect, 3000); }
      }).catch(function () { window.setTimeout(connect, 3000); });
    };
  }

  // fragments that would hold the page (a node's console) are fetched once it has loaded
  fragments.filter(function (el) { return el.getAttribute("data-load") === "after"; }).forEach(swap);
  if (fragments.length) { connect(); }
}());
