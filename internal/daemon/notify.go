package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/eipoib/eipoibd/internal/sdnotify"
	"github.com/eipoib/eipoibd/internal/shim"
)

// notifySystemd tells systemd (Type=notify) that the daemon is ready,
// once the TAP and the port are up and the shim is about to run, and
// that it is stopping when ctx ends. With WatchdogSec= it sends
// WATCHDOG=1 every half interval while the shim's housekeeping rounds
// keep coming, so a stuck pipeline gets the service restarted. Without
// systemd it does nothing. Its goroutine is counted in wg.
func notifySystemd(ctx context.Context, wg *sync.WaitGroup, sh *shim.Shim, log *slog.Logger, status string) {
	ok, err := sdnotify.Notify("READY=1\nSTATUS=" + status)
	if err != nil {
		log.Warn("systemd notification", "err", err)
	}
	if !ok {
		return
	}
	wd, watch := sdnotify.WatchdogInterval()
	wg.Add(1)
	go func() {
		defer wg.Done()
		var tick <-chan time.Time
		if watch {
			t := time.NewTicker(wd / 2)
			defer t.Stop()
			tick = t.C
		}
		for {
			select {
			case <-ctx.Done():
				sdnotify.Notify("STOPPING=1")
				return
			case <-tick:
				if sh.Healthy(wd / 2) {
					sdnotify.Notify("WATCHDOG=1")
				} else {
					log.Error("housekeeping stalled: withholding the systemd watchdog", "for_at_least", wd/2)
				}
			}
		}
	}()
}
