#!/usr/bin/env bash
# azd preprovision: the deploying user's sign-in name, which Azure SQL's
# Entra admin needs beside the object id azd already knows
# (AZURE_PRINCIPAL_ID).
set -euo pipefail
name=$(az ad signed-in-user show --query userPrincipalName -o tsv)
azd env set AZURE_PRINCIPAL_NAME "$name"
