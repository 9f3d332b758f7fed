package sim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tidepool-kv/tidepool/internal/trace"
)

// ConversationTrace is the file name of the Mooncake FAST'25 conversation
// trace in the shared traces folder.
const ConversationTrace = "conversation_trace.jsonl"

// ErrNoTrace is returned by FindTrace when the file is in none of the places
// it looks.
var ErrNoTrace = errors.New("sim: trace file not found")

// FindTrace locates a trace file of the shared traces folder. It tries, in
// order: $TIDEPOOL_TRACE (a file, or a folder holding name), then
// ../shared/traces/name relative to the module root (the layout in CI, where
// the repository is cloned next to a copy of shared/), then
// /work/shared/traces/name.
func FindTrace(name string) (string, error) {
	var tried []string
	try := func(p string) bool {
		tried = append(tried, p)
		st, err := os.Stat(p)
		return err == nil && st.Mode().IsRegular()
	}
	if env := os.Getenv("TIDEPOOL_TRACE"); env != "" {
		if st, err := os.Stat(env); err == nil && st.IsDir() {
			env = filepath.Join(env, name)
		}
		if try(env) {
			return env, nil
		}
	}
	if root, ok := moduleRoot(); ok {
		if p := filepath.Join(root, "..", "shared", "traces", name); try(p) {
			return p, nil
		}
	}
	if p := filepath.Join("/work/shared/traces", name); try(p) {
		return p, nil
	}
	return "", fmt.Errorf("%w: %s (tried %q; set TIDEPOOL_TRACE)", ErrNoTrace, name, tried)
}

// moduleRoot walks up from the working directory to the folder holding
// go.mod.
func moduleRoot() (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// LoadTrace finds and reads a trace file of the shared traces folder.
func LoadTrace(name string) ([]trace.Request, error) {
	p, err := FindTrace(name)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := trace.Read(f)
	if err != nil {
		return nil, fmt.Errorf("sim: %s: %w", p, err)
	}
	return reqs, nil
}
