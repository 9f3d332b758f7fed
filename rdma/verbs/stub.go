//go:build !verbs

package verbs

import (
	"go.uber.org/zap"

	"github.com/tidepool-kv/tidepool/rdma"
)

// Built reports whether the binary has the verbs binding.
const Built = false

// Probe lists the usable devices: without the binding, none.
func Probe(Config) ([]DeviceInfo, error) { return nil, ErrNotBuilt }

// New returns ErrNotBuilt: this binary was built without -tags verbs.
func New(Config, *zap.Logger) (rdma.Transport, error) { return nil, ErrNotBuilt }
