package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/tidepool-kv/tidepool/client"
)

type clientFlags struct {
	socket  string
	ns      string
	hexKeys bool
	json    bool
	timeout time.Duration
	depth   int
	durable bool
	out     string
	nsSet   bool // --ns or TIDEPOOL_NS given (stat then shows one namespace)
	scope   string
}

// scopeOf converts --scope.
func scopeOf(s string) (client.Scope, error) {
	switch s {
	case "", "default":
		return client.ScopeDefault, nil
	case "local":
		return client.ScopeLocal, nil
	case "cluster":
		return client.ScopeCluster, nil
	}
	return 0, fmt.Errorf("%w: --scope %q: local or cluster", errUsage, s)
}

// clientSpec describes one client command.
type clientSpec struct {
	name, args, short, long string
	files                   bool // the arguments may name files (shell completion)
}

var clientSpecs = []clientSpec{
	{"put", "KEY [FILE|-]", "store a block", `Stores a block: its value comes from FILE, or standard input when FILE is
absent or '-'. An existing block is left unchanged ("exists").`, true},
	{"get", "KEY", "fetch a block", `Prints a block's bytes on standard output, or writes them to -o FILE.
Exit status 3 when the key is absent.`, false},
	{"exists", "KEY...", "presence of blocks", `Prints per key whether it is present, with its tier and node.
Exit status 3 when any key is absent.`, false},
	{"lookup", "KEY...", "longest present prefix", `Prints how many of the leading keys are present (the keys are one prefix
chain, first block first).`, false},
	{"delete", "KEY", "remove a block", `Removes a block. Exit status 3 when the key was absent.`, false},
	{"clear", "", "remove every block of a namespace", `Removes every block of the namespace --ns.`, false},
	{"stat", "", "tiers and namespaces", `Prints the tiers and the namespaces (one namespace with --ns or TIDEPOOL_NS).`, false},
	{"members", "", "the cluster view", `Prints the members of the cluster as this sidecar sees them.`, false},
}

// clientCommands are the commands that call a running sidecar.
func clientCommands(io *stdio) []*cobra.Command {
	cmds := make([]*cobra.Command, len(clientSpecs))
	for i, sp := range clientSpecs {
		cmds[i] = newClientCmd(sp, io)
	}
	return cmds
}

func newClientCmd(sp clientSpec, io *stdio) *cobra.Command {
	var f clientFlags
	name := sp.name
	cmd := &cobra.Command{
		Use:     strings.TrimSpace(name + " [flags] " + sp.args),
		Short:   sp.short,
		Long:    sp.long,
		GroupID: groupClient,
	}
	if !sp.files {
		cmd.ValidArgsFunction = cobra.NoFileCompletions
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.socket, "socket", envOr("TIDEPOOL_SOCKET", defaultSocket()), "sidecar socket (env TIDEPOOL_SOCKET)")
	fs.StringVar(&f.ns, "ns", envOr("TIDEPOOL_NS", "default"), "namespace (env TIDEPOOL_NS)")
	fs.BoolVar(&f.hexKeys, "hex", false, "keys are hex-encoded bytes instead of UTF-8 strings")
	fs.BoolVar(&f.json, "json", false, "machine-readable output")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "call timeout")
	if name == "get" || name == "exists" || name == "lookup" {
		fs.StringVar(&f.scope, "scope", "", "where to look: local (this sidecar) or cluster (also the owners); default: cluster on a clustered node")
	}
	if name == "delete" || name == "clear" {
		fs.StringVar(&f.scope, "scope", "", "where to delete: local (this sidecar) or cluster (every member); default: cluster on a clustered node")
	}
	if fs.Lookup("scope") != nil {
		completeWords(cmd, "scope", "local", "cluster", "default")
	}
	if name == "put" {
		fs.IntVar(&f.depth, "depth", 0, "position of the block in its prefix chain (0 = first)")
		fs.BoolVar(&f.durable, "durable", false, "write the block through to the SSD tier (WAL synced) before answering")
	}
	if name == "get" {
		fs.StringVarP(&f.out, "output", "o", "", "write the value to this file instead of stdout")
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		f.nsSet = os.Getenv("TIDEPOOL_NS") != "" || cmd.Flags().Changed("ns")
		return exitWith(cmdClient(name, f, args, io.In, io.Out, io.Err))
	}
	return cmd
}

// cmdClient runs client command cmd with its parsed flags f and arguments.
func cmdClient(cmd string, f clientFlags, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	keys, err := parseKeys(args, cmd, f.hexKeys)
	if err != nil {
		fmt.Fprintf(stderr, "tidepool %s: %v\n", cmd, err)
		return exitUsage
	}
	client.QuietKitexLogs()
	c, err := client.New(f.socket)
	if err != nil {
		fmt.Fprintf(stderr, "tidepool %s: %v\n", cmd, err)
		return exitUsage
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	cc := clientCmd{c: c, f: f, stdin: stdin, stdout: stdout, stderr: stderr, args: args}
	code, err := cc.run(ctx, cmd, keys)
	if err != nil {
		if f.json {
			json.NewEncoder(stdout).Encode(map[string]any{"error": err.Error(), "code": client.CodeOf(err).String()})
		}
		fmt.Fprintf(stderr, "tidepool %s: %v\n", cmd, err)
		if errors.Is(err, errUsage) {
			return exitUsage
		}
		return exitError
	}
	return code
}

var errUsage = errors.New("usage")

func parseKeys(args []string, cmd string, hexKeys bool) ([][]byte, error) {
	var raw []string
	switch cmd {
	case "put":
		if len(args) < 1 || len(args) > 2 {
			return nil, errors.New("want KEY [FILE|-]")
		}
		raw = args[:1]
	case "get", "delete":
		if len(args) != 1 {
			return nil, errors.New("want exactly one KEY")
		}
		raw = args
	case "exists", "lookup":
		if len(args) == 0 {
			return nil, errors.New("want at least one KEY")
		}
		raw = args
	case "clear", "stat", "members":
		if len(args) != 0 {
			return nil, fmt.Errorf("takes no arguments (got %q)", args[0])
		}
	}
	keys := make([][]byte, len(raw))
	for i, s := range raw {
		if hexKeys {
			b, err := hex.DecodeString(s)
			if err != nil {
				return nil, fmt.Errorf("key %q is not hex: %v", s, err)
			}
			keys[i] = b
		} else {
			keys[i] = []byte(s)
		}
	}
	return keys, nil
}

type clientCmd struct {
	c      *client.Client
	f      clientFlags
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	args   []string
	scope  client.Scope // --scope, parsed
}

func (cc clientCmd) printJSON(v any) {
	enc := json.NewEncoder(cc.stdout)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// showKey renders a key for humans: as text when it is printable UTF-8.
func showKey(k []byte, hexKeys bool) string {
	if hexKeys || !utf8.Valid(k) {
		return hex.EncodeToString(k)
	}
	return string(k)
}

// run runs the client command cmd on its parsed keys.
func (cc clientCmd) run(ctx context.Context, cmd string, keys [][]byte) (int, error) {
	scope, err := scopeOf(cc.f.scope) // "" (default) for the commands without --scope
	if err != nil {
		return exitUsage, err
	}
	cc.scope = scope
	switch cmd {
	case "put":
		return cc.cmdPut(ctx, keys)
	case "get":
		return cc.cmdGet(ctx, keys)
	case "exists":
		return cc.cmdExists(ctx, keys)
	case "lookup":
		return cc.cmdLookup(ctx, keys)
	case "delete":
		return cc.cmdDelete(ctx, keys)
	case "clear":
		return cc.cmdClear(ctx)
	case "members":
		return cc.cmdMembers(ctx)
	case "stat":
		return cc.cmdStat(ctx)
	}
	return exitUsage, fmt.Errorf("%w: unknown command %q", errUsage, cmd)
}

// cmdPut stores a block, its value read from a file or standard input.
func (cc clientCmd) cmdPut(ctx context.Context, keys [][]byte) (int, error) {
	c, f := cc.c, cc.f
	var r io.Reader = cc.stdin
	if len(cc.args) == 2 && cc.args[1] != "-" {
		fh, err := os.Open(cc.args[1])
		if err != nil {
			return exitError, err
		}
		defer fh.Close()
		r = fh
	}
	value, err := io.ReadAll(r)
	if err != nil {
		return exitError, fmt.Errorf("reading value: %w", err)
	}
	existed, err := c.PutWith(ctx, f.ns, keys[0], value, client.PutOptions{Depth: int32(f.depth), Durable: f.durable})
	if err != nil {
		return exitError, err
	}
	if f.json {
		cc.printJSON(map[string]any{"key": showKey(keys[0], f.hexKeys), "bytes": len(value), "existed": existed})
	} else if existed {
		fmt.Fprintf(cc.stdout, "exists %s (unchanged)\n", showKey(keys[0], f.hexKeys))
	} else {
		fmt.Fprintf(cc.stdout, "stored %s (%d bytes)\n", showKey(keys[0], f.hexKeys), len(value))
	}
	return exitOK, nil
}

// cmdGet prints a block's bytes, or writes them to --out.
func (cc clientCmd) cmdGet(ctx context.Context, keys [][]byte) (int, error) {
	c, f := cc.c, cc.f
	value, found, err := c.Get(ctx, f.ns, keys[0], cc.scope)
	if err != nil {
		return exitError, err
	}
	if !found {
		if f.json {
			cc.printJSON(map[string]any{"key": showKey(keys[0], f.hexKeys), "found": false})
		}
		fmt.Fprintf(cc.stderr, "tidepool get: %s: not found\n", showKey(keys[0], f.hexKeys))
		return exitNotFound, nil
	}
	if f.out != "" {
		if err := os.WriteFile(f.out, value, 0o644); err != nil {
			return exitError, err
		}
	}
	switch {
	case f.json:
		// Values are bytes: JSON carries them as base64.
		cc.printJSON(map[string]any{"key": showKey(keys[0], f.hexKeys), "found": true, "bytes": len(value), "value": value})
	case f.out == "":
		cc.stdout.Write(value)
	}
	return exitOK, nil
}

// cmdExists reports, per key, whether the block is present and where.
func (cc clientCmd) cmdExists(ctx context.Context, keys [][]byte) (int, error) {
	c, f := cc.c, cc.f
	res, err := c.BatchExists(ctx, f.ns, keys, cc.scope)
	if err != nil {
		return exitError, err
	}
	all := true
	type row struct {
		Key     string `json:"key"`
		Present bool   `json:"present"`
		Tier    string `json:"tier,omitempty"`
		Node    string `json:"node,omitempty"` // the node holding the block
	}
	rows := make([]row, len(keys))
	for i, r := range res {
		rows[i] = row{showKey(keys[i], f.hexKeys), r.Present, r.Tier, r.NodeID}
		all = all && r.Present
	}
	if f.json {
		cc.printJSON(rows)
	} else {
		for _, r := range rows {
			if r.Present {
				fmt.Fprintf(cc.stdout, "%s\tpresent\t%s\t%s\n", r.Key, r.Tier, r.Node)
			} else {
				fmt.Fprintf(cc.stdout, "%s\tabsent\n", r.Key)
			}
		}
	}
	if !all {
		return exitNotFound, nil
	}
	return exitOK, nil
}

// cmdLookup reports the length of the longest present prefix of keys.
func (cc clientCmd) cmdLookup(ctx context.Context, keys [][]byte) (int, error) {
	c, f := cc.c, cc.f
	n, err := c.Lookup(ctx, f.ns, keys, cc.scope)
	if err != nil {
		return exitError, err
	}
	if f.json {
		cc.printJSON(map[string]any{"matched": n, "keys": len(keys)})
	} else {
		fmt.Fprintf(cc.stdout, "%d of %d leading keys present\n", n, len(keys))
	}
	return exitOK, nil
}

// cmdDelete removes a block.
func (cc clientCmd) cmdDelete(ctx context.Context, keys [][]byte) (int, error) {
	c, f := cc.c, cc.f
	ok, err := c.Delete(ctx, f.ns, keys[0], cc.scope)
	if err != nil {
		return exitError, err
	}
	if f.json {
		cc.printJSON(map[string]any{"key": showKey(keys[0], f.hexKeys), "deleted": ok})
	} else if ok {
		fmt.Fprintf(cc.stdout, "deleted %s\n", showKey(keys[0], f.hexKeys))
	} else {
		fmt.Fprintf(cc.stdout, "%s: not found\n", showKey(keys[0], f.hexKeys))
	}
	if !ok {
		return exitNotFound, nil
	}
	return exitOK, nil
}

// cmdClear removes every block of the namespace.
func (cc clientCmd) cmdClear(ctx context.Context) (int, error) {
	c, f := cc.c, cc.f
	n, err := c.Clear(ctx, f.ns, cc.scope)
	if err != nil {
		return exitError, err
	}
	if f.json {
		cc.printJSON(map[string]any{"ns": f.ns, "removed": n})
	} else {
		fmt.Fprintf(cc.stdout, "removed %d blocks from %s\n", n, f.ns)
	}
	return exitOK, nil
}

// cmdMembers lists the cluster view.
func (cc clientCmd) cmdMembers(ctx context.Context) (int, error) {
	c, f := cc.c, cc.f
	ms, err := c.Members(ctx)
	if err != nil {
		return exitError, err
	}
	if f.json {
		cc.printJSON(ms)
		return exitOK, nil
	}
	fmt.Fprintf(cc.stdout, "%-24s %-8s %-22s %-22s %s\n", "NAME", "STATE", "GOSSIP", "PEER API", "ZONE")
	for _, m := range ms {
		name := m.Name
		if m.Self {
			name += " (self)"
		}
		fmt.Fprintf(cc.stdout, "%-24s %-8s %-22s %-22s %s\n", name, m.State, m.GossipAddr, m.PeerAddr, m.Zone)
	}
	return exitOK, nil
}

// cmdStat prints the tiers and namespaces.
func (cc clientCmd) cmdStat(ctx context.Context) (int, error) {
	c, f := cc.c, cc.f
	ns := ""
	if f.nsSet {
		ns = f.ns
	}
	st, err := c.Stats(ctx, ns)
	if err != nil {
		return exitError, err
	}
	if f.json {
		cc.printJSON(st)
		return exitOK, nil
	}
	fmt.Fprintf(cc.stdout, "node %s, up %s\n", st.NodeId, (time.Duration(st.UptimeMs) * time.Millisecond).String())
	fmt.Fprintf(cc.stdout, "%-6s %12s %12s %10s %10s %10s %10s\n", "TIER", "CAPACITY", "USED", "BLOCKS", "HITS", "MISSES", "EVICTED")
	for _, t := range st.Tiers {
		fmt.Fprintf(cc.stdout, "%-6s %12d %12d %10d %10d %10d %10d\n", t.Name, t.CapacityBytes, t.UsedBytes, t.Blocks, t.Hits, t.Misses, t.Evictions)
	}
	fmt.Fprintf(cc.stdout, "%-24s %10s %12s %10s %10s %10s\n", "NAMESPACE", "BLOCKS", "BYTES", "HITS", "MISSES", "PUTS")
	for _, n := range st.Namespaces {
		fmt.Fprintf(cc.stdout, "%-24s %10d %12d %10d %10d %10d\n", n.Ns, n.Blocks, n.Bytes, n.Hits, n.Misses, n.Puts)
	}
	return exitOK, nil
}
