#!/bin/bash
# Classes inside a lease (BENCHMARKS.md §18): P processes (usage: classes-lease.sh P), classes
# bulk:3 batch:1 and live:high (every 100 ms), 1,000/s burst 100, 8,000 jobs, without and with
# --lease auto, on one private redis-server; store calls counted by Redis.
# Needs `cargo build --release -p allowance-sim` and redis-server, redis-cli, python3, bc.
cd "$(git rev-parse --show-toplevel)" || exit 1
bin=target/release/allowance-sim
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & rpid=$!; trap 'kill $rpid' EXIT; sleep 0.5
calls() { redis-cli -p "$port" INFO commandstats | grep -E "^cmdstat_(evalsha|eval|fcall|fcall_ro)[:]" | sed -E 's/^[^:]*:calls=([0-9]+),.*/\1/' | paste -sd+ | bc; }
for L in none auto; do
  extra=(); [ "$L" = auto ] && extra=(--lease auto)
  redis-cli -p "$port" CONFIG RESETSTAT >/dev/null; load=$(cut -d' ' -f1 /proc/loadavg)
  out=$("$bin" run --redis "redis://127.0.0.1:$port/" --processes "$1" --workers 128 --jobs 8000 --burst 100 --rate 1000 \
     --class bulk:3 --class batch:1 --class live:1:high:jobs=40:every=100ms --window 2s --retry-after 1 "${extra[@]}" 2>&1)
  echo "== lease $L, load $load, store calls $(calls)"; echo "$out"
done
