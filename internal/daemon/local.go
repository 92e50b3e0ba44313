package daemon

import (
	"context"
	"strings"
	"sync"

	"github.com/eipoib/eipoibd/ether"
	"github.com/eipoib/eipoibd/internal/shim"
	"github.com/eipoib/eipoibd/internal/vswitch"
)

// watchLocal tells the shim the hypervisor's own MACs (the TAP's, the
// bridge's or the Open vSwitch bridge's internal port's)
// in --learn declared, where their frames count as drop_undeclared_local
// rather than drop_undeclared, until ctx ends, in a goroutine wg counts.
func (sw *switchPort) watchLocal(ctx context.Context, wg *sync.WaitGroup) {
	cfg := sw.cfg
	if cfg.Learn != shim.LearnDeclared {
		return
	}
	devs := []string{cfg.Name}
	for _, br := range []string{cfg.Bridge, cfg.OVSBridge} {
		if br != "" {
			devs = append(devs, br)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		set := func(macs []ether.MAC) {
			sw.sh.SetLocalMACs(macs)
			// One string, "a,b", alike in the text and the JSON log.
			names := make([]string, len(macs))
			for i, m := range macs {
				names[i] = m.String()
			}
			sw.log.Debug("the hypervisor's own MACs", "macs", strings.Join(names, ","))
		}
		fail := func(err error) { sw.log.Warn("the hypervisor's own MACs", "err", err) }
		if err := vswitch.WatchLocalMACs(ctx, set, fail, devs...); err != nil {
			sw.log.Warn("the hypervisor's own MACs are not followed: frames from one not known when the watch ended count as drop_undeclared, not drop_undeclared_local", "err", err)
		}
	}()
}
