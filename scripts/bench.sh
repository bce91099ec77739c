#!/usr/bin/env bash
# The benchmark (docs/benchmarks.md): builds release binaries, starts its own
# redis-server (loopback, free port, no persistence, temp dir), the handler
# (`order-guard serve`: Redis guard + a fresh SQLite file, RUST_LOG=warn so
# logging does not dominate; a second one with its cache of finished orders
# off, for the duplicate path through Redis) and the HTTP-ceiling server, then
# runs the load
# generator (examples/bench/), which prints the table and writes
# target/bench/results.json and target/bench/latency_*.png.
# Everything it starts is stopped on exit. About five minutes with the defaults.
# BENCH_MSSQL=0, BENCH_CLUSTER=0, BENCH_TELEMETRY=0, BENCH_WEBHOOK=0 leave out
# a handler; BENCH_STORE=0 and BENCH_OUTBOX=0 the examples run after it.
#
# Arguments are passed to the load generator, e.g.
#   scripts/bench.sh --rounds 5 --seconds 3
#   scripts/bench.sh --concurrency 1,8,32 --cold-starts 10
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis.sh

echo "==> cargo build --release (order-guard, examples/bench)"
cargo build --release --bin order-guard --example bench --example store_latency --example outbox_bench
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null || echo target)"
BIN="$TARGET_DIR/release/order-guard"
BENCH="$TARGET_DIR/release/examples/bench"
OUT="${BENCH_OUT:-target/bench}"
mkdir -p "$OUT"

# Scratch on the disk the working tree is on (not tmpfs): SQLite's fsyncs are
# what the first-delivery path pays, so they must be real.
SCRATCH_PARENT="${BENCH_SCRATCH_PARENT:-$PWD/target}"
mkdir -p "$SCRATCH_PARENT"
SCRATCH="$(mktemp -d "$SCRATCH_PARENT/bench-scratch.XXXXXX")"
PIDS=()
cleanup() {
  local status=$?
  # A failed run shows what the servers it started said before their
  # scratch directory goes (a refused connection names no one otherwise).
  if [ "$status" != 0 ]; then
    for log in "$SCRATCH"/*.log; do
      [ -s "$log" ] || continue
      echo "--- last lines of $(basename "$log") ---" >&2
      tail -n 20 "$log" >&2
    done
  fi
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$SCRATCH"
  if [ -n "${STARTED_ENGINE:-}" ]; then scripts/tsql-engine.sh stop || true; fi
}
trap cleanup EXIT INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# wait_port PORT NAME: up to 20 s for something to listen on 127.0.0.1:PORT.
wait_port() {
  for _ in $(seq 1 400); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
      return 0
    fi
    sleep 0.05
  done
  echo "error: $2 did not listen on port $1 within 20 s" >&2
  exit 1
}

REDIS_PORT="$(free_port)"
echo "==> redis-server on 127.0.0.1:$REDIS_PORT ($(redis-server --version | awk '{print $3}'))"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --daemonize no --dir "$SCRATCH" --logfile "$SCRATCH/redis.log" &
REDIS_PID="$!"
PIDS+=("$REDIS_PID")
wait_port "$REDIS_PORT" redis-server

HANDLER_PORT="$(free_port)"
echo "==> order-guard serve on 127.0.0.1:$HANDLER_PORT (RUST_LOG=warn, sqlite:$SCRATCH/orders.db)"
FUNCTIONS_CUSTOMHANDLER_PORT="$HANDLER_PORT" \
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
  SQL_CONNECTION_STRING="sqlite:$SCRATCH/orders.db?mode=rwc" \
  RUST_LOG=warn \
  "$BIN" serve >"$SCRATCH/handler.log" 2>&1 &
HANDLER_PID="$!"
PIDS+=("$HANDLER_PID")
wait_port "$HANDLER_PORT" order-guard

# The same with the cache of finished orders off (its own key prefix and
# SQLite file): every duplicate asks Redis.
REDIS_HANDLER_PORT="$(free_port)"
echo "==> order-guard serve on 127.0.0.1:$REDIS_HANDLER_PORT (ORDER_CACHE_MB=0: duplicates through Redis)"
FUNCTIONS_CUSTOMHANDLER_PORT="$REDIS_HANDLER_PORT" \
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
  GUARD_KEY_PREFIX="ordnc:" \
  ORDER_CACHE_MB=0 \
  SQL_CONNECTION_STRING="sqlite:$SCRATCH/orders-nocache.db?mode=rwc" \
  RUST_LOG=warn \
  "$BIN" serve >"$SCRATCH/handler-nocache.log" 2>&1 &
REDIS_HANDLER_PID="$!"
PIDS+=("$REDIS_HANDLER_PID")
wait_port "$REDIS_HANDLER_PORT" "order-guard (cache off)"

# Event Grid's own door: `order-guard webhook` on the same Redis (its own
# key prefix and SQLite file), measured beside the Functions door in the
# same rounds: duplicates and first deliveries, and deliveries of 100
# events, each with Microsoft Entra ID on: a local issuer (an RSA key made
# by openssl, the tenant's JWKS and OpenID configuration documents served
# by python3's http.server on loopback) stands in for Entra ID, and every
# delivery carries a token it signed, checked as Event Grid's would be.
# One more round of the webhook's phases runs with the issuer stopped
# (SIGSTOP): a key endpoint outage during load. BENCH_WEBHOOK=0 skips it.
WEBHOOK_ARGS=()
if [ "${BENCH_WEBHOOK:-1}" != 0 ]; then
  TENANT=11111111-2222-3333-4444-555555555555
  AUDIENCE=api://order-guard-bench
  ISSUER_DIR="$SCRATCH/issuer"
  mkdir -p "$ISSUER_DIR/$TENANT/discovery/v2.0" "$ISSUER_DIR/$TENANT/.well-known" "$ISSUER_DIR/$TENANT/v2.0/.well-known"
  openssl genrsa -out "$SCRATCH/issuer.pem" 2048 2>/dev/null
  MODULUS="$(openssl rsa -in "$SCRATCH/issuer.pem" -noout -modulus | sed 's/^Modulus=//')"
  WEBHOOK_TOKEN="$(python3 - "$ISSUER_DIR" "$TENANT" "$AUDIENCE" "$MODULUS" "$SCRATCH/issuer.pem" <<'PY'
import base64, json, subprocess, sys, time
root, tenant, audience, modulus, pem = sys.argv[1:]
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
jwk = {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": "bench-key", "n": b64(bytes.fromhex(modulus)), "e": "AQAB"}
json.dump({"keys": [jwk]}, open(f"{root}/{tenant}/discovery/v2.0/keys", "w"))
json.dump({"issuer": f"https://sts.windows.net/{tenant}/"}, open(f"{root}/{tenant}/.well-known/openid-configuration", "w"))
json.dump({"issuer": f"https://login.microsoftonline.com/{tenant}/v2.0"}, open(f"{root}/{tenant}/v2.0/.well-known/openid-configuration", "w"))
now = int(time.time())
claims = {"aud": audience, "iss": f"https://sts.windows.net/{tenant}/", "iat": now, "nbf": now, "exp": now + 4 * 3600,
          "appid": "4962773b-9cdb-44cf-a8bf-237846a00ab7", "roles": ["AzureEventGridSecureWebhookSubscriber"], "tid": tenant}
signed = b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "bench-key"}).encode()) + "." + b64(json.dumps(claims).encode())
signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", pem], input=signed.encode(), capture_output=True, check=True).stdout
print(signed + "." + b64(signature))
PY
)"
  ISSUER_PORT="$(free_port)"
  python3 -m http.server --bind 127.0.0.1 --directory "$ISSUER_DIR" "$ISSUER_PORT" >"$SCRATCH/issuer.log" 2>&1 &
  ISSUER_PID="$!"
  PIDS+=("$ISSUER_PID")
  wait_port "$ISSUER_PORT" "local token issuer"
  WEBHOOK_PORT="$(free_port)"
  echo "==> order-guard webhook on 0.0.0.0:$WEBHOOK_PORT (Entra ID on, local issuer on 127.0.0.1:$ISSUER_PORT, sqlite:$SCRATCH/orders-webhook.db)"
  WEBHOOK_PORT="$WEBHOOK_PORT" WEBHOOK_TENANT_ID="$TENANT" WEBHOOK_AUDIENCE="$AUDIENCE" \
    WEBHOOK_AUTHORITY="http://127.0.0.1:$ISSUER_PORT" \
    REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
    GUARD_KEY_PREFIX="ordwh:" \
    SQL_CONNECTION_STRING="sqlite:$SCRATCH/orders-webhook.db?mode=rwc" \
    RUST_LOG=warn \
    "$BIN" webhook >"$SCRATCH/handler-webhook.log" 2>&1 &
  PIDS+=("$!")
  WEBHOOK_ARGS=(--webhook-handler "127.0.0.1:$WEBHOOK_PORT" --webhook-handler-pid "$!"
    --webhook-token "$WEBHOOK_TOKEN" --webhook-issuer-pid "$ISSUER_PID")
  wait_port "$WEBHOOK_PORT" "order-guard webhook"
fi

# The first handler's configuration plus an OTLP exporter to a local sink
# (`bench otlp-sink`, which takes every export): what telemetry costs in CPU
# per event, measured beside the plain handler in the same rounds.
# BENCH_TELEMETRY=0 skips it. Its traces are sampled as Functions samples
# them by default (Application Insights: `microsoft.rate_limited`, 5 a
# second; BENCH_OTEL_SAMPLER_ARG another rate); BENCH_OTEL_SAMPLER chooses
# another sampler, with BENCH_OTEL_SAMPLER_ARG its argument (`always_on`:
# every trace, the default with OTLP only).
TELEMETRY_ARGS=()
if [ "${BENCH_TELEMETRY:-1}" != 0 ]; then
  OTEL_SAMPLER="${BENCH_OTEL_SAMPLER:-microsoft.rate_limited}"
  if [ -z "${BENCH_OTEL_SAMPLER:-}" ]; then
    OTEL_SAMPLER_ARG="${BENCH_OTEL_SAMPLER_ARG:-5}"
  else
    OTEL_SAMPLER_ARG="${BENCH_OTEL_SAMPLER_ARG:-}"
  fi
  SINK_PORT="$(free_port)"
  "$BENCH" otlp-sink --port "$SINK_PORT" >"$SCRATCH/otlp-sink.log" 2>&1 &
  PIDS+=("$!")
  wait_port "$SINK_PORT" "otlp sink"
  OTEL_HANDLER_PORT="$(free_port)"
  echo "==> order-guard serve on 127.0.0.1:$OTEL_HANDLER_PORT (as the first, plus OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$SINK_PORT, OTEL_TRACES_SAMPLER=$OTEL_SAMPLER OTEL_TRACES_SAMPLER_ARG=${OTEL_SAMPLER_ARG:-(unset)})"
  FUNCTIONS_CUSTOMHANDLER_PORT="$OTEL_HANDLER_PORT" \
    REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
    GUARD_KEY_PREFIX="ordot:" \
    SQL_CONNECTION_STRING="sqlite:$SCRATCH/orders-otel.db?mode=rwc" \
    OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$SINK_PORT" \
    OTEL_TRACES_SAMPLER="$OTEL_SAMPLER" \
    OTEL_TRACES_SAMPLER_ARG="$OTEL_SAMPLER_ARG" \
    RUST_LOG=warn \
    "$BIN" serve >"$SCRATCH/handler-otel.log" 2>&1 &
  PIDS+=("$!")
  TELEMETRY_ARGS=(--telemetry-handler "127.0.0.1:$OTEL_HANDLER_PORT" --telemetry-handler-pid "$!")
  wait_port "$OTEL_HANDLER_PORT" "order-guard (OTLP exporter)"
fi

# The SQL Server store on the T-SQL engine, when it is there: a second
# handler on the same Redis (its own key prefix) and a fresh database.
MSSQL_ARGS=()
if [ "${BENCH_MSSQL:-1}" != 0 ] && ENGINE="$(scripts/tsql-engine.sh path 2>/dev/null)"; then
  MSSQL_ADO="$(scripts/tsql-engine.sh start "og_bench_$(date +%s)")"
  STARTED_ENGINE=1
  MSSQL_PORT="$(free_port)"
  echo "==> order-guard serve on 127.0.0.1:$MSSQL_PORT (SQL Server store on the T-SQL engine, $ENGINE; SQL_POOL_SIZE=32, ORDER_CACHE_MB=0)"
  FUNCTIONS_CUSTOMHANDLER_PORT="$MSSQL_PORT" \
    REDIS_URL="redis://127.0.0.1:$REDIS_PORT" \
    GUARD_KEY_PREFIX="ordms:" \
    ORDER_CACHE_MB=0 \
    SQL_CONNECTION_STRING="$MSSQL_ADO" \
    SQL_POOL_SIZE=32 \
    RUST_LOG=warn \
    "$BIN" serve >"$SCRATCH/handler-mssql.log" 2>&1 &
  PIDS+=("$!")
  MSSQL_ARGS=(--sqlserver-handler "127.0.0.1:$MSSQL_PORT" --sqlserver-handler-pid "$!" --sqlserver "$MSSQL_ADO")
  wait_port "$MSSQL_PORT" "order-guard (SQL Server)"
else
  echo "==> no T-SQL engine found: SQL Server figures are not measured"
fi

# A Redis cluster (three masters, three replicas, loopback, no persistence)
# and a third handler on it (REDIS_CLUSTER=true, its own SQLite file): the
# duplicate path on the cluster, measured beside the single node's.
# BENCH_CLUSTER=0 skips it.
CLUSTER_ARGS=()
if [ "${BENCH_CLUSTER:-1}" != 0 ]; then
  CLUSTER_NODES=()
  for i in 1 2 3 4 5 6; do
    port="$(free_port)"
    bus="$(free_port)"
    mkdir -p "$SCRATCH/cluster-$i"
    redis-server --port "$port" --cluster-port "$bus" --bind 127.0.0.1 \
      --cluster-enabled yes --cluster-config-file nodes.conf --save "" --appendonly no \
      --daemonize no --dir "$SCRATCH/cluster-$i" --logfile "$SCRATCH/cluster-$i/redis.log" &
    PIDS+=("$!")
    CLUSTER_NODES+=("127.0.0.1:$port")
  done
  for node in "${CLUSTER_NODES[@]}"; do wait_port "${node#*:}" "cluster node $node"; done
  redis-cli --cluster create "${CLUSTER_NODES[@]}" --cluster-replicas 1 --cluster-yes >"$SCRATCH/cluster-create.log"
  for _ in $(seq 1 400); do
    ok=1
    for node in "${CLUSTER_NODES[@]}"; do
      redis-cli -p "${node#*:}" cluster info | grep -q '^cluster_state:ok' || ok=0
    done
    [ "$ok" = 1 ] && break
    sleep 0.05
  done
  [ "$ok" = 1 ] || { echo "error: the Redis cluster did not reach cluster_state:ok" >&2; exit 1; }
  CLUSTER_HANDLER_PORT="$(free_port)"
  echo "==> order-guard serve on 127.0.0.1:$CLUSTER_HANDLER_PORT (Redis cluster of 3 masters + 3 replicas, REDIS_CLUSTER=true, ORDER_CACHE_MB=0)"
  FUNCTIONS_CUSTOMHANDLER_PORT="$CLUSTER_HANDLER_PORT" \
    REDIS_URL="redis://${CLUSTER_NODES[0]}" \
    REDIS_CLUSTER=true \
    ORDER_CACHE_MB=0 \
    SQL_CONNECTION_STRING="sqlite:$SCRATCH/orders-cluster.db?mode=rwc" \
    RUST_LOG=warn \
    "$BIN" serve >"$SCRATCH/handler-cluster.log" 2>&1 &
  PIDS+=("$!")
  CLUSTER_ARGS=(--cluster-handler "127.0.0.1:$CLUSTER_HANDLER_PORT" --cluster-handler-pid "$!")
  wait_port "$CLUSTER_HANDLER_PORT" "order-guard (Redis cluster)"
fi

CEILING_PORT="$(free_port)"
echo "==> HTTP ceiling server on 127.0.0.1:$CEILING_PORT"
"$BENCH" ceiling-server --port "$CEILING_PORT" >"$SCRATCH/ceiling.log" 2>&1 &
CEILING_PID="$!"
PIDS+=("$CEILING_PID")
wait_port "$CEILING_PORT" ceiling-server

echo "==> machine: $(nproc) vCPU, $(lscpu | sed -n 's/^Model name: *//p')"
echo "==> load generator"
# The whole run is bounded: the generator stops by itself; this is a backstop.
timeout 600 "$BENCH" run \
  --handler "127.0.0.1:$HANDLER_PORT" --handler-pid "$HANDLER_PID" \
  --redis-handler "127.0.0.1:$REDIS_HANDLER_PORT" --redis-handler-pid "$REDIS_HANDLER_PID" \
  --ceiling "127.0.0.1:$CEILING_PORT" --ceiling-pid "$CEILING_PID" \
  --redis-url "redis://127.0.0.1:$REDIS_PORT" --redis-pid "$REDIS_PID" \
  --binary "$BIN" --scratch "$SCRATCH/cold" --out "$OUT" "${MSSQL_ARGS[@]}" "${CLUSTER_ARGS[@]}" \
  "${TELEMETRY_ARGS[@]}" "${WEBHOOK_ARGS[@]}" "$@"

# The store on the wire: SQL round trips per first delivery and
# per duplicate counted by a TCP proxy, 1 ms added each way, concurrency and
# a hot account; SQLite first deliveries through the processor; with the
# engine's command, the recovery of one store and of three on an engine of
# its own after a restart, a cut and a silent drop (about 4 min).
# BENCH_STORE=0 skips it.
if [ "${BENCH_STORE:-1}" != 0 ]; then
  echo "==> the store on the wire (examples/store_latency)"
  ORDER_GUARD_TEST_MSSQL="${MSSQL_ADO:-}" ORDER_GUARD_TSQL_SERVER="${ENGINE:-}" \
    timeout 900 "$TARGET_DIR/release/examples/store_latency" 200
fi

# The outbox: dispatch latency after the commit, throughput
# against the queue's ceiling, the first-delivery path with dispatch on and
# off (to the queue and to an Event Grid topic), and a million rows in the
# table, on SQLite and, with the engine, on a database of its own
# (examples/outbox_bench).
# BENCH_OUTBOX=0 skips it.
if [ "${BENCH_OUTBOX:-1}" != 0 ]; then
  echo "==> the outbox (examples/outbox_bench)"
  scripts/ensure-azurite.sh
  OUTBOX_ADO=""
  if [ -n "${STARTED_ENGINE:-}" ]; then
    OUTBOX_ADO="$(scripts/tsql-engine.sh start "og_outbox_$(date +%s)")"
  fi
  ORDER_GUARD_TEST_MSSQL="$OUTBOX_ADO" \
    timeout 1800 "$TARGET_DIR/release/examples/outbox_bench" "${BENCH_OUTBOX_ORDERS:-2000}"
fi

if ! kill -0 "$HANDLER_PID" 2>/dev/null; then
  echo "error: the handler died during the run; its log:" >&2
  tail -n 50 "$SCRATCH/handler.log" >&2
  exit 1
fi
if grep -qE ' (WARN|ERROR) ' "$SCRATCH/handler.log"; then
  echo "==> the handler logged warnings or errors during the run:"
  grep -E ' (WARN|ERROR) ' "$SCRATCH/handler.log" | head -n 20
fi
