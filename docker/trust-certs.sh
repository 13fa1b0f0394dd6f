#!/bin/sh
# Trust every *.crt / *.pem file in folder $1 (docker/certs/ in the build context): a corporate
# proxy's CA, or a whole bundle, for pip during the build and for downloads at run time.
# Without any, the image trusts its base's certificates only.
set -eu
found=0
for cert in "$1"/*.crt "$1"/*.pem; do
  [ -f "$cert" ] || continue
  found=$((found + 1))
  name=$(basename "$cert")
  cp "$cert" "/usr/local/share/ca-certificates/sapo-extra-${name%.*}.crt"
done
if [ "$found" -gt 0 ]; then
  command -v update-ca-certificates >/dev/null || { echo "docker/certs/ holds certificates but the base image has no update-ca-certificates (install ca-certificates)" >&2; exit 1; }
  update-ca-certificates >/dev/null
  echo "trusted $found extra certificate file(s) from docker/certs/"
fi
