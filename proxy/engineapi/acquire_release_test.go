//go:build linux

package engineapi_test

import (
	"context"
	"slices"
	"testing"
	"time"

	kclient "github.com/cloudwego/kitex/client"

	"github.com/tidepool-kv/tidepool/client"
	tp "github.com/tidepool-kv/tidepool/protocol/gen/tidepool"
	tpsvc "github.com/tidepool-kv/tidepool/protocol/gen/tidepool/tidepool"
	"github.com/tidepool-kv/tidepool/proxy/engineapi"
)

// TestAcquireReleasesRidingLeases: Hello lists "acquire_release", and an
// Acquire releases the lease ids riding in release_lease_ids before it
// acquires (a client's finished reads, instead of a Release round trip);
// too many ids refuse the whole call and release nothing.
func TestAcquireReleasesRidingLeases(t *testing.T) {
	ts := startServer(t, serverOpts{maxBatch: 4})
	ctx := context.Background()
	raw, err := tpsvc.NewClient("tidepool", kclient.WithHostPorts(ts.socket), kclient.WithRPCTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}

	h, err := ts.c.Hello(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(h.Features, engineapi.FeatureAcquireRelease) {
		t.Fatalf("Hello features %q lack %q", h.Features, engineapi.FeatureAcquireRelease)
	}
	for _, k := range []string{"a", "b"} {
		if _, err := ts.c.Put(ctx, "ns", []byte(k), randBytes(3, 4096), 0); err != nil {
			t.Fatal(err)
		}
	}
	acquire := func(key string, release []int64) (*tp.AcquireResponse, error) {
		return raw.Acquire(ctx, &tp.AcquireRequest{Ns: "ns", Keys: [][]byte{[]byte(key)}, ReleaseLeaseIds: release})
	}
	lease := func(r *tp.AcquireResponse, err error) int64 {
		t.Helper()
		if err != nil || len(r.Results) != 1 || r.Results[0].Code != tp.ErrorCode_OK {
			t.Fatalf("Acquire = %+v, %v", r, err)
		}
		return r.Results[0].LeaseId
	}

	l1 := lease(acquire("a", nil))
	// l1 and an id never handed out ride on the next Acquire: l1 is
	// released, the unknown id ignored, the new lease held.
	l2 := lease(acquire("b", []int64{l1, 12345}))
	rel, err := ts.c.Release(ctx, []int64{l1, l2})
	if err != nil {
		t.Fatal(err)
	}
	if client.CodeOf(rel[0]) != client.CodeLeaseExpired || rel[1] != nil {
		t.Fatalf("Release(l1 released by the Acquire, l2 held) = %v, want LEASE_EXPIRED, OK", rel)
	}

	// More ids than max_batch: the whole call is refused before anything
	// is released or acquired.
	l3 := lease(acquire("a", nil))
	if _, err := acquire("b", []int64{l3, 1, 2, 3, 4}); err == nil {
		t.Fatal("Acquire with 5 ids to release, max batch 4: no error")
	} else if te, ok := err.(*tp.TidepoolError); !ok || te.Code != tp.ErrorCode_BATCH_TOO_LARGE {
		t.Fatalf("Acquire with 5 ids to release, max batch 4 = %v, want BATCH_TOO_LARGE", err)
	}
	if rel, err := ts.c.Release(ctx, []int64{l3}); err != nil || rel[0] != nil {
		t.Fatalf("l3 after the refused Acquire: Release = %v, %v (want OK: still held)", rel, err)
	}
}
