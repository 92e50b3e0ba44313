# shellcheck shell=bash
# The hardware kit's throughput and RTT block (test/hw/run.sh sources
# it; test/netns/hwkit_scripts_test.go tests it): what each leg
# measured, per backend and fast path setting, and the fast path's
# ratios to off.
#
# The throughput and RTT of each leg, per backend and fast path setting
# (CUR_B, CUR_FP: the round running), printed above the table: a line per
# leg (LEG|PARTITION|BACKEND|SETTING, in PERF_KEYS) listing what it
# measured (PERF), and the names (PERFN, |-separated) and numbers (PERFV)
# that the on/off comparison divides.
PERF_KEYS=()
declare -A PERF PERFN PERFV
CUR_B="" CUR_FP=n/a
perf_leg() { # perf_leg LEG PARTITION: the leg's line, even if nothing passes
	local k="$1|$2|$CUR_B|$CUR_FP"
	[ -n "${PERF[$k]+x}" ] && return
	PERF_KEYS+=("$k")
	PERF[$k]="" PERFN[$k]=""
}
perf() { # perf LEG PARTITION NAME VALUE UNIT
	local k="$1|$2|$CUR_B|$CUR_FP"
	perf_leg "$1" "$2"
	PERF[$k]+="${PERF[$k]:+, }$3 $4 $5"
	PERFN[$k]+="${PERFN[$k]:+|}$3"
	PERFV[$k|$3]=$4
}

# perf_block: the lines, then one per leg and setting other than off
# comparing it with off: each figure's ratio setting/off (tcp above 1:
# faster; ping below 1: a shorter RTT). A leg run with no fast path says
# "fast path: n/a (BACKEND)".
perf_block() {
	local k leg pk b fp n c r names
	[ ${#PERF_KEYS[@]} -gt 0 ] || return 0
	echo "throughput and RTT per leg (tcp: iperf 2's server; ping: the mean RTT of the pairs):"
	for k in "${PERF_KEYS[@]}"; do
		IFS='|' read -r leg pk b fp <<<"$k"
		[ "$fp" = n/a ] && fp="n/a ($b)"
		printf '  %-7s %-7s %-7s %-23s %s\n' "$leg" "$pk" "$b" "fast path: $fp" "${PERF[$k]:-nothing measured}"
	done
	for k in "${PERF_KEYS[@]}"; do
		IFS='|' read -r leg pk b fp <<<"$k"
		case $fp in off | n/a) continue ;; esac
		[ -n "${PERF[$leg|$pk|$b|off]+x}" ] || continue
		c=""
		IFS='|' read -r -a names <<<"${PERFN[$k]}"
		for n in "${names[@]}"; do
			r=${PERFV[$leg|$pk|$b|off|$n]:-}
			[ -n "$r" ] || continue
			c+="${c:+, }$n $(awk -v a="${PERFV[$k|$n]}" -v b="$r" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }')"
		done
		printf '  %-7s %-7s %-7s %-23s %s\n' "$leg" "$pk" "$b" "fast path $fp/off" "${c:-nothing to compare}"
	done
}
