// Package inject adds the tidepool sidecar to Kubernetes pod specs. One
// mutation, Config.Apply, serves both `tidepool inject` (YAML files, see
// File) and `tidepool webhook` (admission requests, see package
// inject/admit): the same input gives the same pod.
package inject

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/tidepool-kv/tidepool/internal/units"
)

// Errors, wrapped with the object and field they concern.
var (
	// ErrInvalid reports input the injector cannot handle: malformed YAML,
	// an object without a pod template, a bad annotation.
	ErrInvalid = errors.New("inject: invalid input")
	// ErrConflict reports a pod that already has something tidepool needs
	// under the same name (a volume, a mount path, a container).
	ErrConflict = errors.New("inject: conflict")
)

// Labels and annotations read (and the one label written) on pod templates.
const (
	// LabelInject opts a pod or a namespace in ("true") or a pod out
	// ("false"). `tidepool inject` injects every pod not labelled "false".
	LabelInject = "tidepool.io/inject"
	// LabelMember marks injected pods; the headless Service the sidecars
	// join through selects it.
	LabelMember = "tidepool.io/member"

	AnnotationDRAMCapacity = "tidepool.io/dram-capacity" // bytes (4GiB, 512MiB)
	AnnotationSSDCapacity  = "tidepool.io/ssd-capacity"  // bytes; 0 disables the SSD tier
	AnnotationSSDVolume    = "tidepool.io/ssd-volume"    // a volume (or claim template) of the pod for the SSD tier
	AnnotationImage        = "tidepool.io/image"         // sidecar image
	AnnotationSocket       = "tidepool.io/socket"        // socket path, in the sidecar and the engines
	AnnotationHugepages    = "tidepool.io/hugepages"     // "2Mi" or "1Gi": arenas on hugepages
	AnnotationRDMA         = "tidepool.io/rdma"          // "true", or an rdma resource name
	AnnotationContainers   = "tidepool.io/containers"    // comma-separated engine containers (default: the pod's default container)
	AnnotationJoin         = "tidepool.io/join"          // DNS name the sidecar joins
)

// Names of what injection adds.
const (
	ContainerName  = "tidepool"
	VolumeSocket   = "tidepool-socket"
	VolumeArenas   = "tidepool-arenas"
	VolumeSSD      = "tidepool-ssd"
	VolumeSecret   = "tidepool-secret"
	EnvSocket      = "TIDEPOOL_SOCKET"
	ArenaMountPath = "/run/tidepool-arenas"
	DataMountPath  = "/var/lib/tidepool"
	SecretPath     = "/etc/tidepool/secret"
)

// Well-known ports of the sidecar (the serve defaults with a bind address).
const (
	PortGossip   = 7946
	PortPeer     = 7947
	PortTransfer = 7948
	PortMetrics  = 9464
)

// Config says what to inject. Annotations on a pod override the fields
// they name (see the Annotation constants).
type Config struct {
	Image           string   // sidecar image
	ImagePullPolicy string   // Always, IfNotPresent, Never; empty: the cluster default
	Socket          string   // socket path; its directory is the socket volume's mount path
	DRAMCapacity    int64    // bytes of DRAM arenas (the memory emptyDir's size)
	SSDCapacity     int64    // bytes of the SSD tier; 0 disables it
	SSDVolume       string   // volume for the SSD tier; empty: an emptyDir named tidepool-ssd
	MemoryOverhead  int64    // bytes of sidecar memory beyond the arenas (heap, RocksDB caches)
	CPURequest      string   // the sidecar's CPU request (a Kubernetes quantity)
	Hugepages       string   // "", "2Mi" or "1Gi": arenas on hugepages of that size
	RDMA            bool     // request an RDMA device and IPC_LOCK
	RDMAResource    string   // the extended resource an RDMA device is requested as
	Join            string   // DNS name of the headless Service of the peers
	SecretName      string   // Secret with gossip.key and peer.secret
	Containers      []string // engine containers; empty: the pod's default container (see Apply)
}

// DefaultConfig is the injector's configuration without flags: image
// ghcr.io/tidepool-kv/tidepool:<version>.
func DefaultConfig(version string) Config {
	return Config{
		Image:          "ghcr.io/tidepool-kv/tidepool:" + version,
		Socket:         "/run/tidepool/tidepool.sock",
		DRAMCapacity:   4 << 30,
		SSDCapacity:    16 << 30,
		MemoryOverhead: 512 << 20,
		CPURequest:     "500m",
		RDMAResource:   "rdma/rdma_shared_device_a",
		Join:           "tidepool-peers.$(POD_NAMESPACE).svc",
		SecretName:     "tidepool-cluster",
	}
}

var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	resourceRe   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
	joinRe       = regexp.MustCompile(`^[A-Za-z0-9_$().\-]+(:[0-9]+)?$`)
)

// Validate reports every problem at once; field names are those of the
// annotations (and of the flags of `tidepool inject`).
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Image == "" || strings.ContainsAny(c.Image, " \t\n") {
		bad("image %q: want an image reference", c.Image)
	}
	switch c.ImagePullPolicy {
	case "", "Always", "IfNotPresent", "Never":
	default:
		bad("image pull policy %q: Always, IfNotPresent or Never", c.ImagePullPolicy)
	}
	if !path.IsAbs(c.Socket) || path.Clean(c.Socket) != c.Socket || len(c.Socket) > 107 {
		bad("socket %q: want a clean absolute path of at most 107 bytes", c.Socket)
	} else {
		dir := path.Dir(c.Socket)
		for _, p := range []string{"/", "/run", "/var", "/var/run", "/tmp", "/etc", "/dev", ArenaMountPath, DataMountPath, SecretPath} {
			if dir == p {
				bad("socket %q: its directory %s is mounted over in both containers, so it must be a directory of its own (such as /run/tidepool)", c.Socket, dir)
			}
		}
		if strings.HasPrefix(dir+"/", ArenaMountPath+"/") || strings.HasPrefix(dir+"/", DataMountPath+"/") || strings.HasPrefix(ArenaMountPath+"/", dir+"/") {
			bad("socket %q: its directory overlaps the arena mount %s or the data mount %s", c.Socket, ArenaMountPath, DataMountPath)
		}
	}
	if c.DRAMCapacity < 64<<20 {
		bad("dram capacity %s: at least 64MiB", units.FormatBytes(c.DRAMCapacity))
	}
	if c.SSDCapacity != 0 && c.SSDCapacity < 64<<20 {
		bad("ssd capacity %s: 0 (no SSD tier) or at least 64MiB", units.FormatBytes(c.SSDCapacity))
	}
	if c.SSDVolume != "" && !dnsLabel.MatchString(c.SSDVolume) {
		bad("ssd volume %q: not a volume name", c.SSDVolume)
	}
	if c.MemoryOverhead < 64<<20 {
		bad("memory overhead %s: at least 64MiB", units.FormatBytes(c.MemoryOverhead))
	}
	if _, err := parseQuantity(c.CPURequest); err != nil {
		bad("cpu request %q: %v", c.CPURequest, err)
	}
	switch c.Hugepages {
	case "":
	case "2Mi":
		if c.DRAMCapacity%(2<<20) != 0 {
			bad("dram capacity %s: hugepages 2Mi need a multiple of 2MiB", units.FormatBytes(c.DRAMCapacity))
		}
	case "1Gi":
		if c.DRAMCapacity%(1<<30) != 0 {
			bad("dram capacity %s: hugepages 1Gi need a multiple of 1GiB", units.FormatBytes(c.DRAMCapacity))
		}
	default:
		bad("hugepages %q: empty, 2Mi or 1Gi", c.Hugepages)
	}
	if !resourceRe.MatchString(c.RDMAResource) || !strings.Contains(c.RDMAResource, "/") {
		bad("rdma resource %q: want an extended resource name such as rdma/rdma_shared_device_a", c.RDMAResource)
	}
	if !joinRe.MatchString(c.Join) {
		bad("join %q: want a DNS name (such as tidepool-peers.$(POD_NAMESPACE).svc)", c.Join)
	}
	if len(c.SecretName) > 253 || !dnsSubdomain.MatchString(c.SecretName) {
		bad("secret %q: not a Secret name", c.SecretName)
	}
	for _, n := range c.Containers {
		if !dnsLabel.MatchString(n) {
			bad("containers: %q is not a container name", n)
		}
	}
	return errors.Join(errs...)
}

// withAnnotations returns c with the pod's annotations applied; at is the
// annotations' field path, for errors.
func (c Config) withAnnotations(ann map[string]string, at string) (Config, error) {
	var errs []error
	keys := slices.Sorted(maps.Keys(ann))
	for _, key := range keys {
		val := ann[key]
		if !strings.HasPrefix(key, "tidepool.io/") {
			continue
		}
		field := fmt.Sprintf("%s[%q]", at, key)
		badf := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, a...)))
		}
		switch key {
		case AnnotationDRAMCapacity, AnnotationSSDCapacity:
			n, err := units.ParseBytes(val)
			if err != nil {
				badf("%v", err)
				continue
			}
			if key == AnnotationDRAMCapacity {
				c.DRAMCapacity = n
			} else {
				c.SSDCapacity = n
			}
		case AnnotationSSDVolume:
			c.SSDVolume = val
		case AnnotationImage:
			c.Image = val
		case AnnotationSocket:
			c.Socket = val
		case AnnotationHugepages:
			c.Hugepages = val
		case AnnotationRDMA:
			switch val {
			case "true":
				c.RDMA = true
			case "false":
				c.RDMA = false
			default:
				c.RDMA, c.RDMAResource = true, val
			}
		case AnnotationContainers:
			c.Containers = nil
			for _, n := range strings.Split(val, ",") {
				if n = strings.TrimSpace(n); n != "" {
					c.Containers = append(c.Containers, n)
				}
			}
			if len(c.Containers) == 0 {
				badf("names no container")
			}
		case AnnotationJoin:
			c.Join = val
		}
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%w: %s (tidepool.io/ annotations and injector flags): %v", ErrInvalid, at, err)
	}
	return c, nil
}

// parseQuantity accepts the plain CPU quantities a flag may give: an
// integer or decimal number of cores, or millicores ("500m").
func parseQuantity(s string) (string, error) {
	t := strings.TrimSuffix(s, "m")
	if f, err := strconv.ParseFloat(t, 64); err != nil || f <= 0 || strings.ContainsAny(t, "eE+-") {
		return "", fmt.Errorf("want cores (2, 0.5) or millicores (500m)")
	}
	return s, nil
}
