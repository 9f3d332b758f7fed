package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/cache/gpu"
)

// openGPU opens the GPU end (cache/gpu) with cfg.GPULibrary and, when a
// device is there, pins every arena of t once (cuMemHostRegister), so that
// the copies between engines' GPU memory and the arenas run at the pinned
// rate (an arena that cannot be pinned is logged and used unpinned). Without a library or a device it returns a GPU that is not
// Available, and the sidecar runs as without it. Close it after the
// engine API server and before the store (which unmaps the arenas).
func openGPU(cfg Config, t arenaTier, lg *zap.Logger) (*gpu.GPU, error) {
	gcfg := gpu.DefaultConfig()
	gcfg.Library = cfg.GPULibrary
	g, err := gpu.Open(gcfg, lg)
	if err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	if !g.Available() {
		lg.Info("no GPU end", zap.String("reason", g.Reason()))
		return g, nil
	}
	for i, mem := range tierArenaMems(t) {
		if err := g.PinHost(mem); err != nil {
			// The copies still work, staged by the driver through its own
			// pinned buffers, at a fraction of the speed (docs/gpu.md:
			// arenas on tmpfs).
			lg.Warn("arena not pinned for the GPU; its copies will be slower", zap.Int("arena", i), zap.Error(err))
		}
	}
	names := make([]string, 0)
	for _, d := range g.Devices() {
		names = append(names, d.Name)
	}
	lg.Info("GPU end on", zap.Strings("devices", names), zap.String("library", cfg.GPULibrary))
	return g, nil
}

// gpuCollector exports the GPU end's counters (cache/gpu.Stats).
type gpuCollector struct {
	g                                                  *gpu.GPU
	devices, buffers, pinned, toHost, toDevice, errors *prometheus.Desc
}

func newGPUCollector(g *gpu.GPU) *gpuCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &gpuCollector{
		g:        g,
		devices:  d("tidepool_gpu_devices", "CUDA devices of the GPU end (0: no driver or no device; docs/gpu.md)."),
		buffers:  d("tidepool_gpu_ipc_handles_open", "Engine GPU allocations opened from CUDA IPC handles, open now."),
		pinned:   d("tidepool_gpu_pinned_bytes", "Arena bytes pinned for the GPU (cuMemHostRegister)."),
		toHost:   d("tidepool_gpu_saved_bytes_total", "Bytes the GPU end copied from engines' GPU memory into the arenas (GpuSave)."),
		toDevice: d("tidepool_gpu_loaded_bytes_total", "Bytes the GPU end copied from the arenas into engines' GPU memory (GpuLoad)."),
		errors:   d("tidepool_gpu_copy_errors_total", "Blocks whose GPU copy the driver reported failed (answered INTERNAL)."),
	}
}

func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.devices, c.buffers, c.pinned, c.toHost, c.toDevice, c.errors} {
		ch <- d
	}
}

func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.g.Stats()
	g, ctr := prometheus.GaugeValue, prometheus.CounterValue
	m := prometheus.MustNewConstMetric
	ch <- m(c.devices, g, float64(st.Devices))
	ch <- m(c.buffers, g, float64(st.OpenBuffers))
	ch <- m(c.pinned, g, float64(st.PinnedBytes))
	ch <- m(c.toHost, ctr, float64(st.ToHostBytes))
	ch <- m(c.toDevice, ctr, float64(st.ToDeviceBytes))
	ch <- m(c.errors, ctr, float64(st.CopyErrors))
}
