#!/usr/bin/env bash
# Regenerate dashboard-11.6.schema.json: the JSON schema of Grafana's classic dashboard model, made from
# the TypeScript types in @grafana/schema 11.6 (the line grafana-foundation-sdk 11.6 builds for).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm init -y >/dev/null
npm install --silent @grafana/schema@11.6 ts-json-schema-generator@2
npx ts-json-schema-generator --no-type-check --type Dashboard \
  --path node_modules/@grafana/schema/dist/esm/raw/dashboard/x/dashboard_types.gen.d.ts \
  -o "$here/dashboard-11.6.schema.json"
echo "wrote $here/dashboard-11.6.schema.json"
