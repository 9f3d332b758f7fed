//go:build verbs

package verbs

import (
	"net"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// devHealth is what asynchronous events said about a device.
type devHealth struct {
	usable atomic.Bool // port active and no fatal event
	fatal  atomic.Bool // device_fatal or cq_err: unusable until restart
	mu     sync.Mutex
	events map[string]uint64
}

func (h *devHealth) count(name string) {
	h.mu.Lock()
	h.events[name]++
	h.mu.Unlock()
}

// Health reports every device's state and its asynchronous events.
func (t *Transport) Health() []DeviceHealth {
	out := make([]DeviceHealth, len(t.devs))
	for i, d := range t.devs {
		h := t.health[i]
		info := d.cur()
		out[i] = DeviceHealth{Name: info.Name, NUMANode: info.NUMANode, Usable: h.usable.Load(), Events: map[string]uint64{}}
		h.mu.Lock()
		for k, v := range h.events {
			out[i].Events[k] = v
		}
		h.mu.Unlock()
	}
	return out
}

// SliceRetries counts parts moved again on another device after a
// transport failure on theirs.
func (t *Transport) SliceRetries() uint64 { return t.sliceRetries.Load() }

// asyncLoop reads the device's asynchronous events (each acknowledged at
// once) until Close, and acts on them (onEvent).
func (t *Transport) asyncLoop(i int) {
	defer t.pollWG.Done()
	dev := t.devs[i]
	for !t.stopPol.Load() {
		ev, ok, err := dev.asyncWait(t.wake)
		if err != nil {
			t.lg.Error("async events", zap.String("device", dev.cur().Name), zap.Error(err))
			return
		}
		if ok {
			t.onEvent(i, ev)
		}
	}
}

// onEvent: a port going down makes the device unusable for new transfers
// (transfers in flight end on RC retries or succeed); a port coming up, or
// a GID/LID change, re-queries the port (new GID for new QPs) and makes it
// usable again; a QP error marks that initiator QP broken and moves it to
// the error state, so its transfer fails now and the QP is rebuilt; a
// device or CQ fatal error makes the device unusable until restart and
// breaks its QPs. Every event is counted (Health).
func (t *Transport) onEvent(i int, ev asyncEvent) {
	dev, h := t.devs[i], t.health[i]
	h.count(ev.name)
	name := dev.cur().Name
	lg := t.lg.With(zap.String("device", name), zap.String("event", ev.name))
	switch ev.name {
	case "port_err":
		if ev.port == dev.cur().Port {
			h.usable.Store(false)
			lg.Warn("RDMA port down: device unusable until it comes back", zap.Int("port", ev.port))
		}
	case "port_active", "gid_change", "lid_change", "pkey_change", "sm_change", "client_reregister":
		if ev.port != dev.cur().Port {
			return
		}
		info, err := dev.refresh()
		switch {
		case err != nil:
			h.usable.Store(false)
			lg.Warn("RDMA port query after event failed: device unusable", zap.Error(err))
		case info.Active && !h.fatal.Load():
			h.usable.Store(true)
			lg.Info("RDMA port usable", zap.Int("gid_index", info.GIDIndex),
				zap.String("gid", net.IP(info.GID[:]).String()), zap.Int("mtu", info.ActiveMTU))
		case !info.Active:
			h.usable.Store(false)
		}
	case "qp_fatal", "qp_req_err", "qp_access_err", "path_mig_err":
		if v, ok := t.iqps.Load(qpKey{i, ev.qpn}); ok {
			v.(*iqp).fail()
		}
		lg.Warn("RDMA queue pair failed: rebuilt on next use", zap.Uint32("qpn", ev.qpn))
	case "cq_err", "device_fatal":
		h.fatal.Store(true)
		h.usable.Store(false)
		t.iqps.Range(func(k, v any) bool {
			if k.(qpKey).dev == i {
				v.(*iqp).fail()
			}
			return true
		})
		lg.Error("RDMA device failed: unusable until restart")
	default:
		lg.Debug("RDMA asynchronous event")
	}
}

// fail marks q broken and moves it to the error state, unless its handle
// already dropped it: put and get then destroy it instead of reusing it.
func (q *iqp) fail() {
	q.p.mu.Lock()
	defer q.p.mu.Unlock()
	if _, live := q.p.all[q]; live {
		q.broken.Store(true)
		_ = q.q.toError()
	}
}
