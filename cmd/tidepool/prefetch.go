package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/tidepool-kv/tidepool/client"
)

// prefetchFlags are the flags of `tidepool prefetch`.
type prefetchFlags struct {
	socket, ns    string
	hexKeys, json bool
	timeout       time.Duration
}

func newPrefetchCmd(io *stdio) *cobra.Command {
	var f prefetchFlags
	cmd := &cobra.Command{
		Use:   "prefetch [flags] KEY...",
		Short: "bring blocks from SSD into DRAM",
		Long: `Queues the keys held in the sidecar's SSD tier to be brought into DRAM in the
background; keys already in DRAM or absent are skipped.`,
		GroupID:           groupClient,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, args []string) error {
			return exitWith(cmdPrefetch(f, args, io.Out, io.Err))
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.socket, "socket", envOr("TIDEPOOL_SOCKET", defaultSocket()), "sidecar socket (env TIDEPOOL_SOCKET)")
	fs.StringVar(&f.ns, "ns", envOr("TIDEPOOL_NS", "default"), "namespace (env TIDEPOOL_NS)")
	fs.BoolVar(&f.hexKeys, "hex", false, "keys are hex-encoded bytes instead of UTF-8 strings")
	fs.BoolVar(&f.json, "json", false, "machine-readable output")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "call timeout")
	return cmd
}

// cmdPrefetch runs `tidepool prefetch [--ns NS] [--hex] [--json] KEY...`:
// the sidecar queues the keys found in its SSD tier to be brought into
// DRAM in the background.
func cmdPrefetch(f prefetchFlags, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "tidepool prefetch: want at least one KEY")
		return exitUsage
	}
	keys := make([][]byte, len(args))
	for i, s := range args {
		if f.hexKeys {
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
	client.QuietKitexLogs()
	c, err := client.New(f.socket)
	if err != nil {
		fmt.Fprintf(stderr, "tidepool prefetch: %v\n", err)
		return exitUsage
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	n, err := c.Prefetch(ctx, f.ns, keys)
	if err != nil {
		if f.json {
			json.NewEncoder(stdout).Encode(map[string]any{"error": err.Error(), "code": client.CodeOf(err).String()})
		}
		fmt.Fprintf(stderr, "tidepool prefetch: %v\n", err)
		return exitError
	}
	if f.json {
		json.NewEncoder(stdout).Encode(map[string]any{"queued": n, "keys": len(keys)})
	} else {
		fmt.Fprintf(stdout, "queued %d of %d keys\n", n, len(keys))
	}
	return exitOK
}
