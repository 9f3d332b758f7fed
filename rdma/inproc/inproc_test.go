package inproc_test

import (
	"strings"
	"testing"

	"github.com/tidepool-kv/tidepool/rdma"
	"github.com/tidepool-kv/tidepool/rdma/inproc"
	"github.com/tidepool-kv/tidepool/rdma/rdmatest"
)

func TestConformance(t *testing.T) {
	rdmatest.Run(t, func(t *testing.T) (rdma.Transport, rdma.Transport) {
		n := inproc.NewNetwork()
		cfg := inproc.DefaultConfig()
		cfg.Network = n
		a, err := inproc.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := inproc.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	})
}

func TestConfigValidate(t *testing.T) {
	if err := (inproc.Config{Network: inproc.NewNetwork()}).Validate(); err != nil {
		t.Fatalf("zero config (all defaults) but Network: %v", err)
	}
	err := inproc.Config{ChunkSize: -1}.Validate()
	if err == nil {
		t.Fatal("bad config validated")
	}
	for _, want := range []string{"Network", "ChunkSize"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q, missing %s", err, want)
		}
	}
}
