// Command tidepool is the KV-cache sidecar and its command-line client.
//
//	tidepool serve                    run the sidecar (embedded defaults)
//	tidepool put KEY [FILE]           store a block (value from FILE or stdin)
//	tidepool get KEY [-o FILE]        print a block's bytes
//	tidepool exists KEY...            presence per key
//	tidepool lookup KEY...            length of the longest present prefix
//	tidepool delete KEY               remove a block
//	tidepool clear                    remove every block of a namespace
//	tidepool stat                     tiers and namespaces
//	tidepool members                  the cluster view
//	tidepool prefetch KEY...          bring blocks from SSD into DRAM
//	tidepool bench                    load generator
//	tidepool replay                   replay a request trace
//	tidepool inject [FILE]...         add the sidecar to Kubernetes YAML
//	tidepool webhook                  the same as a mutating admission webhook
//	tidepool version                  print the version
//	tidepool completion SHELL         shell completion (bash, zsh, fish)
//
// The command tree is spf13/cobra's (flags are pflag's): flags go before or
// after the arguments, every command has --help, and the exit status is
// one of the codes below. docs/cli.md describes it.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/benchcmd"
	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/cli"
	"github.com/tidepool-kv/tidepool/cmd/tidepool/internal/replaycmd"
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

// The command plumbing shared with the tools (cmd/tidepool/internal/cli),
// by short names.
const (
	exitOK       = cli.ExitOK
	exitError    = cli.ExitError
	exitUsage    = cli.ExitUsage
	exitNotFound = cli.ExitNotFound

	groupSidecar = cli.GroupSidecar
	groupClient  = cli.GroupClient
	groupTools   = cli.GroupTools
)

type stdio = cli.Stdio

var (
	exitWith      = cli.ExitWith
	usageError    = cli.UsageError
	noArgs        = cli.NoArgs
	completeWords = cli.CompleteWords
	envOr         = cli.EnvOr
)

const exitCodesHelp = `Exit status:
  0  success
  1  error (the sidecar or the system refused the command)
  2  usage error: unknown command or flag, bad flag value or argument,
     invalid serve configuration
  3  not found: get or delete of an absent key, exists with any key absent`

const rootLong = `tidepool: a KV-cache sidecar for LLM inference pods.

'tidepool serve' runs the sidecar; the client commands call a running one
over its Unix socket. Flags may come before or after the arguments; put
'--' before a key that starts with '-'. Client commands take --socket
(env TIDEPOOL_SOCKET), --ns (env TIDEPOOL_NS), --hex (keys are hex bytes)
and --json. Run 'tidepool <command> --help' for a command's flags.

` + exitCodesHelp

func init() {
	cobra.EnableCommandSorting = false // the help lists commands in the order they are added
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one command line and returns its exit status: exitOK, or
// the code of a *cli.ExitStatus, or exitUsage for what cobra and pflag reject
// before a command runs (unknown command or flag, a flag value of the
// wrong type). Help (--help, -h, 'tidepool help CMD') goes to stdout and
// exits 0.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if args == nil {
		args = []string{} // cobra reads os.Args when given nil
	}
	root := newRootCmd(&stdio{In: stdin, Out: stdout, Err: stderr})
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	if ee, ok := errors.AsType[*cli.ExitStatus](err); ok {
		if ee.Err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), ee.Err)
		}
		if ee.Code == exitUsage && ee.Err != nil {
			fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		return ee.Code
	}
	// Not a command's own error: the command line was refused.
	fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", cmd.CommandPath(), err, cmd.CommandPath())
	return exitUsage
}

// newRootCmd builds the command tree; each call is independent (tests run
// several in one process).
func newRootCmd(io *stdio) *cobra.Command {
	root := &cobra.Command{
		Use:           "tidepool",
		Short:         "a KV-cache sidecar for LLM inference pods",
		Long:          rootLong,
		Version:       buildVersion(),
		SilenceErrors: true, // run prints errors, with the exit code's meaning
		SilenceUsage:  true,
		Args:          noArgs, // "tidepool frobnicate" is an unknown command
		// No command: the usage, as a usage error.
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprint(io.Err, cmd.UsageString())
			return &cli.ExitStatus{Code: exitUsage}
		},
	}
	root.SetIn(io.In)
	root.SetOut(io.Out)
	root.SetErr(io.Err)
	root.SetVersionTemplate("tidepool {{.Version}} (" + goVersion + ")\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &cli.ExitStatus{Code: exitUsage, Err: err}
	})
	root.AddGroup(
		&cobra.Group{ID: groupSidecar, Title: "Sidecar:"},
		&cobra.Group{ID: groupClient, Title: "Client commands (call a running sidecar):"},
		&cobra.Group{ID: groupTools, Title: "Tools:"},
	)
	root.AddCommand(newServeCmd(io))
	root.AddCommand(clientCommands(io)...)
	root.AddCommand(newPrefetchCmd(io), benchcmd.NewCommand(io, defaultSocket()), replaycmd.NewCommand(io, policies), newInjectCmd(io), newWebhookCmd(io))
	root.AddCommand(&cobra.Command{
		Use:               "version",
		Short:             "print the version",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(*cobra.Command, []string) error {
			fmt.Fprintf(io.Out, "tidepool %s (%s)\n", buildVersion(), goVersion)
			return nil
		},
	})
	// cobra adds "help" and "completion" (bash, zsh, fish, powershell).
	return root
}

const serveLong = `Runs the sidecar. Settings come from flags, then TIDEPOOL_* variables, then
the YAML file (--config or TIDEPOOL_CONFIG), then embedded defaults; each
flag is a key of the file with '-' for '_'. See docs/config.md.

An invalid configuration exits with status 2, a failure while serving
with status 1; SIGTERM or SIGINT stops it cleanly (status 0).`

// newServeCmd is `tidepool serve`; its flags are generated from the
// settings table (bindFlags).
func newServeCmd(io *stdio) *cobra.Command {
	cmd := &cobra.Command{
		Use:               "serve [flags]",
		Short:             "run the sidecar (no flags: embedded defaults)",
		Long:              serveLong,
		GroupID:           groupSidecar,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	fs := cmd.Flags()
	fs.SortFlags = false // the table's order
	configPath := fs.String("config", "", "YAML config file (env TIDEPOOL_CONFIG)")
	vals := bindFlags(fs)
	completeWords(cmd, "log-level", "debug", "info", "warn", "error")
	completeWords(cmd, "log-format", "json", "console")
	completeWords(cmd, "eviction-policy", "prefix", "lru")
	completeWords(cmd, "transport", "auto", "tcp", "rdma")
	for _, s := range settings {
		if s.kind == "true|false" {
			completeWords(cmd, s.flagName(), "true", "false")
		}
	}
	cmd.RunE = func(*cobra.Command, []string) error {
		return exitWith(cmdServe(fs, vals, *configPath, io.Out, io.Err))
	}
	return cmd
}
