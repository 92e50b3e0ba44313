#!/usr/bin/env bash
# Writes eipoibd(8) in roff on standard output from the binary's own
# usage: "eipoibd help" (its command list) and "eipoibd help COMMAND" for
# each command, so that the page says what the binary says.
#
#   scripts/manpage.sh BINARY VERSION > eipoibd.8
set -euo pipefail
bin=${1:?usage: manpage.sh BINARY VERSION}
version=${2:?usage: manpage.sh BINARY VERSION}
# roff: a backslash is \e, and a line starting with . or ' is text, not
# a request, behind \&.
esc() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }
# Usage goes to standard error; "help" exits 0.
top=$("$bin" help 2>&1)
cmds=$(awk '/^Commands:/ { f = 1; next } f && /^  [a-z]/ { print $1 }' <<<"$top")
cat <<ROFF
.TH EIPOIBD 8 "" "eipoibd $version" "System Administration"
.SH NAME
eipoibd \\- Ethernet over IPoIB: a TAP NIC whose traffic travels over InfiniBand
.SH SYNOPSIS
.B eipoibd
.I COMMAND
.RI [ flags ]
.SH DESCRIPTION
.nf
$(esc <<<"$top")
.fi
ROFF
for c in $cmds; do
  [ "$c" = help ] && continue
  printf '.SH "%s"\n.nf\n' "$(tr a-z A-Z <<<"eipoibd $c")"
  "$bin" help "$c" 2>&1 | esc
  printf '.fi\n'
done
cat <<'ROFF'
.SH FILES
.TP
.I /etc/eipoibd/NAME.toml
the configuration of eipoibd@NAME.service (eipoibd run \-\-config)
.TP
.I /etc/eipoibd/example.toml
every key of that file, with its default
.TP
.I /run/eipoibd/NAME.sock
the control socket of the daemon whose TAP is NAME
.SH SEE ALSO
.BR systemctl (1),
/usr/share/doc/eipoibd/README.md
ROFF
