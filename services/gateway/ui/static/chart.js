// The operator's latency charts (uPlot, vendored under vendor/uplot): per tenant, the mean scheduling latency and
// the mean queue wait of the allocations created in each five-minute bucket of the last six hours.
(function () {
  "use strict";
  var COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                 "#9c755f", "#bab0ac", "#1f77b4", "#2ca02c"];
  var charts = {};

  function draw(id, times, tenants, key) {
    var el = document.getElementById(id);
    if (!el) { return; }
    var series = [{}];
    var data = [times];
    tenants.forEach(function (t, i) {
      series.push({label: t.tenant, stroke: COLOURS[i % COLOURS.length], width: 2, spanGaps: true});
      data.push(t[key]);
    });
    if (charts[id]) { charts[id].destroy(); }
    el.textContent = "";
    var any = tenants.some(function (t) { return t[key].some(function (v) { return v !== null; }); });
    if (!any) { el.textContent = "Nothing to show for the last six hours."; return; }
    charts[id] = new uPlot({width: Math.max(el.clientWidth, 300), height: 200, series: series,
                            axes: [{}, {label: "seconds"}]}, data, el);
  }

  function load() {
    fetch("/ui/data/latency.json", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) {
        if (!d) { return; }
        draw("chart-scheduling", d.times, d.tenants, "scheduling");
        draw("chart-queue", d.times, d.tenants, "queue");
      })
      .catch(function () { /* tried again at the next interval */ });
  }

  load();
  window.setInterval(load, 60000);
}());
