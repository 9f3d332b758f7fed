package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/proxy/kvevents"
)

// kvEventsConfig is the KV-event publisher's config from serve's settings:
// the topic's pod is node_name ($POD_NAME in a pod).
func (c Config) kvEventsConfig() kvevents.Config {
	kc := kvevents.DefaultConfig()
	kc.Endpoint = c.KVEventsEndpoint
	kc.ReplayEndpoint = c.KVEventsReplayEndpoint
	kc.Pod = c.NodeID
	kc.Model = c.KVEventsModel
	kc.HashBytes = c.KVEventsBlockHash == "bytes"
	kc.QueueEvents = c.KVEventsQueue
	kc.SubscribeSnapshot = c.KVEventsSubSnapshot
	return kc
}

// newKVEvents makes the publisher when kv_events_endpoint is set (nil
// otherwise). It must exist before the store, whose tiers report to it.
func newKVEvents(c Config, lg *zap.Logger) (*kvevents.Publisher, error) {
	if c.KVEventsEndpoint == "" {
		return nil, nil
	}
	return kvevents.New(c.kvEventsConfig(), lg)
}

type kvEventsCollector struct {
	p                                                 *kvevents.Publisher
	published, events, dropped, replayed, subscribers *prometheus.Desc
	held, bad                                         *prometheus.Desc
}

func newKVEventsCollector(p *kvevents.Publisher) *kvEventsCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &kvEventsCollector{
		p:           p,
		published:   d("tidepool_kv_events_published_total", "KV event batches published on the PUB socket (kv_events_endpoint)."),
		events:      d("tidepool_kv_events_events_total", "KV events (BlockStored, BlockRemoved, AllBlocksCleared) published, in those batches."),
		dropped:     d("tidepool_kv_events_dropped_total", "KV events lost: reason=queue, changes dropped because the publishing queue (kv_events_queue) was full (the sequence then skips a number); reason=subscriber, batches a slow subscriber missed (its queue was full).", "reason"),
		replayed:    d("tidepool_kv_events_replayed_total", "KV event batches sent by the replay socket (snapshot batches included)."),
		subscribers: d("tidepool_kv_events_subscribers", "Connections to the KV events' PUB socket now."),
		held:        d("tidepool_kv_events_blocks", "Blocks the KV-event publisher knows this sidecar holds (its table: what a snapshot lists)."),
		bad:         d("tidepool_kv_events_bad_requests_total", "Messages on the replay socket that were not a replay request (dropped)."),
	}
}

func (c *kvEventsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.published, c.events, c.dropped, c.replayed, c.subscribers, c.held, c.bad} {
		ch <- d
	}
}

func (c *kvEventsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.p.Stats()
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	ch <- m(c.published, ctr, float64(st.Published))
	ch <- m(c.events, ctr, float64(st.Events))
	ch <- m(c.dropped, ctr, float64(st.Dropped), "queue")
	ch <- m(c.dropped, ctr, float64(st.SlowDropped), "subscriber")
	ch <- m(c.replayed, ctr, float64(st.Replayed))
	ch <- m(c.subscribers, g, float64(st.Subscribers))
	ch <- m(c.held, g, float64(st.Held))
	ch <- m(c.bad, ctr, float64(st.BadRequests))
}
