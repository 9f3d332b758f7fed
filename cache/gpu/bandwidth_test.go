package gpu

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/tidepool-kv/tidepool/cache"
)

// TestBandwidth measures the package's batched copies of 2 MiB blocks
// against one synchronous cuMemcpy of the same bytes between the same
// pinned host memory and device memory (the limit), both directions, and
// logs the figures (no assertion on speed). Each block is copied whole and
// as 64 pieces of 32 KiB (K and V of 32 layers: vLLM's FlashAttention
// layout). It runs where TIDEPOOL_GPU_BENCH is set (scripts/device-check.sh,
// against the real driver); on the stand-in it only shows the path works.
func TestBandwidth(t *testing.T) {
	if os.Getenv("TIDEPOOL_GPU_BENCH") == "" {
		t.Skip("set TIDEPOOL_GPU_BENCH=1 (scripts/device-check.sh)")
	}
	const block, nblocks = 2 << 20, 128
	const size = block * nblocks
	g := openGPU(t)
	w := g.devs[0].save
	var dptr uint64
	var err error
	w.run(func(w *worker) {
		err = w.d.call("cuMemAlloc_v2", w.d.cuMemAlloc, uintptr(unsafe.Pointer(&dptr)), uintptr(size))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.run(func(w *worker) { _ = w.d.call("cuMemFree_v2", w.d.cuMemFree, uintptr(dptr)) })
	host, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(host)
	if err := g.PinHost(host); err != nil {
		t.Fatal(err)
	}
	limit := func(toHost bool) float64 {
		start := time.Now()
		w := g.devs[0].save
		w.run(func(w *worker) {
			if toHost {
				err = w.d.call("cuMemcpyDtoH_v2", w.d.cuMemcpyDtoH, uintptr(unsafe.Pointer(&host[0])), uintptr(dptr), uintptr(size))
			} else {
				err = w.d.call("cuMemcpyHtoD_v2", w.d.cuMemcpyHtoD, uintptr(dptr), uintptr(unsafe.Pointer(&host[0])), uintptr(size))
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		return float64(size) / time.Since(start).Seconds() / 1e9
	}
	batched := func(toHost bool, pieces int) float64 {
		items := make([][]cache.DeviceCopy, nblocks)
		piece := block / pieces
		for b := range items {
			for p := 0; p < pieces; p++ {
				off := b*block + p*piece
				items[b] = append(items[b], cache.DeviceCopy{Device: dptr + uint64(off), Host: host[off : off+piece]})
			}
		}
		start := time.Now()
		var errs []error
		if toHost {
			errs = g.ToHost(context.Background(), 0, items)
		} else {
			errs = g.ToDevice(context.Background(), 0, items)
		}
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		return float64(size) / time.Since(start).Seconds() / 1e9
	}
	limit(true) // warm up
	batched(true, 1)
	for _, dir := range []struct {
		name   string
		toHost bool
	}{{"save (device to host)", true}, {"load (host to device)", false}} {
		lim := limit(dir.toHost)
		whole := batched(dir.toHost, 1)
		split := batched(dir.toHost, 64)
		t.Logf("%s on %s: cuMemcpy %.1f GB/s; batched 2 MiB blocks %.1f GB/s (%.2f); as 64 x 32 KiB %.1f GB/s (%.2f)",
			dir.name, g.Devices()[0].Name, lim, whole, whole/lim, split, split/lim)
	}
}
