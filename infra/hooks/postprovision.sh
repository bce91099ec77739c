#!/usr/bin/env bash
# azd postprovision: what the template cannot do in the database. As its
# Entra admin (the deploying user or service principal:
# SQL_CONNECTION_STRING from the outputs is Active Directory Default, the
# az login), run `migrate` (the schema and the role order_guard_app), then
# make the app's database user, named after its identity, a member of that
# role. Both are idempotent: a later `azd provision` (an upgrade,
# CHANGELOG.md) runs them again.
set -euo pipefail
cd "$(dirname "$0")/../.."
. infra/hooks/lib.sh
: "${AZURE_SUBSCRIPTION_ID:?}" "${AZURE_RESOURCE_GROUP:?}" "${SQL_SERVER_NAME:?}" "${SQL_SERVER_FQDN:?}" \
  "${SQL_DATABASE_NAME:?}" "${AZURE_IDENTITY_NAME:?}" "${SQL_CONNECTION_STRING:?}"

# This machine reaches the server (the template lets Azure's services in).
if ! ip=$(curl -sS --fail --max-time 20 https://api.ipify.org); then
  echo "error: cannot learn this machine's public address (https://api.ipify.org) for the SQL firewall rule azd-deployer; add one for your address yourself:" >&2
  echo "  az sql server firewall-rule create --subscription $AZURE_SUBSCRIPTION_ID -g $AZURE_RESOURCE_GROUP -s $SQL_SERVER_NAME -n azd-deployer --start-ip-address <ip> --end-ip-address <ip>" >&2
  echo "then run: azd hooks run postprovision" >&2
  exit 1
fi
azs sql server firewall-rule create --resource-group "$AZURE_RESOURCE_GROUP" \
  --server "$SQL_SERVER_NAME" --name azd-deployer \
  --start-ip-address "$ip" --end-ip-address "$ip" --output none

echo "==> order-guard migrate (as the database's Entra admin)"
cargo run --release --quiet -- migrate

echo "==> the app's database user [$AZURE_IDENTITY_NAME] in order_guard_app"
sqlcmd -S "tcp:$SQL_SERVER_FQDN,1433" -d "$SQL_DATABASE_NAME" --authentication-method ActiveDirectoryAzCli \
  -Q "IF DATABASE_PRINCIPAL_ID(N'$AZURE_IDENTITY_NAME') IS NULL CREATE USER [$AZURE_IDENTITY_NAME] FROM EXTERNAL PROVIDER; ALTER ROLE order_guard_app ADD MEMBER [$AZURE_IDENTITY_NAME];"
