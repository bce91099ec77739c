#!/usr/bin/env bash
# azd postdeploy: the Event Grid subscription, then a smoke test.
#
# Event Grid checks that OrderTrigger exists when the subscription is made,
# so the first deploy sets ORDER_SUBSCRIPTION and provisions again, which
# adds it (infra/app/messaging.bicep). Then the sample delivery is published
# twice to the topic (as you, an EventGrid Data Sender: local auth is off)
# and the order's status read until it is executed.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${EVENT_GRID_TOPIC_ENDPOINT:?}"

if [ "${ORDER_SUBSCRIPTION:-false}" != true ]; then
  echo "==> the Event Grid subscription to OrderTrigger (azd provision)"
  azd env set ORDER_SUBSCRIPTION true
  azd provision --no-prompt
fi

order=ord-20250614-00731
echo "==> smoke test: samples/delivery.json published twice, $order read back"
token=$(az account get-access-token --resource https://eventgrid.azure.net --query accessToken -o tsv)
for _ in 1 2; do
  curl -sS --fail-with-body -X POST "$EVENT_GRID_TOPIC_ENDPOINT?api-version=2018-01-01" \
    -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    --data @samples/delivery.json
done
# Event Grid delivers within seconds; a plan scaled to zero starts first.
deadline=$((SECONDS + 180))
while :; do
  status=$(cargo run --release --quiet -- status "$order" 2>&1 || true)
  if grep -q "^order   $order Executed" <<<"$status"; then
    echo "$status"
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "smoke test failed: $order not executed within 180 s; last status:" >&2
    echo "$status" >&2
    exit 1
  fi
  sleep 10
done
