package shim

import (
	"log/slog"

	"github.com/eipoib/eipoibd/internal/clock"
	"github.com/eipoib/eipoibd/ipoib"
	"github.com/eipoib/eipoibd/mactrans"
)

// shared is what the shim lends its parts (groups, resolver, mobility):
// the counters, the log, the clock, the VIF table and the two ways out.
// It holds nothing of the port's control half, and any goroutine may use it.
type shared struct {
	ctr      *counters
	log      *slog.Logger
	clk      clock.Clock
	vifs     *mactrans.VIFTable
	toPort   func(bufs [][]byte, meta []ipoib.TxMeta) // Shim.writePort
	toGuests func(frames [][]byte)                    // Shim.writeLocal
}

// vifLive reports whether v is still the VIF owning its QP (not aged out).
func (sh *shared) vifLive(v *mactrans.VIF) bool {
	cur, ok := sh.vifs.LookupQPN(v.QPN)
	return ok && cur == v
}
