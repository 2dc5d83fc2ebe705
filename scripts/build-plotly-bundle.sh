#!/usr/bin/env bash
# Build templates/plotly-custom.min.js: plotly.js core plus only the trace types the report
# draws (scripts/plotly-bundle/entry.js), instead of the full 4.8 MB plotly.min.js.
#
# Needs node >= 20 and npm with access to the npm registry. The versions are pinned in
# scripts/plotly-bundle/package.json and package-lock.json (npm ci), so a rebuild of the same
# versions gives the same file. To upgrade: change the versions in package.json, run
# `npm install --package-lock-only` in scripts/plotly-bundle, then run this script and
# `pytest tests/test_report_browser.py`.
#
# Writes, next to the report's templates (they ship in the wheel as energyprof/templates):
#   templates/plotly-custom.min.js     the bundle, with a header naming version, traces and date
#   templates/plotly-custom.json       build record: versions, command, date, sha256, bundled packages
#   templates/plotly.js-LICENSE.txt    plotly.js's licence (MIT)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/scripts/plotly-bundle"
out="$root/templates"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cp "$src/package.json" "$src/package-lock.json" "$src/entry.js" "$work/"
(cd "$work" && npm ci --no-audit --no-fund --loglevel=error)

version="$(node -p "require('$work/node_modules/plotly.js/package.json').version")"
esbuild_version="$(node -p "require('$work/node_modules/esbuild/package.json').version")"
traces="$(node -e "
  const src = require('fs').readFileSync('$work/entry.js', 'utf8');
  console.log([...src.matchAll(/plotly\.js\/lib\/(\w+)'\)/g)].map(m => m[1]).filter(t => t !== 'core').join(','));
")"
date="$(date -u +%Y-%m-%d)"
command="scripts/build-plotly-bundle.sh"

banner="/*! plotly.js v$version (MIT, see plotly.js-LICENSE.txt), custom bundle: core + $traces.
Built $date by $command with esbuild $esbuild_version; do not edit by hand. */"

(cd "$work" && ./node_modules/.bin/esbuild entry.js --bundle --minify --format=iife --global-name=Plotly \
  --target=es2016 --define:global=window --define:define.amd=false --loader:.css=empty \
  --legal-comments=eof --log-level=warning --metafile=meta.json "--banner:js=$banner" \
  --outfile=plotly-custom.min.js)

cp "$work/plotly-custom.min.js" "$out/plotly-custom.min.js"
cp "$work/node_modules/plotly.js/LICENSE" "$out/plotly.js-LICENSE.txt"

# The build record, with every npm package whose code ended up in the bundle and its licence.
node -e "
  const fs = require('fs'), path = require('path'), crypto = require('crypto');
  const work = '$work';
  const meta = JSON.parse(fs.readFileSync(path.join(work, 'meta.json'), 'utf8'));
  const inputs = Object.values(meta.outputs).find(o => o.entryPoint).inputs;
  const pkgs = {};
  for (const file of Object.keys(inputs)) {
    const parts = file.split('/');
    const i = parts.lastIndexOf('node_modules');
    if (i < 0) continue;
    const name = parts[i + 1].startsWith('@') ? parts[i + 1] + '/' + parts[i + 2] : parts[i + 1];
    const dir = parts.slice(0, i + 1).join('/') + '/' + name;
    if (pkgs[dir]) continue;
    const pj = JSON.parse(fs.readFileSync(path.join(work, dir, 'package.json'), 'utf8'));
    pkgs[dir] = {name: pj.name, version: pj.version, license: pj.license || 'see package'};
  }
  const bundle = fs.readFileSync(path.join(work, 'plotly-custom.min.js'));
  const record = {
    file: 'plotly-custom.min.js',
    plotly_js: '$version',
    traces: '$traces'.split(','),
    built: '$date',
    command: '$command',
    esbuild: '$esbuild_version',
    node: process.version,
    bytes: bundle.length,
    sha256: crypto.createHash('sha256').update(bundle).digest('hex'),
    licence: 'plotly.js-LICENSE.txt (MIT); bundled packages below keep their own licences, '
           + 'whose notices esbuild keeps at the end of the bundle',
    bundled_packages: Object.values(pkgs).sort((a, b) => a.name.localeCompare(b.name)),
  };
  fs.writeFileSync('$out/plotly-custom.json', JSON.stringify(record, null, 2) + '\n');
  console.log('plotly.js ' + record.plotly_js + ' [' + record.traces + ']: ' + record.bytes + ' bytes');
"
