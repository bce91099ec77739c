#!/usr/bin/env bash
# azd postdeploy: the Event Grid subscription to OrderTrigger, then a smoke
# test.
#
# The subscription is made here, not in the template: Event Grid checks
# that OrderTrigger exists when a subscription to it is made, and it exists
# only once the package is deployed. It is one PUT of the whole resource
# (az rest: the CLI's own command cannot name a user-assigned identity for
# dead-lettering), the same on every `azd up`, after `azd down` too:
# nothing is remembered between runs. Event Grid may not see a function
# deployed seconds ago, so the PUT is tried again for a while; if it still
# fails, `azd up` fails, saying how to run this hook again.
#
# The smoke test publishes samples/publish.json (no `topic`: Event Grid
# refuses one that is not the topic's own id) with a fresh order id, twice
# (Event Grid delivers at least once), as this identity, an EventGrid Data
# Sender (local authentication is off; a role granted minutes ago may still
# be refused: 401/403 are tried again for a while), then reads the order's
# status until it is executed. The deployment is done by then: a smoke test
# that fails is a warning naming the cause and where to look, and `azd up`
# ends green.
set -euo pipefail
cd "$(dirname "$0")/../.."
. infra/hooks/lib.sh
: "${AZURE_SUBSCRIPTION_ID:?}" "${EVENT_GRID_TOPIC_ID:?}" "${EVENT_GRID_TOPIC_ENDPOINT:?}" \
  "${AZURE_FUNCTION_APP_ID:?}" "${AZURE_IDENTITY_ID:?}" "${DEAD_LETTER_CONTAINER_ID:?}" \
  "${ORDER_EVENT_TYPES:?}"
find_python
# How long to keep trying (seconds): Event Grid seeing the function, the
# role reaching the topic, the order executed (a plan at zero starts first).
: "${ORDER_GUARD_HOOK_PATIENCE:=300}"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# ---- the subscription: one event a delivery (a batch is all-or-none in
# the handler), Event Grid's retries for a day, then the dead-letter
# container, written through the app's identity.
storage_id=${DEAD_LETTER_CONTAINER_ID%/blobServices/default/containers/*}
container=${DEAD_LETTER_CONTAINER_ID##*/}
"$PYTHON" - "$AZURE_FUNCTION_APP_ID" "$ORDER_EVENT_TYPES" "$AZURE_IDENTITY_ID" \
  "$storage_id" "$container" >"$scratch/subscription.json" <<'PY'
import json, sys
app, types, identity, storage, container = sys.argv[1:6]
print(json.dumps({"properties": {
    "eventDeliverySchema": "EventGridSchema",
    "destination": {"endpointType": "AzureFunction", "properties": {
        "resourceId": app + "/functions/OrderTrigger",
        "maxEventsPerBatch": 1,
        "preferredBatchSizeInKilobytes": 64}},
    "filter": {"includedEventTypes": [t.strip() for t in types.split(",") if t.strip()]},
    "retryPolicy": {"maxDeliveryAttempts": 30, "eventTimeToLiveInMinutes": 1440},
    "deadLetterWithResourceIdentity": {
        "identity": {"type": "UserAssigned", "userAssignedIdentity": identity},
        "deadLetterDestination": {"endpointType": "StorageBlob", "properties": {
            "resourceId": storage, "blobContainerName": container}}}}}))
PY
url="$EVENT_GRID_TOPIC_ID/providers/Microsoft.EventGrid/eventSubscriptions/orders-to-guard?api-version=2025-02-15"
echo "==> the Event Grid subscription orders-to-guard to OrderTrigger"
deadline=$((SECONDS + ORDER_GUARD_HOOK_PATIENCE))
until made=$(azs rest --method put --url "$url" --body "@$scratch/subscription.json" --output none 2>&1); do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "error: Event Grid did not take the subscription to OrderTrigger within $ORDER_GUARD_HOOK_PATIENCE s:" >&2
    echo "$made" >&2
    echo "The app is deployed; make the subscription by running this hook again: azd hooks run postdeploy" >&2
    exit 1
  fi
  echo "    not yet ($(printf '%s' "$made" | head -1)); again in $ORDER_GUARD_HOOK_PAUSE s"
  sleep "$ORDER_GUARD_HOOK_PAUSE"
done

# ---- the smoke test
order="smoke-$(date -u +%Y%m%d-%H%M%S)-$RANDOM"
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
"$PYTHON" - samples/publish.json "$order" "$now" >"$scratch/event.json" <<'PY'
import json, sys, uuid
sample, order, now = sys.argv[1:4]
with open(sample) as f:
    events = json.load(f)
for e in events:
    e["id"] = str(uuid.uuid4())
    e["subject"] = "orders/" + order
    e["eventTime"] = now
    e["data"]["orderId"] = order
    e["data"]["placedAt"] = now
print(json.dumps(events))
PY
smoke_failed() {
  warn "smoke test: $1"
  warn "the deployment itself is done. Look with: azd env get-values (export them), then"
  warn "  cargo run --release -- status $order      the order's row"
  warn "  the function app's Log stream in the portal, or Application Insights' traces"
  warn "and publish again: azd hooks run postdeploy"
  exit 0
}
echo "==> smoke test: order $order published twice to the topic, then read back"
token=$(azs account get-access-token --resource https://eventgrid.azure.net --query accessToken -o tsv) \
  || smoke_failed "no Event Grid token for this identity (az account get-access-token)"
deadline=$((SECONDS + ORDER_GUARD_HOOK_PATIENCE))
published=0
while [ "$published" -lt 2 ]; do
  code=$(curl -sS -o "$scratch/answer" -w '%{http_code}' -X POST \
    "$EVENT_GRID_TOPIC_ENDPOINT?api-version=2018-01-01" \
    -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    --data-binary "@$scratch/event.json") || code=000
  case "$code" in
    200) published=$((published + 1)); continue ;;
    401|403)
      [ "$SECONDS" -lt "$deadline" ] \
        || smoke_failed "the topic still refuses this identity ($code) after $ORDER_GUARD_HOOK_PATIENCE s: it needs EventGrid Data Sender on the topic (the template grants it; a new role can take minutes to apply)"
      echo "    the topic answered $code (the EventGrid Data Sender role may not apply yet); again in $ORDER_GUARD_HOOK_PAUSE s" ;;
    *) smoke_failed "publishing to $EVENT_GRID_TOPIC_ENDPOINT answered $code: $(head -c 500 "$scratch/answer" 2>/dev/null)" ;;
  esac
  sleep "$ORDER_GUARD_HOOK_PAUSE"
done
deadline=$((SECONDS + ORDER_GUARD_HOOK_PATIENCE))
while :; do
  status=$(cargo run --release --quiet -- status "$order" 2>&1 || true)
  if grep -q "^order   $order Executed" <<<"$status"; then
    printf '%s\n' "$status"
    echo "==> smoke test passed: $order executed"
    break
  fi
  [ "$SECONDS" -lt "$deadline" ] \
    || smoke_failed "$order was not executed within $ORDER_GUARD_HOOK_PATIENCE s; its last status: $status"
  sleep "$ORDER_GUARD_HOOK_PAUSE"
done
