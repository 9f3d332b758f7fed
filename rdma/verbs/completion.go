//go:build verbs

package verbs

import (
	"runtime"

	"go.uber.org/zap"
)

// pollLoop takes completions off the CQ in batches and hands each to the
// transfer that posted it; when the CQ is empty it arms it and sleeps on
// the completion channel. Locked to its thread: verbs polling wants one.
func (t *Transport) pollLoop(dev *device) {
	defer t.pollWG.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]wc, 32)
	for !t.stopPol.Load() {
		n, err := dev.poll(buf)
		if err != nil {
			t.lg.Error("poll_cq", zap.Error(err))
			return
		}
		t.dispatch(buf[:n])
		if n > 0 {
			continue
		}
		if err := dev.arm(); err != nil {
			t.lg.Error("arm cq", zap.Error(err))
			return
		}
		if n, _ = dev.poll(buf); n > 0 {
			t.dispatch(buf[:n])
			continue
		}
		if _, err := dev.wait(t.wake); err != nil {
			t.lg.Error("cq event", zap.Error(err))
			return
		}
	}
}

func (t *Transport) dispatch(ws []wc) {
	for _, w := range ws {
		if ch, ok := t.waiters.Load(uint64(w.wr_id)); ok {
			ch.(chan wc) <- w // buffered for every WR the transfer has in flight
		}
	}
}
