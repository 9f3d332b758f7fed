package main

import (
	"github.com/prometheus/client_golang/prometheus"
)

// transportCollector exports the transfer layer per transport (tcp, rdma)
// and RDMA device: transfers this node initiated, bytes, errors, fallbacks
// from RDMA to TCP, queue pairs open.
type transportCollector struct {
	cn *clusterNode

	ops, bytes, errs, fallbacks, qps, enabled *prometheus.Desc
	usable, events, sliceRetries              *prometheus.Desc
}

func newTransportCollector(cn *clusterNode) *transportCollector {
	d := prometheus.NewDesc
	l := []string{"transport", "device"}
	return &transportCollector{cn: cn,
		ops:          d("tidepool_transfer_ops_total", "Transfers this node initiated that succeeded, by transport (tcp, rdma) and RDMA device.", l, nil),
		bytes:        d("tidepool_transfer_transport_bytes_total", "Payload bytes of those transfers, by transport and RDMA device.", l, nil),
		errs:         d("tidepool_transfer_errors_total", "Transfers that failed on a transport (an RDMA failure retried over TCP counts here and in fallbacks).", l, nil),
		fallbacks:    d("tidepool_transfer_rdma_fallbacks_total", "RDMA transfers retried over TCP.", nil, nil),
		qps:          d("tidepool_transfer_rdma_qps", "RDMA queue pairs open now (initiator and responder), by device.", []string{"device"}, nil),
		enabled:      d("tidepool_transfer_rdma_enabled", "1 when this node serves and uses RDMA (transport auto or rdma with a device), else 0.", []string{"device"}, nil),
		usable:       d("tidepool_transfer_rdma_device_usable", "1 while an RDMA device in use has an active port and no fatal asynchronous event, else 0.", []string{"device"}, nil),
		events:       d("tidepool_transfer_rdma_async_events_total", "Asynchronous events of an RDMA device (port_err, port_active, qp_fatal, device_fatal, ...), each acknowledged and acted on.", []string{"device", "event"}, nil),
		sliceRetries: d("tidepool_transfer_rdma_slice_retries_total", "Parts of RDMA transfers moved again on another device after a transport failure on theirs.", nil, nil),
	}
}

func (c *transportCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.ops, c.bytes, c.errs, c.fallbacks, c.qps, c.enabled, c.usable, c.events, c.sliceRetries} {
		ch <- d
	}
}

func (c *transportCollector) Collect(ch chan<- prometheus.Metric) {
	if c.cn == nil || c.cn.xt == nil {
		return
	}
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	s := c.cn.xt.Counters()
	on := 0.0
	if s.Device != "" {
		on = 1
	}
	ch <- m(c.ops, ctr, float64(s.TCP.Ops), "tcp", "")
	ch <- m(c.bytes, ctr, float64(s.TCP.Bytes), "tcp", "")
	ch <- m(c.errs, ctr, float64(s.TCP.Errors), "tcp", "")
	ch <- m(c.ops, ctr, float64(s.RDMA.Ops), "rdma", s.Device)
	ch <- m(c.bytes, ctr, float64(s.RDMA.Bytes), "rdma", s.Device)
	ch <- m(c.errs, ctr, float64(s.RDMA.Errors), "rdma", s.Device)
	ch <- m(c.fallbacks, ctr, float64(s.Fallbacks))
	ch <- m(c.qps, g, float64(s.QPs), s.Device)
	ch <- m(c.enabled, g, on, s.Device)
	ch <- m(c.sliceRetries, ctr, float64(s.SliceRetries))
	for _, d := range s.Devices {
		u := 0.0
		if d.Usable {
			u = 1
		}
		ch <- m(c.usable, g, u, d.Name)
		for ev, n := range d.Events {
			ch <- m(c.events, ctr, float64(n), d.Name, ev)
		}
	}
}
