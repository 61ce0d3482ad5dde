#!/usr/bin/env bash
# Regenerates the TLS test certificates in this directory.
#
# TEST-ONLY KEYS. The private keys written here are committed to the
# repository and therefore public: never use them, or anything signed by
# these CAs, for anything real.
#
#   ca.pem / ca.key                   "bnps test CA", self-signed
#   server.pem / server.key           signed by ca; SAN DNS:localhost,
#                                     IP:127.0.0.1; serverAuth
#   client.pem / client.key           signed by ca; CN "bnps test worker";
#                                     clientAuth
#   other_ca.pem / other_ca.key       an unrelated CA, "bnps other test CA"
#   other_client.pem / other_client.key
#                                     signed by other_ca; clientAuth
#
# Keys are EC P-256 in unencrypted PKCS#8 PEM; certificates are valid for
# 36500 days so the tests never expire. Usage: tests/testdata/tls/make_certs.sh

set -euo pipefail

cd "$(dirname "$0")"

readonly DAYS=36500
readonly TMP_FILES=(
  server.csr client.csr other_client.csr
  server.ext client.ext other_client.ext ca.cnf
  ca.srl other_ca.srl
)
cleanup() { rm -f "${TMP_FILES[@]}"; }
trap cleanup EXIT

new_key() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
    -out "$1.key"
  chmod 600 "$1.key"
}

# new_ca NAME CN
new_ca() {
  new_key "$1"
  # A config of our own, so the system's openssl.cnf does not matter.
  cat > ca.cnf <<CNF
[req]
distinguished_name = dn
x509_extensions = v3_ca
prompt = no
[dn]
O = bnps
CN = $2
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
CNF
  openssl req -new -x509 -sha256 -days "${DAYS}" -key "$1.key" \
    -config ca.cnf -out "$1.pem"
}

# new_leaf NAME CN CA_NAME EXTENSIONS...
new_leaf() {
  local name="$1" cn="$2" ca="$3"
  shift 3
  new_key "${name}"
  openssl req -new -sha256 -key "${name}.key" -subj "/O=bnps/CN=${cn}" \
    -config /dev/null -out "${name}.csr"
  printf '%s\n' "basicConstraints = critical, CA:FALSE" \
    "keyUsage = critical, digitalSignature" \
    "subjectKeyIdentifier = hash" \
    "authorityKeyIdentifier = keyid, issuer" "$@" > "${name}.ext"
  openssl x509 -req -sha256 -days "${DAYS}" -in "${name}.csr" \
    -CA "${ca}.pem" -CAkey "${ca}.key" -CAcreateserial \
    -CAserial "${ca}.srl" -extfile "${name}.ext" -out "${name}.pem"
}

new_ca ca "bnps test CA"
new_leaf server "localhost" ca \
  "subjectAltName = DNS:localhost, IP:127.0.0.1" \
  "extendedKeyUsage = serverAuth"
new_leaf client "bnps test worker" ca "extendedKeyUsage = clientAuth"

new_ca other_ca "bnps other test CA"
new_leaf other_client "bnps test worker" other_ca \
  "extendedKeyUsage = clientAuth"

# Sanity: each leaf chains to its own CA only.
openssl verify -CAfile ca.pem server.pem client.pem > /dev/null
openssl verify -CAfile other_ca.pem other_client.pem > /dev/null
if openssl verify -CAfile ca.pem other_client.pem > /dev/null 2>&1; then
  echo "other_client.pem unexpectedly chains to ca.pem" >&2
  exit 1
fi
