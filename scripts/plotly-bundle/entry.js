// The report's plotly.js: core plus only the trace types the report draws.
// Add a trace here (and rebuild with scripts/build-plotly-bundle.sh) before using it in the report.
'use strict';

var Plotly = require('plotly.js/lib/core');

Plotly.register([
    require('plotly.js/lib/icicle'),
    require('plotly.js/lib/scatter'),
]);

module.exports = Plotly;
