#!/usr/bin/env bash
# Kanal by hand on loopback, no root: one CA, a server, an agent and a web server standing in for
# both a pod and the kube-apiserver (KAS), all on this machine. Sends one connection each way,
# checks the answers and removes everything it started and made (its temp dir holds a CA key) on
# exit, on Ctrl-C and on SIGTERM. Run it after `npm ci && npm run build`:
#
#   scripts/try-loopback.sh           # the steps, then exits 0 when both directions answered
#   KEEP=1 scripts/try-loopback.sh    # the same, then keeps running for you to try (`kanal status`
#                                     # on the admin ports, printed); Ctrl-C ends it
#
# Ports: the defaults below; set AGENT_PORT, SERVER_HEALTH, AGENT_HEALTH, WEB_PORT, KAS_PORT, or with
# KEEP=1 SERVER_ADMIN and AGENT_ADMIN, when one is taken (without KEEP the admin ports are off). KANAL_EXECUTABLE=/abs/path/kanal runs the single executable instead.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The Node.js `npm ci` installed (a devDependency), not the machine's, which may be too old.
NODE=$REPO/node_modules/.bin/node
if [[ -n ${KANAL_EXECUTABLE:-} ]]; then KANAL=("$KANAL_EXECUTABLE"); else KANAL=("$NODE" "$REPO/dist/src/cli/main.js"); fi
[[ -x $NODE && (-n ${KANAL_EXECUTABLE:-} || -f $REPO/dist/src/cli/main.js) ]] ||
  { echo "try-loopback: run 'npm ci && npm run build' in $REPO first" >&2; exit 2; }
for tool in openssl curl socat; do
  command -v "$tool" > /dev/null || { echo "try-loopback: needs $tool (Debian: apt-get install $tool)" >&2; exit 2; }
done
AGENT_PORT=${AGENT_PORT:-8091} SERVER_HEALTH=${SERVER_HEALTH:-8092} AGENT_HEALTH=${AGENT_HEALTH:-8093}
WEB_PORT=${WEB_PORT:-8000} KAS_PORT=${KAS_PORT:-6443}
# The admin ports (`kanal status`, /metrics) only for a run that stays up: a run that exits
# at once needs nothing of them, and the defaults may belong to a Kanal already running here.
if [[ -n ${KEEP:-} ]]; then SERVER_ADMIN=${SERVER_ADMIN:-8095} AGENT_ADMIN=${AGENT_ADMIN:-8094}; else SERVER_ADMIN=0 AGENT_ADMIN=0; fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kanal-try.XXXXXX")
PIDS=()
cleanup() {
  trap - EXIT INT TERM
  # SIGTERM, up to 10 s to exit (the agent drains first), then SIGKILL; then the directory.
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in {1..100}; do
    alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
  echo "try-loopback: stopped ${PIDS[*]:-nothing}, removed $WORK"
}
trap cleanup EXIT
trap 'exit 130' INT   # exit runs the EXIT trap
trap 'exit 143' TERM
cd "$WORK"
echo "try-loopback: working in $WORK"

# One CA; the agent port's certificate (for 127.0.0.1, the address the agent dials: the agent
# checks the server's certificate against it) and an agent's client certificate. A certificate
# made for a name only (as docs/certificates.md's) needs --tls-server-name NAME on the agent.
ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
openssl req -x509 "${ec[@]}" -days 1 -subj /CN=try-ca -keyout ca.key -out ca.crt 2>/dev/null
openssl req "${ec[@]}" -subj /CN=kanal-server -keyout server.key -out server.csr 2>/dev/null
openssl req "${ec[@]}" -subj /CN=node-1 -keyout agent.key -out agent.csr 2>/dev/null
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -out server.crt \
  -extfile <(printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n') 2>/dev/null
openssl x509 -req -in agent.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -out agent.crt \
  -extfile <(printf 'extendedKeyUsage=clientAuth\n') 2>/dev/null

# "A pod", and the KAS's stand-in: a web server on 127.0.0.1:$WEB_PORT.
"$NODE" -e 'require("http").createServer((q, s) => s.end(`hello from ${q.url}\n`)).listen(+process.argv[1], "127.0.0.1")' \
  "$WEB_PORT" > web.log 2>&1 &
PIDS+=($!) WEB_PID=$!

# The server: frontend on a Unix socket, agents on 127.0.0.1:$AGENT_PORT; node -> control plane
# only to the web server. The agent: serves 127.0.0.2:$KAS_PORT (the advertise address; "none":
# an address loopback already has, no interface to create) and forwards it through the tunnel.
"${KANAL[@]}" server --uds-name ./kanal.sock --cluster-cert server.crt --cluster-key server.key \
  --cluster-ca-cert ca.crt --agent-bind-address 127.0.0.1 --agent-port "$AGENT_PORT" \
  --health-bind-address 127.0.0.1 --health-port "$SERVER_HEALTH" --admin-port "$SERVER_ADMIN" \
  --allowed-destination "127.0.0.1:$WEB_PORT" > server.log 2>&1 &
PIDS+=($!) SERVER_PID=$!
"${KANAL[@]}" agent --proxy-server-host 127.0.0.1 --proxy-server-port "$AGENT_PORT" --ca-cert ca.crt \
  --agent-cert agent.crt --agent-key agent.key --agent-id node-1 \
  --health-bind-address 127.0.0.1 --health-server-port "$AGENT_HEALTH" --admin-server-port "$AGENT_ADMIN" \
  --bind-address 127.0.0.2 --bind-interface-type none --target "$KAS_PORT:127.0.0.1:$WEB_PORT" > agent.log 2>&1 &
PIDS+=($!) AGENT_PID=$!
echo "try-loopback: started web server, server, agent: pids ${PIDS[*]}"

# A process that exited is said by name, with its exit code and the end of its log: a port
# taken or a flag refused ends the server or the agent at once, and its log says why.
exited() {
  local name=$1 pid=$2 log=$3 code=0
  kill -0 "$pid" 2>/dev/null && return 1
  wait "$pid" || code=$?
  echo "try-loopback: the $name exited (code $code); the end of $log:" >&2
  tail -n 10 "$log" | sed 's/^/  /' >&2
}
ready=
for _ in {1..40}; do
  if ready=$(curl -sf "127.0.0.1:$AGENT_HEALTH/readyz"); then break; fi
  dead=0
  exited server "$SERVER_PID" server.log && dead=1
  exited agent "$AGENT_PID" agent.log && dead=1
  exited "web server" "$WEB_PID" web.log && dead=1
  ((dead)) && exit 1
  sleep 0.5
done
if [[ $ready != ok* ]]; then
  echo "try-loopback: the server and the agent run, but the agent is not ready after 20 s (${ready:-no answer on 127.0.0.1:$AGENT_HEALTH/readyz}); the ends of their logs:" >&2
  tail -n 5 agent.log server.log >&2
  exit 1
fi
echo "agent /readyz: $ready"

# Control plane -> node, as the KAS does it: HTTP CONNECT on the server's Unix socket, then a
# request through the tunnel (socat: a real client on the socket; curl cannot send CONNECT over one).
cp_to_node=$(printf 'CONNECT 127.0.0.1:%s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n\r\nGET /cp-to-node HTTP/1.0\r\n\r\n' \
  "$WEB_PORT" "$WEB_PORT" | socat -t 5 - UNIX-CONNECT:kanal.sock)
echo "control plane -> node:"; printf '%s\n' "$cp_to_node" | sed 's/^/  /'

# Node -> control plane, as a kubelet does it: the advertise address, through the tunnel.
node_to_cp=$(curl -sS --max-time 10 "http://127.0.0.2:$KAS_PORT/node-to-cp")
echo "node -> control plane:"; printf '%s\n' "$node_to_cp" | sed 's/^/  /'

if [[ $cp_to_node != *"200 Connection Established"*"hello from /cp-to-node"* || $node_to_cp != "hello from /node-to-cp" ]]; then
  echo "try-loopback: an answer is not what it should be; logs: $WORK/server.log, $WORK/agent.log" >&2
  exit 1
fi
echo "try-loopback: both directions work"

if [[ -n ${KEEP:-} ]]; then
  echo "try-loopback: what is connected, from the server's and the agent's admin ports:"
  echo "  ${KANAL[*]} status --admin-address 127.0.0.1:$SERVER_ADMIN"
  echo "  ${KANAL[*]} status --admin-address 127.0.0.1:$AGENT_ADMIN"
  echo "try-loopback: running in $WORK until Ctrl-C; try curl -s 127.0.0.1:$SERVER_HEALTH/metrics"
  sleep infinity &
  PIDS+=($!)
  wait $!   # a signal ends the wait at once (a foreground sleep would hold the trap back)
fi
