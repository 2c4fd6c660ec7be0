#!/bin/sh
# Gets this node's client certificate for the stepwatch agent from cert-manager: a new key and a
# CSR whose common name and first DNS name are the Kubernetes node name ($NODE_NAME, from
# spec.nodeName), sent as a CertificateRequest to the stepwatch-ca Issuer; the signed certificate,
# the CA and the key go to $STEPWATCH_TLS_DIR (tls.crt, ca.crt, tls.key), where the agent reads
# them (--tls-cert, --tls-ca, --tls-key) and the collector checks that each batch claims that node.
# Why not a Secret or the cert-manager CSI driver: a DaemonSet mounts the same Secret on every node,
# and the CSI driver templates only the pod's name, namespace, uid and service account, never the
# node (docs/security.md).
#   agent-certificate.sh          once (the init container): fails if no certificate came
#   agent-certificate.sh --renew  forever (the sidecar): renews when a third of the lifetime is left
set -eu

dir="${STEPWATCH_TLS_DIR:-/etc/stepwatch/tls}"
node="${NODE_NAME:?NODE_NAME (spec.nodeName) is not set}"
# A Kubernetes node name is a DNS subdomain; anything else must not reach the CSR or the JSON.
case "$node" in
*[!a-z0-9.-]* | "" | .* | -*)
  echo "agent-certificate: NODE_NAME \"${node}\" is not a DNS name" >&2
  exit 1
  ;;
esac
sa="${STEPWATCH_SA_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}"
api="https://${KUBERNETES_SERVICE_HOST:?}:${KUBERNETES_SERVICE_PORT:-443}"
issuer="${STEPWATCH_ISSUER:-stepwatch-ca}"
duration="${STEPWATCH_CERT_DURATION:-2160h}"
# Seconds to wait for cert-manager to sign (bounded: the init container must end).
wait_s="${STEPWATCH_CERT_WAIT:-120}"
ns="$(cat "$sa/namespace")"
# One CertificateRequest per node, replaced at each renewal.
name="stepwatch-agent-${node}"
url="${api}/apis/cert-manager.io/v1/namespaces/${ns}/certificaterequests"

log() { echo "agent-certificate: $*" >&2; }

kube() { # kube METHOD URL [BODY-FILE]
  method="$1" target="$2"
  if [ $# -ge 3 ]; then set -- --data-binary "@$3"; else set --; fi
  curl -sS --max-time 20 --cacert "$sa/ca.crt" -H "Authorization: Bearer $(cat "$sa/token")" \
    -H "Content-Type: application/json" -X "$method" "$target" "$@"
}

# The value of a string field of the one-line JSON on stdin (base64 holds no quotes).
field() { tr -d '\n' | sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p"; }

request() {
  tmp="$(mktemp -d "${dir}/.request.XXXXXX")"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/tls.key" \
    -subj "/CN=${node}" -addext "subjectAltName=DNS:${node}" -out "$tmp/csr.pem" 2>/dev/null
  csr="$(base64 <"$tmp/csr.pem" | tr -d '\n')"
  cat >"$tmp/body.json" <<EOF
{"apiVersion":"cert-manager.io/v1","kind":"CertificateRequest",
 "metadata":{"name":"${name}","labels":{"app.kubernetes.io/name":"stepwatch-agent",
  "app.kubernetes.io/part-of":"stepwatch"}},
 "spec":{"request":"${csr}","duration":"${duration}","usages":["client auth","digital signature"],
  "issuerRef":{"name":"${issuer}","kind":"Issuer","group":"cert-manager.io"}}}
EOF
  kube DELETE "${url}/${name}" >/dev/null || true
  if ! kube POST "$url" "$tmp/body.json" >"$tmp/created.json" ||
    ! grep -q '"kind": *"CertificateRequest"' "$tmp/created.json"; then
    log "could not create CertificateRequest ${ns}/${name}: $(head -c 300 "$tmp/created.json")"
    rm -rf "$tmp"
    return 1
  fi
  deadline=$(($(date +%s) + wait_s))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    kube GET "${url}/${name}" >"$tmp/cr.json" || true
    cert="$(field certificate <"$tmp/cr.json")"
    if [ -n "$cert" ]; then
      field ca <"$tmp/cr.json" | base64 -d >"$tmp/ca.crt"
      printf '%s' "$cert" | base64 -d >"$tmp/tls.crt"
      # Key first, then certificate: the agent reloads when the certificate changes.
      chmod 0600 "$tmp/tls.key"
      mv "$tmp/ca.crt" "$dir/ca.crt"
      mv "$tmp/tls.key" "$dir/tls.key"
      mv "$tmp/tls.crt" "$dir/tls.crt"
      rm -rf "$tmp"
      log "certificate for node ${node} written to ${dir}"
      return 0
    fi
    if grep -Eq '"reason": *"(Denied|Failed)"' "$tmp/cr.json"; then
      log "CertificateRequest ${ns}/${name} was denied or failed: $(head -c 300 "$tmp/cr.json")"
      break
    fi
    sleep 2
  done
  log "no certificate for node ${node} within ${wait_s} s (is the Issuer ${issuer} ready and the request approved?)"
  rm -rf "$tmp"
  return 1
}

if [ "${1:-}" != "--renew" ]; then
  request
  exit
fi
# Renew when a third of the lifetime is left (the agent picks up the new files itself); on failure
# retry every 10 minutes while the old certificate still works.
while :; do
  lifetime=$(($(date -d "$(openssl x509 -enddate -noout -in "$dir/tls.crt" | cut -d= -f2)" +%s) -
    $(date -d "$(openssl x509 -startdate -noout -in "$dir/tls.crt" | cut -d= -f2)" +%s)))
  if ! openssl x509 -checkend $((lifetime / 3)) -noout -in "$dir/tls.crt" >/dev/null; then
    request || {
      sleep 600
      continue
    }
  fi
  sleep 3600
done
