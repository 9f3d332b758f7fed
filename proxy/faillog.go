package proxy

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/internal/clock"
)

// pushWarnEvery is how often, at most, the failed pushes to one node are
// logged at warn level: a node that cannot take blocks fails every push
// to it, and one line per push (or per block) would bury the log.
const pushWarnEvery = 30 * time.Second

// failureLog logs failures at warn level once per node per interval: the
// first failure at once, then, at the first failure after the interval, a
// line with how many failed since the last line. Nodes come from the
// placement view, so the map is bounded by the cluster size.
type failureLog struct {
	lg    *zap.Logger
	msg   string
	every time.Duration
	clock clock.Clock

	mu    sync.Mutex
	nodes map[string]*nodeFailures
}

type nodeFailures struct {
	logged time.Time // when the last line was written
	count  int       // failures since then, not yet logged
}

func newFailureLog(lg *zap.Logger, msg string, every time.Duration, c clock.Clock) *failureLog {
	return &failureLog{lg: lg, msg: msg, every: every, clock: c, nodes: map[string]*nodeFailures{}}
}

// failed records n failures at node, err the latest, and logs them when
// the node's interval has passed.
func (l *failureLog) failed(node string, n int, err error) {
	now := l.clock.Now()
	l.mu.Lock()
	f := l.nodes[node]
	if f == nil {
		f = &nodeFailures{}
		l.nodes[node] = f
	}
	f.count += n
	if !f.logged.IsZero() && now.Sub(f.logged) < l.every {
		l.mu.Unlock()
		return
	}
	count, since := f.count, f.logged
	f.logged, f.count = now, 0
	l.mu.Unlock()
	fields := []zap.Field{zap.String("node", node), zap.Int("failed", count), zap.Error(err)}
	if !since.IsZero() {
		fields = append(fields, zap.Duration("since", now.Sub(since)))
	}
	l.lg.Warn(l.msg, fields...)
}
