package tidepool_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// The import table of DESIGN.md §2, enforced: each rule names a package
// prefix and what its non-test imports may include beyond the standard
// library. Anything of ours not listed is forbidden; third-party imports are
// checked against the allowed list.
const module = "github.com/tidepool-kv/tidepool"

type rule struct {
	pkg        string   // package path prefix relative to the module
	ours       []string // our packages (prefixes) it may import
	never      []string // our packages (prefixes) it must not import, though ours matches them
	thirdParty []string // third-party module prefixes it may import
}

// noTier: the proxy and its edges see the store through cache's vocabulary
// and the interfaces of proxy/store.go, never through a tier's package.
var noTier = []string{"cache/"}

var rules = []rule{
	{pkg: "protocol/gen", ours: []string{"protocol/gen"}, thirdParty: []string{"github.com/cloudwego/", "github.com/apache/thrift"}},
	// The guard around Kitex's codec that both Thrift servers use.
	{pkg: "protocol/safecodec", ours: nil, thirdParty: []string{"github.com/cloudwego/"}},
	// The transfer frame's CRC-32C is the store's (internal/crc32c, a leaf).
	// The stream decoder of the two socket paths that bypass Kitex.
	{pkg: "protocol/thriftstream", ours: nil, thirdParty: []string{"github.com/cloudwego/"}},
	{pkg: "protocol/frame", ours: []string{"internal/crc32c"}, thirdParty: nil},
	{pkg: "protocol", ours: nil, thirdParty: nil},
	// Test helpers, imported by _test.go files only (so any package's tests
	// may use them): the poll-until helper and the reader of the shared
	// wire vectors (protocol/testdata); the standard library alone.
	{pkg: "internal/poll", ours: nil, thirdParty: nil},
	{pkg: "internal/testvec", ours: nil, thirdParty: nil},
	// internal/ holds leaves only: no arrow back up into another room.
	{pkg: "internal", ours: []string{"internal/"}, thirdParty: []string{"go.uber.org/zap", "golang.org/x/sys"}},
	{pkg: "cache/ssd", ours: []string{"cache", "internal/"}, thirdParty: []string{"github.com/linxGnu/grocksdb", "go.uber.org/zap", "golang.org/x/sys", "golang.org/x/sync"}},
	// The GPU end: the CUDA driver loaded at run time through purego.
	{pkg: "cache/gpu", ours: []string{"cache", "internal/"}, thirdParty: []string{"github.com/ebitengine/purego", "go.uber.org/zap"}},
	{pkg: "cache", ours: []string{"cache", "internal/"}, thirdParty: []string{"go.uber.org/zap", "golang.org/x/sys", "golang.org/x/sync"}},
	{pkg: "cluster", ours: []string{"cluster", "internal/"}, thirdParty: []string{"github.com/hashicorp/memberlist", "github.com/buraksezer/consistent", "github.com/cespare/xxhash", "go.uber.org/zap", "golang.org/x/sync"}},
	{pkg: "rdma", ours: []string{"rdma", "internal/", "protocol/frame"}, thirdParty: []string{"go.uber.org/zap", "golang.org/x/sys", "golang.org/x/sync"}},
	// The one error table of both Thrift edges: core sentinels and the
	// generated enum, no Kitex.
	{pkg: "proxy/wirecode", ours: []string{"proxy", "cache", "rdma", "protocol/gen/tidepool"}, never: noTier, thirdParty: nil},
	{pkg: "proxy/peerapi", ours: []string{"proxy", "cache", "cluster", "rdma", "protocol", "internal/"}, never: noTier, thirdParty: []string{"github.com/cloudwego/", "go.uber.org/zap"}},
	{pkg: "proxy/clusterview", ours: []string{"proxy", "cache", "cluster", "internal/"}, never: noTier, thirdParty: []string{"go.uber.org/zap"}},
	{pkg: "proxy/engineapi", ours: []string{"proxy", "cache", "protocol", "internal/"}, never: noTier, thirdParty: []string{"github.com/cloudwego/", "go.uber.org/zap"}},
	// The KV-event publisher: cache's vocabulary (Observer, BlockMeta), its
	// own ZeroMQ wire; the proxy and the tiers reach it through interfaces.
	{pkg: "proxy/kvevents", ours: []string{"cache", "internal/"}, never: noTier, thirdParty: []string{"go.uber.org/zap"}},
	{pkg: "proxy", ours: []string{"proxy", "cache", "cluster", "rdma", "internal/"}, never: noTier, thirdParty: []string{"go.uber.org/zap", "golang.org/x/sync"}},
	// Sidecar injection: the mutation knows Kubernetes' types, not tidepool's
	// wire; the webhook adapter alone knows controller-runtime.
	{pkg: "inject/admit", ours: []string{"inject"}, thirdParty: []string{"k8s.io/api", "k8s.io/apimachinery", "sigs.k8s.io/controller-runtime", "go.uber.org/zap"}},
	{pkg: "inject", ours: []string{"internal/units"}, thirdParty: []string{"gopkg.in/yaml.v3", "k8s.io/api", "k8s.io/apimachinery"}},
	// The client library: the wire, the checksum of its zero-copy puts and
	// the protection key that guards their writable mapping.
	{pkg: "client", ours: []string{"protocol", "client", "internal/crc32c", "internal/pkey", "internal/memfd"}, thirdParty: []string{"github.com/cloudwego/"}},
	// The binary's tools (bench, replay, their plots) and the command
	// plumbing they share: they reach a sidecar as an engine does, through
	// the client library and the binary's own serve, never through the
	// core; the one core package they run is the eviction simulator
	// (replay --sim).
	{pkg: "cmd/tidepool/internal", ours: []string{"cmd/tidepool/internal/", "client", "protocol", "internal/", "cache/evict"}, thirdParty: []string{"github.com/spf13/cobra", "golang.org/x/sys", "gonum.org/v1/plot"}},
	{pkg: "cmd", ours: []string{""}, thirdParty: []string{""}},
	// Research code (experiments build only with -tags research).
	{pkg: "research", ours: []string{"cache", "internal/"}, thirdParty: nil},
}

// Only the named package may import these libraries.
var owners = map[string]string{
	"github.com/hashicorp/memberlist": "cluster",
	"github.com/linxGnu/grocksdb":     "cache/ssd",
	"github.com/ebitengine/purego":    "cache/gpu",
}

type pkgInfo struct {
	ImportPath string
	Imports    []string
	Standard   bool
}

func listPackages(t *testing.T) []pkgInfo {
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkgInfo
	for dec.More() {
		var p pkgInfo
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func isStd(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".")
}

func hasPrefix(rel, prefix string) bool {
	if prefix == "" {
		return true
	}
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(rel, prefix)
	}
	return rel == prefix || strings.HasPrefix(rel, prefix+"/")
}

func ruleFor(rel string) *rule {
	for i := range rules {
		if hasPrefix(rel, rules[i].pkg) {
			return &rules[i]
		}
	}
	return nil
}

func TestImportRules(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < 5 {
		t.Fatalf("only %d packages listed", len(pkgs))
	}
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if rel == "" {
			continue // this test's own package
		}
		r := ruleFor(rel)
		if r == nil {
			t.Errorf("%s: no import rule; add it to arch_test.go and DESIGN.md §2", rel)
			continue
		}
		for _, imp := range p.Imports {
			if isStd(imp) {
				continue
			}
			if owner, ok := owners[modulePrefix(imp)]; ok && !hasPrefix(rel, owner) {
				t.Errorf("%s imports %s; only %s may", rel, imp, owner)
			}
			if strings.HasPrefix(imp, module+"/") {
				ir := strings.TrimPrefix(imp, module+"/")
				if !r.allows(ir) {
					t.Errorf("%s imports %s, which DESIGN.md §2 forbids", rel, ir)
				}
				continue
			}
			if !anyPrefix(imp, r.thirdParty) {
				t.Errorf("%s imports third-party %s, not allowed for it", rel, imp)
			}
		}
	}
}

// allows reports whether the rule lets its packages import ir, one of
// ours (relative to the module).
func (r *rule) allows(ir string) bool {
	return anyPrefix(ir, r.ours) && !anyPrefix(ir, r.never)
}

// TestProxyImportsNoTier: the rules keep every tier out of the proxy and
// its sub-packages, and still let them import cache's vocabulary.
func TestProxyImportsNoTier(t *testing.T) {
	for _, tc := range []struct {
		pkg, imp string
		want     bool
	}{
		{"proxy", "cache", true},
		{"proxy", "cache/dram", false},
		{"proxy", "cache/ssd", false},
		{"proxy", "cache/tiered", false},
		{"proxy", "cache/evict", false},
		{"proxy/engineapi", "cache/dram", false},
		{"proxy/peerapi", "cache/dram", false},
		{"proxy/peerapi", "cache", true},
		{"proxy/clusterview", "cache/tiered", false},
		{"cmd/tidepool", "cache/tiered", true},
		{"cache/tiered", "cache/dram", true},
	} {
		r := ruleFor(tc.pkg)
		if r == nil {
			t.Fatalf("%s: no rule", tc.pkg)
		}
		if got := r.allows(tc.imp); got != tc.want {
			t.Errorf("%s importing %s: allowed %v, want %v", tc.pkg, tc.imp, got, tc.want)
		}
	}
}

func modulePrefix(imp string) string {
	for owner := range owners {
		if imp == owner || strings.HasPrefix(imp, owner+"/") {
			return owner
		}
	}
	return ""
}

func anyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if p == "" || strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
