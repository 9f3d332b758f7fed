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
	err := inproc.Config{}.Validate()
	if err == nil {
		t.Fatal("zero config validated")
	}
	for _, want := range []string{"Network", "ChunkSize", "MaxTransfer"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q, missing %s", err, want)
		}
	}
}
