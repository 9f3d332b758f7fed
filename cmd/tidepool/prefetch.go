package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/tidepool-kv/tidepool/client"
)

// cmdPrefetch runs `tidepool prefetch [--ns NS] [--hex] [--json] KEY...`:
// the sidecar queues the keys found in its SSD tier to be brought into
// DRAM in the background.
func cmdPrefetch(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("prefetch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", envOr("TIDEPOOL_SOCKET", defaultSocket()), "sidecar socket (env TIDEPOOL_SOCKET)")
	ns := fs.String("ns", envOr("TIDEPOOL_NS", "default"), "namespace (env TIDEPOOL_NS)")
	hexKeys := fs.Bool("hex", false, "keys are hex-encoded bytes instead of UTF-8 strings")
	asJSON := fs.Bool("json", false, "machine-readable output")
	timeout := fs.Duration("timeout", 30*time.Second, "call timeout")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: tidepool prefetch [flags] KEY...\n\nQueues the keys held in the sidecar's SSD tier to be brought into DRAM in the\nbackground; keys already in DRAM or absent are skipped.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "tidepool prefetch: want at least one KEY")
		return exitUsage
	}
	keys := make([][]byte, fs.NArg())
	for i, s := range fs.Args() {
		if *hexKeys {
			b, err := hex.DecodeString(s)
			if err != nil {
				fmt.Fprintf(stderr, "tidepool prefetch: key %q is not hex: %v\n", s, err)
				return exitUsage
			}
			keys[i] = b
		} else {
			keys[i] = []byte(s)
		}
	}
	c, err := client.New(*socket)
	if err != nil {
		fmt.Fprintf(stderr, "tidepool prefetch: %v\n", err)
		return exitUsage
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	n, err := c.Prefetch(ctx, *ns, keys)
	if err != nil {
		if *asJSON {
			json.NewEncoder(stdout).Encode(map[string]any{"error": err.Error(), "code": client.CodeOf(err).String()})
		}
		fmt.Fprintf(stderr, "tidepool prefetch: %v\n", err)
		return exitError
	}
	if *asJSON {
		json.NewEncoder(stdout).Encode(map[string]any{"queued": n, "keys": len(keys)})
	} else {
		fmt.Fprintf(stdout, "queued %d of %d keys\n", n, len(keys))
	}
	return exitOK
}
