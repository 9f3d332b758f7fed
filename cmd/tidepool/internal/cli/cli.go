// Package cli is the command plumbing that the tidepool command and its
// tools share: exit codes, the streams a command reads and writes, and
// cobra helpers.
package cli

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

// Exit codes of every command, listed in the root help (exitCodesHelp)
// and in docs/cli.md.
const (
	ExitOK       = 0
	ExitError    = 1 // the command failed (the sidecar answered an error, a file could not be read, ...)
	ExitUsage    = 2 // bad command line or configuration: unknown command or flag, bad value, missing argument
	ExitNotFound = 3 // get/exists/delete of an absent key
)

// ExitStatus ends a command with an exit code. A nil err means the command
// already said why on stderr; run prints err otherwise.
type ExitStatus struct {
	Code int
	Err  error
}

func (e *ExitStatus) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitStatus) Unwrap() error { return e.Err }

// ExitWith turns the exit code of a command body (which printed its own
// messages) into RunE's result.
func ExitWith(code int) error {
	if code == ExitOK {
		return nil
	}
	return &ExitStatus{Code: code}
}

// Stdio is where a command reads and writes.
type Stdio struct {
	In       io.Reader
	Out, Err io.Writer
}

// UsageError is a bad command line found by a command itself.
func UsageError(format string, a ...any) error {
	return &ExitStatus{Code: ExitUsage, Err: fmt.Errorf(format, a...)}
}

// Command groups of the root help.
const (
	GroupSidecar = "sidecar"
	GroupClient  = "client"
	GroupTools   = "tools"
)

// NoArgs refuses any argument, as a usage error.
func NoArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if !cmd.HasParent() {
		msg := fmt.Sprintf("unknown command %q", args[0])
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return UsageError("%s", msg)
	}
	return UsageError("unexpected argument %q", args[0])
}

// CompleteWords completes a flag's value from a fixed list.
func CompleteWords(cmd *cobra.Command, flag string, words ...string) {
	cmd.RegisterFlagCompletionFunc(flag, cobra.FixedCompletions(words, cobra.ShellCompDirectiveNoFileComp))
}

// EnvOr returns the environment variable k, or def when it is unset or
// empty.
func EnvOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
