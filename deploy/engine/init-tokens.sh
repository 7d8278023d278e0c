#!/bin/sh
# One-shot `tokens` service of docker-compose.yml: makes the API tokens of the local stack on
# first start, into the `gpuops-secrets` volume, so that no token is ever committed.
#   alertmanager-token  bearer token Alertmanager sends to POST /api/v1/alertmanager
#   admin-token         bearer token for `gpuops --url http://127.0.0.1:9843 ...` (role admin)
#   tokens.yaml         what the engine reads: names, roles and SHA-256 of the tokens only
# Existing tokens are kept; delete the volume to make new ones.
#   db-password         (in the `db-secret` volume) PostgreSQL's password, profile `ha`
set -eu
dir=${GPUOPS_SECRETS_DIR:-/var/lib/gpuops/secrets}
db_dir=${GPUOPS_DB_SECRET_DIR:-/var/lib/gpuops/db}

# the PostgreSQL password: readable by the postgres and engine containers only (its own volume)
if [ -d "$db_dir" ] && [ ! -s "$db_dir/db-password" ]; then
    umask 022
    python3 -c 'import secrets; print(secrets.token_urlsafe(32))' >"$db_dir/db-password.tmp"
    mv "$db_dir/db-password.tmp" "$db_dir/db-password"
    echo "tokens: made the PostgreSQL password"
fi

if [ -s "$dir/tokens.yaml" ]; then
    echo "tokens: $dir/tokens.yaml exists, keeping it"
    exit 0
fi

new_token() { python3 -c 'import secrets; print(secrets.token_urlsafe(32))'; }
sha256() { printf %s "$1" | sha256sum | cut -d' ' -f1; }

alertmanager=$(new_token)
admin=$(new_token)
# The volume is mounted only into the engine and Alertmanager (user nobody, which must read its
# token).
umask 022
printf '%s\n' "$alertmanager" >"$dir/alertmanager-token"
printf '%s\n' "$admin" >"$dir/admin-token"
chmod 600 "$dir/admin-token"     # the engine's user only, not Alertmanager's
cat >"$dir/tokens.yaml.tmp" <<YAML
users:
  - {name: alertmanager, roles: [alertmanager], token_sha256: $(sha256 "$alertmanager")}
  - {name: admin, roles: [admin], token_sha256: $(sha256 "$admin")}
YAML
mv "$dir/tokens.yaml.tmp" "$dir/tokens.yaml"
echo "tokens: made; the admin token is in $dir/admin-token of the engine container"
