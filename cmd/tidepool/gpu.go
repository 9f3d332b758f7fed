package main

import (
	"fmt"

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
