#!/usr/bin/env bash
# The cluster's certificates and kubeconfigs, made with openssl and cached:
# the directory is named by everything that decides them (this script, the
# addresses, the node names), so a second cluster-up reuses them and a
# changed address makes new ones. Prints the directory.
#
#   ca.{crt,key}                    the one CA: it signs every certificate, and
#                                   the API server and the kubelets trust
#                                   client certificates it signed
#   apiserver.{crt,key}             the API server's serving certificate: the
#                                   kubernetes Service's IP and names, its own
#                                   address, 127.0.0.1
#   apiserver-kubelet-client.*      the API server to the kubelets (logs, exec)
#   NODE-serving.{crt,key}          each kubelet's serving certificate (its IP
#                                   and name), so the API server can check it
#   sa.{key,pub}                    service account token signing
#   *.kubeconfig                    admin (system:masters), controller-manager,
#                                   scheduler, kube-proxy, and one per node
#                                   (system:node:NODE, for the Node authorizer)
#
# ECDSA P-256 keys throughout: Kubernetes 1.24 takes them everywhere (ES256
# service account tokens included) and openssl makes them at once.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

key=$( (cat "$0"; echo "$CLUSTER_APISERVER_IP $CLUSTER_APISERVER_PORT $CLUSTER_SERVICE_IP $CLUSTER_DOMAIN";
  for n in "${CLUSTER_NODES[@]}"; do echo "$n $(node_ip "$n")"; done) | sha256sum | cut -c1-16)
dir=$CLUSTER_CACHE/pki-$key
cache_lock
if [[ -f $dir/.complete ]]; then echo "$dir"; exit 0; fi
log "certificates and kubeconfigs in $dir"
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"
umask 077
days=3650

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

openssl_ext() { # NAME: the extensions of a leaf certificate, from the environment
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$EKU"
    [[ -z ${SAN:-} ]] || echo "subjectAltName=$SAN"
  } >"$1.ext"
}

# sign NAME SUBJECT EKU [SAN]
sign() {
  local name=$1 subj=$2
  EKU=$3 SAN=${4:-} openssl_ext "$name"
  newkey "$name"
  openssl req -new -key "$name.key" -subj "$subj" -out "$name.csr"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days $days \
    -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

newkey ca
openssl req -x509 -new -key ca.key -subj "/CN=lbctl-cluster-ca" -days $days -out ca.crt \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"

sign apiserver "/CN=kube-apiserver" serverAuth \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:localhost,IP:$CLUSTER_SERVICE_IP,IP:$CLUSTER_APISERVER_IP,IP:127.0.0.1"
sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
sign admin "/O=system:masters/CN=kubernetes-admin" clientAuth
sign controller-manager "/CN=system:kube-controller-manager" clientAuth
sign scheduler "/CN=system:kube-scheduler" clientAuth
sign kube-proxy "/CN=system:kube-proxy" clientAuth
for n in "${CLUSTER_NODES[@]}"; do
  sign "$n" "/O=system:nodes/CN=system:node:$n" clientAuth
  sign "$n-serving" "/CN=$n" serverAuth "DNS:$n,IP:$(node_ip "$n")"
done
rm -f ca.srl

openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out sa.key 2>/dev/null
openssl pkey -in sa.key -pubout -out sa.pub

# kubeconfig NAME USER: credentials embedded, so the file stands alone.
kubeconfig() {
  local b64="base64 -w0"
  cat >"$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: $CLUSTER_NAME
  cluster:
    server: https://$CLUSTER_APISERVER_IP:$CLUSTER_APISERVER_PORT
    certificate-authority-data: $($b64 ca.crt)
users:
- name: $2
  user:
    client-certificate-data: $($b64 "$1.crt")
    client-key-data: $($b64 "$1.key")
contexts:
- name: $CLUSTER_NAME
  context: {cluster: $CLUSTER_NAME, user: $2}
current-context: $CLUSTER_NAME
KC
}
kubeconfig admin kubernetes-admin
kubeconfig controller-manager system:kube-controller-manager
kubeconfig scheduler system:kube-scheduler
kubeconfig kube-proxy system:kube-proxy
for n in "${CLUSTER_NODES[@]}"; do kubeconfig "$n" "system:node:$n"; done

touch .complete
# Certificates for other addresses or names are of no further use.
cache_prune "$dir" "$CLUSTER_CACHE" -mindepth 1 -maxdepth 1 -name 'pki-*'
echo "$dir"
