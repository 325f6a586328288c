// The operator's latency charts (uPlot, vendored under vendor/uplot): per tenant, the mean scheduling latency and
// the mean queue wait of the allocations created in each five-minute bucket of the last six hours.
(function () {
  "use strict";
  // the tenant colours t0..t11 of app.css, so a tenant has one colour on the charts and the fleet map
  var COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f",
                 "#1f77b4", "#2ca02c", "#8c564b", "#17becf"];
  var charts = {};

  function draw(id, d, key) {
    var times = d.times, tenants = d.tenants;
    var el = document.getElementById(id);
    if (!el) { return; }
    var series = [{}];
    var data = [times];
    tenants.forEach(function (t) {
      series.push({label: t.tenant, stroke: COLOURS[t.colour % COLOURS.length], width: 2, spanGaps: true});
      data.push(t[key]);
    });
    if (charts[id]) { charts[id].destroy(); }
    el.textContent = "";
    var any = tenants.some(function (t) { return t[key].some(function (v) { return v !== null; }); });
    if (!any) { el.textContent = "Nothing to show for the last six hours."; return; }
    // the x scale is the whole window, so one bucket alone does not stretch over years
    charts[id] = new uPlot({width: Math.max(el.clientWidth, 300), height: 200, series: series,
                            scales: {x: {time: true, range: [d.from, d.to]}},
                            axes: [{}, {label: "seconds"}]}, data, el);
  }

  function load() {
    fetch("/ui/data/latency.json", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) {
        if (!d) { return; }
        draw("chart-scheduling", d, "scheduling");
        draw("chart-queue", d, "queue");
      })
      .catch(function () { /* tried again at the next interval */ });
  }

  load();
  window.setInterval(load, 60000);
}());
