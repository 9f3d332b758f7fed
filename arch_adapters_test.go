package tidepool_test

import (
	"strings"
	"testing"
)

// TestAdaptersApart: the import table's prefixes let a proxy sub-package
// import any other; these pairs are forbidden all the same. The two Thrift
// adapters share the error table (proxy/wirecode) instead of importing each
// other, and the core imports none of the packages that know the wire.
func TestAdaptersApart(t *testing.T) {
	forbidden := map[string][]string{
		"proxy":           {"proxy/wirecode", "proxy/engineapi", "proxy/peerapi", "protocol"},
		"proxy/engineapi": {"proxy/peerapi"},
		"proxy/peerapi":   {"proxy/engineapi"},
		"proxy/wirecode":  {"proxy/engineapi", "proxy/peerapi", "proxy/clusterview"},
	}
	seen := 0
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		bad, ok := forbidden[rel]
		if !ok {
			continue
		}
		seen++
		for _, imp := range p.Imports {
			ir, ours := strings.CutPrefix(imp, module+"/")
			if !ours {
				continue
			}
			for _, b := range bad {
				if hasPrefix(ir, b) {
					t.Errorf("%s imports %s; it must not", rel, ir)
				}
			}
		}
	}
	if seen != len(forbidden) {
		t.Fatalf("found %d of the %d packages", seen, len(forbidden))
	}
}
