// Command tidepool is the KV-cache sidecar and its command-line client.
//
//	tidepool serve                    run the sidecar (embedded defaults)
//	tidepool put KEY [FILE]           store a block (value from FILE or stdin)
//	tidepool get KEY                  print a block's bytes
//	tidepool exists KEY...            presence per key
//	tidepool lookup KEY...            length of the longest present prefix
//	tidepool delete KEY               remove a block
//	tidepool clear                    remove every block of a namespace
//	tidepool stat                     tiers and namespaces
//	tidepool prefetch KEY...          bring blocks from SSD into DRAM
//	tidepool inject [FILE]...         add the sidecar to Kubernetes YAML
//	tidepool webhook                  the same as a mutating admission webhook
//	tidepool version                  print the version
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// version is set at build time by `make build` (-ldflags
// "-X main.version=..."); a plain `go build` leaves it empty and
// buildVersion falls back to the module's build information.
var version string

// fallbackVersion is reported when neither -ldflags nor the build
// information name a version.
const fallbackVersion = "0.1.0-dev"

// buildVersion is the version this binary reports, in `tidepool version`
// and as the build string of Hello: the -ldflags value; else the main
// module's version from the build information (a tag or pseudo-version
// when built as a module or with VCS stamping); else fallbackVersion, with
// the VCS revision when the build recorded one.
func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fallbackVersion
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return fallbackVersion
	}
	return fallbackVersion + "+" + rev[:min(12, len(rev))] + dirty
}

const usage = `tidepool: a KV-cache sidecar for LLM inference pods

usage: tidepool <command> [flags] [args]

commands:
  serve     run the sidecar (no flags: embedded defaults)
  put       store a block:            tidepool put [--ns NS] [--durable] KEY [FILE|-]
  get       fetch a block:            tidepool get [--ns NS] [-o FILE] KEY
  exists    presence of blocks:       tidepool exists [--ns NS] KEY...
  lookup    longest present prefix:   tidepool lookup [--ns NS] KEY...
  delete    remove a block:           tidepool delete [--ns NS] KEY
  clear     remove a namespace:       tidepool clear --ns NS
  stat      tiers and namespaces:     tidepool stat [--ns NS]
  members   the cluster view:         tidepool members [--json]
  prefetch  SSD blocks into DRAM:     tidepool prefetch [--ns NS] KEY...
  bench     load generator:           tidepool bench --op get --size 1MiB --concurrency 16
  replay    replay a request trace:   tidepool replay --trace FILE --nodes 1 --capacity-tokens 3M
  inject    add the sidecar to pods:  tidepool inject [--dram-capacity 32GiB] [FILE|-]... | kubectl apply -f -
  webhook   injection as an admission webhook: tidepool webhook --cert-dir DIR
  version   print the version

Client commands take --socket (env TIDEPOOL_SOCKET), --ns (env TIDEPOOL_NS),
--hex (keys are hex bytes) and --json. Run 'tidepool <command> -h' for more.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return cmdServe(rest, stdout, stderr)
	case "put", "get", "exists", "lookup", "delete", "clear", "stat", "members":
		return cmdClient(cmd, rest, stdin, stdout, stderr)
	case "prefetch":
		return cmdPrefetch(rest, stdout, stderr)
	case "bench":
		return cmdBench(rest, stdout, stderr)
	case "replay":
		return cmdReplay(rest, stdout, stderr)
	case "inject":
		return cmdInject(rest, stdin, stdout, stderr)
	case "webhook":
		return cmdWebhook(rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "tidepool %s (%s)\n", buildVersion(), goVersion)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "tidepool: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}
