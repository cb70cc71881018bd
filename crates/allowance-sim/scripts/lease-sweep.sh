#!/bin/bash
# Leases at 1-32 processes and 20-5,000/s (issue 30 item 7, BENCHMARKS.md §18): store calls per
# admission, Redis CPU per admission (and its inverse, admissions per Redis core-second), 429s
# and the makespan against the minimum, without and with --lease auto, on one private
# redis-server. Usage: lease-sweep.sh "1 4 16 32" "20 200 1000 5000" (a markdown table).
# Needs `cargo build --release -p allowance-sim` and redis-server, redis-cli, python3, bc.
cd "$(git rev-parse --show-toplevel)" || exit 1
bin=target/release/allowance-sim
free() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
port=$(free); redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 & rpid=$!
trap 'kill $rpid 2>/dev/null' EXIT; sleep 0.5
calls() { redis-cli -p "$port" INFO commandstats | grep -E "^cmdstat_(evalsha|eval|fcall|fcall_ro)[:]" | sed -E 's/^[^:]*:calls=([0-9]+),.*/\1/' | paste -sd+ | bc; }
cpu() { redis-cli -p "$port" INFO cpu | grep -E "^used_cpu_(sys|user):" | cut -d: -f2 | tr -d '\r' | paste -sd+ | bc; }
echo "| P | rate | lease | calls/adm | Redis CPU µs/adm | adm per Redis core-s | 429s | failed | makespan | × min | load |"
for R in $2; do for P in $1; do for L in none auto; do
  case $R in 20) B=4; J=100;; 200) B=20; J=1000;; 1000) B=100; J=8000;; 5000) B=500; J=20000;; *) B=$((R/10)); J=$((R*5));; esac
  extra=(); [ "$L" = auto ] && extra=(--lease auto)
  redis-cli -p "$port" FLUSHALL >/dev/null; redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
  load=$(cut -d' ' -f1 /proc/loadavg); c0=$(cpu)
  out=$("$bin" run --real --mode shared --redis "redis://127.0.0.1:$port/" --processes "$P" --workers 128 --jobs "$J" --burst "$B" --rate "$R" --retry-after 1 --max-attempts 10 --json "${extra[@]}" 2>/dev/null)
  c1=$(cpu); n=$(calls)
  python3 - "$out" "$n" "$c0" "$c1" "$P" "$R" "$L" "$load" <<'PY'
import json,sys
o,n,c0,c1,P,R,L,load=sys.argv[1:]
try:
    r=json.loads(o); r=r[0] if isinstance(r,list) else r
except Exception as e:
    print(f"| {P} | {R}/s | {L} | run failed: {e} |"); sys.exit()
adm=max(1,r["completed"]+r["rejected"]); n=int(n or 0); cpu=(float(c1)-float(c0))*1e6/adm
print(f"| {P} | {R}/s | {L} | {n/adm:.3f} | {cpu:.1f} | {1e6/max(cpu,0.001):,.0f} | {r['rejected']} | {r.get('failed') or 0} | {r['makespan_ms']:,} ms | {r['makespan_ms']/max(1,r['min_makespan_ms']):.3f} | {load} |")
PY
done; done; done
