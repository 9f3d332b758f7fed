package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/tidepool-kv/tidepool/inject"
	"github.com/tidepool-kv/tidepool/inject/admit"
	"github.com/tidepool-kv/tidepool/internal/units"
)

const injectLong = `Adds the tidepool sidecar to the pods of Kubernetes YAML (Deployments,
StatefulSets, DaemonSets, ReplicaSets, Jobs, CronJobs, Pods, LeaderWorkerSets;
multi-document files) and writes it to stdout, like istioctl kube-inject:

  tidepool inject deploy/examples/vllm.yaml | kubectl apply -f -
  kubectl get deploy vllm -o yaml | tidepool inject --dram-capacity 32GiB - | kubectl apply -f -

The sidecar is a native sidecar (an init container with restartPolicy:
Always); docs/kubernetes.md lists what it adds and the tidepool.io/
annotations that override these flags per pod. Injecting twice changes
nothing; other objects and fields are left as they are. On any error
(malformed YAML, an object without a pod template, a volume of tidepool's
name with another source) it names the file, document, object and field,
and writes nothing.`

const webhookLong = `Serves the injection of 'tidepool inject' as a Kubernetes mutating admission
webhook (AdmissionReview v1 over HTTPS at /inject, JSONPatch responses),
for pods labelled tidepool.io/inject=true or in namespaces labelled so
(deploy/ registers it). TLS comes from --cert-dir in cert-manager's layout
(tls.crt, tls.key) and is reloaded when the files change. /healthz and
/readyz are served over plain HTTP on --health-addr.`

// injectorFlags binds the injector's settings to fs, with cfg's values as
// defaults; the returned function applies the byte sizes and lists.
func injectorFlags(fs *pflag.FlagSet, cfg *inject.Config) func() error {
	fs.StringVar(&cfg.Image, "image", cfg.Image, "sidecar image (annotation tidepool.io/image)")
	fs.StringVar(&cfg.ImagePullPolicy, "image-pull-policy", cfg.ImagePullPolicy, "sidecar imagePullPolicy: Always, IfNotPresent, Never; empty: the cluster default")
	fs.StringVar(&cfg.Socket, "sidecar-socket", cfg.Socket, "socket path in the pod (annotation tidepool.io/socket)")
	dram := fs.String("dram-capacity", units.FormatBytes(cfg.DRAMCapacity), "DRAM arena bytes per pod (annotation tidepool.io/dram-capacity)")
	ssd := fs.String("ssd-capacity", units.FormatBytes(cfg.SSDCapacity), "SSD tier bytes per pod; 0 disables it (annotation tidepool.io/ssd-capacity)")
	fs.StringVar(&cfg.SSDVolume, "ssd-volume", cfg.SSDVolume, "pod volume for the SSD tier; empty: an emptyDir (annotation tidepool.io/ssd-volume)")
	over := fs.String("memory-overhead", units.FormatBytes(cfg.MemoryOverhead), "sidecar memory beyond the arenas")
	fs.StringVar(&cfg.CPURequest, "cpu", cfg.CPURequest, "sidecar CPU request (500m, 2)")
	fs.StringVar(&cfg.Hugepages, "hugepages", cfg.Hugepages, "arenas on hugepages: 2Mi or 1Gi; empty: memory (annotation tidepool.io/hugepages)")
	fs.BoolVar(&cfg.RDMA, "rdma", cfg.RDMA, "request an RDMA device and IPC_LOCK (annotation tidepool.io/rdma)")
	fs.StringVar(&cfg.RDMAResource, "rdma-resource", cfg.RDMAResource, "extended resource of an RDMA device (rdma/ib, nvidia.com/hostdev, ...)")
	fs.StringVar(&cfg.Join, "join", cfg.Join, "DNS name of the peers' headless Service (annotation tidepool.io/join)")
	fs.StringVar(&cfg.SecretName, "secret", cfg.SecretName, "Secret holding gossip.key and peer.secret")
	containers := fs.String("containers", "", "comma-separated engine containers; empty: the pod's default container (annotation tidepool.io/containers)")
	return func() error {
		var errs []error
		for _, x := range []struct {
			name, v string
			p       *int64
		}{{"dram-capacity", *dram, &cfg.DRAMCapacity}, {"ssd-capacity", *ssd, &cfg.SSDCapacity}, {"memory-overhead", *over, &cfg.MemoryOverhead}} {
			n, err := units.ParseBytes(x.v)
			if err != nil {
				errs = append(errs, fmt.Errorf("--%s: %w", x.name, err))
			}
			*x.p = n
		}
		for _, c := range strings.Split(*containers, ",") {
			if c = strings.TrimSpace(c); c != "" {
				cfg.Containers = append(cfg.Containers, c)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if cfg.Image == "" {
			return errNoImage
		}
		return cfg.Validate()
	}
}

// errNoImage: the binary cannot name its own image and --image is missing.
var errNoImage = errors.New("--image is required: this tidepool binary has no release version " +
	"(a plain `go build`; `make build VERSION=...` and the Dockerfile set one), so it cannot name the sidecar image " +
	"(ghcr.io/tidepool-kv/tidepool:<version>); give --image REPOSITORY:TAG")

// imageTag is what a container image tag may be (the OCI distribution
// spec): a release version is one; "(devel)" or "v1.0.0+incompatible" is
// not.
var imageTag = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// pseudoVersion matches a Go pseudo-version's tail (a commit time and
// hash): a build of an untagged commit, for which no image is published.
var pseudoVersion = regexp.MustCompile(`[0-9]{14}-[0-9a-f]{12}$`)

// sidecarImage is the default sidecar image: ghcr.io/tidepool-kv/tidepool
// tagged with this binary's release version, ldflagsVersion (-ldflags
// -X main.version), else the main module's version from the build
// information when it is a valid tag (built as a module at a version).
// "" when the binary has none (a plain `go build` of a checkout): the
// commands then require --image (errNoImage) rather than inject an image
// tagged with nothing, which a kubelet cannot pull.
func sidecarImage(ldflagsVersion string) string {
	tag := ldflagsVersion
	if tag == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			tag = bi.Main.Version
		}
	}
	if !imageTag.MatchString(tag) || pseudoVersion.MatchString(tag) {
		return ""
	}
	return inject.DefaultConfig(tag).Image
}

func newInjectCmd(io *stdio) *cobra.Command {
	cfg := inject.DefaultConfig(version)
	cfg.Image = sidecarImage(version)
	var out string
	cmd := &cobra.Command{
		Use:     "inject [flags] [FILE|-]...",
		Short:   "add the sidecar to the pods of Kubernetes YAML",
		Long:    injectLong,
		GroupID: groupTools,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	finish := injectorFlags(fs, &cfg)
	fs.StringVarP(&out, "output", "o", "", "write to this file (replaced whole, only on success) instead of stdout")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		if err := finish(); err != nil {
			return usageError("%v", err)
		}
		return exitWith(cmdInject(&cfg, out, args, io.In, io.Out, io.Err))
	}
	return cmd
}

// cmdInject runs `tidepool inject` with the injector's configuration, the
// -o file ("" for stdout) and the input files.
func cmdInject(cfg *inject.Config, out string, files []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(files) == 0 {
		files = []string{"-"}
	}
	// Everything is read and injected before anything is written.
	var result []byte
	for i, f := range files {
		src, name, err := readInput(f, stdin)
		if err != nil {
			fmt.Fprintf(stderr, "tidepool inject: %v\n", err)
			return 1
		}
		res, err := cfg.File(name, src)
		if err != nil {
			fmt.Fprintf(stderr, "tidepool inject: %v\n", err)
			return 1
		}
		if i > 0 && len(res) > 0 {
			result = append(result, "---\n"...)
		}
		result = append(result, res...)
	}
	if out == "" {
		if _, err := stdout.Write(result); err != nil {
			fmt.Fprintf(stderr, "tidepool inject: %v\n", err)
			return 1
		}
		return 0
	}
	if err := writeFileAtomic(out, result); err != nil {
		fmt.Fprintf(stderr, "tidepool inject: %v\n", err)
		return 1
	}
	return 0
}

// readInput reads one input of at most inject.MaxFileSize bytes.
func readInput(f string, stdin io.Reader) ([]byte, string, error) {
	name := f
	r := stdin
	if f == "-" {
		name = "<stdin>"
	} else {
		fh, err := os.Open(f)
		if err != nil {
			return nil, name, err
		}
		defer fh.Close()
		r = fh
	}
	src, err := io.ReadAll(io.LimitReader(r, inject.MaxFileSize+1))
	if err != nil {
		return nil, name, fmt.Errorf("%s: %w", name, err)
	}
	if len(src) > inject.MaxFileSize {
		return nil, name, fmt.Errorf("%s: larger than %s", name, units.FormatBytes(inject.MaxFileSize))
	}
	return src, name, nil
}

// writeFileAtomic replaces path with data through a temporary file in
// its directory, so a reader sees the old file or the new one.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// webhookFlags are the flags of `tidepool webhook` beyond the injector's.
type webhookFlags struct {
	addr, certDir, healthAddr, logLevel, logFormat string
}

func newWebhookCmd(io *stdio) *cobra.Command {
	cfg := inject.DefaultConfig(version)
	cfg.Image = sidecarImage(version)
	var f webhookFlags
	cmd := &cobra.Command{
		Use:               "webhook [flags]",
		Short:             "the injection as a mutating admission webhook",
		Long:              webhookLong,
		GroupID:           groupTools,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	finish := injectorFlags(fs, &cfg)
	fs.StringVar(&f.addr, "addr", ":9443", "HTTPS listen address of the webhook")
	fs.StringVar(&f.certDir, "cert-dir", "/etc/tidepool/webhook", "directory holding tls.crt and tls.key (a cert-manager Secret mount)")
	fs.StringVar(&f.healthAddr, "health-addr", ":8081", "plain HTTP address of /healthz and /readyz; empty disables")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "json", "json or console")
	completeWords(cmd, "log-level", "debug", "info", "warn", "error")
	completeWords(cmd, "log-format", "json", "console")
	cmd.RunE = func(*cobra.Command, []string) error {
		if err := finish(); err != nil {
			return usageError("%v", err)
		}
		return exitWith(cmdWebhook(cfg, f, io.Err))
	}
	return cmd
}

// cmdWebhook runs `tidepool webhook` with the injector's configuration and
// its own flags.
func cmdWebhook(cfg inject.Config, f webhookFlags, stderr io.Writer) int {
	host, portStr, err := net.SplitHostPort(f.addr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		fmt.Fprintf(stderr, "tidepool webhook: --addr %q: want host:port\n", f.addr)
		return 2
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(f.certDir, name)); err != nil {
			fmt.Fprintf(stderr, "tidepool webhook: --cert-dir: %v\n", err)
			return 1
		}
	}
	lg, err := newLogger(f.logLevel, f.logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "tidepool webhook: --log-level/--log-format: %v\n", err)
		return 2
	}
	defer lg.Sync()
	ctrllog.SetLogger(zapr.NewLogger(lg.Named("webhook")))

	h, err := admit.New(cfg, lg)
	if err != nil {
		fmt.Fprintf(stderr, "tidepool webhook: %v\n", err)
		return 2
	}
	srv := webhook.NewServer(webhook.Options{Host: host, Port: port, CertDir: f.certDir, CertName: "tls.crt", KeyName: "tls.key"})
	srv.Register(admit.Path, h.Webhook())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if f.healthAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
			if err := srv.StartedChecker()(r); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		l, err := net.Listen("tcp", f.healthAddr)
		if err != nil {
			fmt.Fprintf(stderr, "tidepool webhook: --health-addr: %v\n", err)
			return 1
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(l)
		defer hs.Close()
	}
	lg.Info("webhook serving", zap.String("addr", f.addr), zap.String("path", admit.Path), zap.String("cert_dir", f.certDir))
	if err := srv.Start(ctx); err != nil {
		lg.Error("webhook server failed", zap.Error(err))
		return 1
	}
	lg.Info("webhook stopped")
	return 0
}
