#!/usr/bin/env bash
# The hardware kit's fast path verdict (test/hw/run.sh, --fast-path): did
# the kernel backend's in-kernel fast path carry one TCP transfer of one
# host, judged from eipoibd's counters scraped before and after it. Kept
# apart from run.sh so that test/netns/hwkit_scripts_test.go tests, with
# crafted scrapes, the logic that only InfiniBand hosts run.
#
#   fastpath-check.sh SETTING DIR MAC BYTES BEFORE AFTER
#
# SETTING  on: the fast path ran (--fast-path on, or auto with it
#          attached); off: eipoibd ran with --fast-path off
# DIR      tx: this host sent the transfer (the TAP's egress program);
#          rx: this host received it (the VIF children's ingress program)
# MAC      the guest's MAC: its VIF's row in `show vifs`
# BYTES    the TCP bytes the transfer moved
# BEFORE, AFTER  files, each `eipoibd show stats`, a line `== vifs`, then
#          `eipoibd show vifs`
#
# It prints one line, PASS or FAIL and a figure, and exits 0 on PASS, 1
# on FAIL, 3 on bad arguments.
#
# on PASS needs both:
#   - port_fast_path_DIR_redirected grew by at least ceil(BYTES / 65536).
#     Each redirected skb holds at most 64 KiB: at the TAP's egress the
#     guests' TCP super-frames, which the guests' veths (made by the kit)
#     and the TAP (tun never raises tso_max_size) keep within the
#     kernel's default gso_max_size, and at a child's ingress what GRO
#     merged within the child's gro_max_size (eipoibd makes the children;
#     net/core/dev.c alloc_netdev_mqs: GSO_LEGACY_MAX_SIZE and
#     GRO_LEGACY_MAX_SIZE, 65536; ipoib_ib_handle_rx_wc hands packets to
#     napi_gro_receive). So BYTES moved by the fast path alone take at
#     least that many redirects; fewer means it carried less.
#   - the guest's VIF counted fewer than BYTES / 2 bytes in DIR (TX BYTES
#     on the sender, RX BYTES on the receiver): eipoibd's own path, the
#     only other way across, carried less than half, so the fast path
#     carried the bulk. A VIF absent from a scrape counts 0; one whose
#     count went down was made again, and its new count is what it
#     carried.
# off PASS: port_fast_path_tx_redirected and port_fast_path_rx_redirected
#   exactly 0 (or absent: no programs) in both scrapes.
set -u -o pipefail

if [ $# -ne 6 ] || ! [[ $1 =~ ^(on|off)$ ]] || ! [[ $2 =~ ^(tx|rx)$ ]] || ! [[ $4 =~ ^[1-9][0-9]*$ ]]; then
	echo "usage: fastpath-check.sh on|off tx|rx MAC BYTES BEFORE AFTER" >&2
	exit 3
fi
for f in "$5" "$6"; do
	[ -r "$f" ] || {
		echo "fastpath-check.sh: cannot read $f" >&2
		exit 3
	}
done

awk -v setting="$1" -v dir="$2" -v mac="$3" -v bytes="$4" '
# Per file: stats lines "name value" until "== vifs", then the VIF
# rows, whose last columns are TX PKTS, TX BYTES, RX PKTS, RX BYTES.
# (FILENAME, not FNR: an empty BEFORE has no first line.)
{ f = (FILENAME == ARGV[1]) ? 1 : 2 }
f != last { last = f; invifs = 0 }
$0 == "== vifs" { invifs = 1; next }
!invifs && NF == 2 { stat[f, $1] = $2; has[f, $1] = 1; next }
invifs && tolower($1) == tolower(mac) { vif[f] = (dir == "tx") ? $(NF - 2) : $NF }
function val(i, name) { return has[i, name] ? stat[i, name] + 0 : 0 }
END {
	if (setting == "off") {
		bad = ""
		for (i = 1; i <= 2; i++)
			for (d = 0; d < 2; d++) {
				n = "port_fast_path_" (d ? "rx" : "tx") "_redirected"
				if (val(i, n) != 0) bad = bad sprintf(" %s %.0f (%s)", n, val(i, n), i == 1 ? "before" : "after")
			}
		if (bad == "") {
			print "PASS redirected tx 0, rx 0 (fast path off)"
			exit 0
		}
		print "FAIL fast path off, yet" bad
		exit 1
	}
	name = "port_fast_path_" dir "_redirected"
	if (!has[2, name]) {
		print "FAIL no " name " after: eipoibd ran no fast path"
		exit 1
	}
	red = val(2, name) - val(1, name)
	bound = int((bytes + 65535) / 65536)
	b0 = vif[1] + 0
	b1 = vif[2] + 0
	user = (b1 >= b0) ? b1 - b0 : b1
	half = int(bytes / 2)
	fig = sprintf("%s redirected +%.0f (bound %.0f), VIF %s %s bytes +%.0f (half %.0f)", dir, red, bound, mac, dir, user, half)
	if (red >= bound && user < half) {
		print "PASS " fig
		exit 0
	}
	why = (red < bound) ? "redirected below the bound" : "eipoibd carried the bulk"
	print "FAIL " why ": " fig
	exit 1
}' "$5" "$6"
