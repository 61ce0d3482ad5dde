#!/usr/bin/env bash
# Writes a job's TLS files: a CA of its own and one certificate, signed by it,
# that the servers serve and the workers present (mutual TLS).
#
#   deploy/make_tls.sh DIR [DNS_NAME...]
#
# DIR/ca.pem, DIR/tls.pem, DIR/tls.key (EC P-256, valid 365 days). The
# certificate's names are the DNS names given, default those of compose.yaml
# and of deploy/base in the default namespace (bnps-server-N.bnps-server...).
# The CA's key is deleted: nothing else can be signed by it later. Keys are
# readable by all (chmod 644), as a container's unprivileged user must read
# the bind-mounted files; keep DIR private (chmod 700 DIR, done here).
set -euo pipefail
if [ $# -lt 1 ]; then sed -n '2,12p' "$0"; exit 2; fi
dir="$1"; shift
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=(server-0 server-1 localhost bnps-server-0.bnps-server bnps-server-1.bnps-server
         '*.bnps-server.default.svc'
         '*.bnps-server.default.svc.cluster.local')
fi
mkdir -p "$dir" && chmod 700 "$dir"
cd "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
san=$(printf 'DNS:%s,' "${names[@]}"); san=${san%,}
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/ca.key" 2>/dev/null
openssl req -new -x509 -sha256 -days 365 -key "$tmp/ca.key" -subj "/O=bnps/CN=bnps job CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out tls.key 2>/dev/null
openssl req -new -sha256 -key tls.key -subj "/O=bnps/CN=bnps job" -out "$tmp/tls.csr"
printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
  "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san" > "$tmp/ext"
openssl x509 -req -sha256 -days 365 -in "$tmp/tls.csr" -CA ca.pem -CAkey "$tmp/ca.key" \
  -CAcreateserial -CAserial "$tmp/ca.srl" -extfile "$tmp/ext" -out tls.pem 2>/dev/null
chmod 644 ca.pem tls.pem tls.key
openssl verify -CAfile ca.pem tls.pem >/dev/null
echo "make_tls.sh: $dir/ca.pem, tls.pem, tls.key for ${names[*]}"
