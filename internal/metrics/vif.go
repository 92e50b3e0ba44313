package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eipoib/eipoibd/internal/shim"
)

// vifColumns are the per-VIF families, in the order of VIFs' rows.
var vifColumns = []Column{
	{Name: "vif_tx_packets_total", Help: "Frames from the guest", Type: prometheus.CounterValue},
	{Name: "vif_tx_bytes_total", Help: "Bytes of frames from the guest", Type: prometheus.CounterValue},
	{Name: "vif_rx_packets_total", Help: "IPoIB packets to the guest", Type: prometheus.CounterValue},
	{Name: "vif_rx_bytes_total", Help: "Bytes of IPoIB packets to the guest", Type: prometheus.CounterValue},
	{Name: "vif_idle_seconds", Help: "Time since the VIF last carried traffic", Type: prometheus.GaugeValue},
}

// VIFs is the per-VIF metric families, from one listing of the VIFs a
// scrape (vifs is shim.Shim.VIFs): packets and bytes each way
// (eipoibd_vif_{tx,rx}_{packets,bytes}_total) and idle seconds, labeled
// by MAC, VLAN and origin.
func VIFs(vifs func() []shim.VIFInfo) prometheus.Collector {
	return NewTable([]string{"mac", "vlan", "origin"}, vifColumns, func() []Row {
		vs := vifs()
		out := make([]Row, len(vs))
		for i, v := range vs {
			out[i] = Row{
				Labels: []string{v.MAC.String(), strconv.Itoa(int(v.VLAN)), v.Origin.String()},
				Values: []float64{float64(v.TxPackets), float64(v.TxBytes), float64(v.RxPackets), float64(v.RxBytes), v.Idle.Seconds()},
			}
		}
		return out
	})
}
