// Package issue5 holds the eviction-policy research of issue 5 (December
// 2026) that docs/policy.md cites: the class-oracle experiment
// (class_oracle_test.go, compiled only with the research build tag), the
// trace analyses (issue5_trace_analysis.py) and the patch of experimental
// knobs for cache/evict (issue5-2026-12-02.patch). None of it is part of
// the product; README.md says how to reproduce each figure.
//
// `make test` runs `go vet -tags research ./...`, so the experiment keeps
// compiling against cache/evict and its simulator (cache/evict/sim).
package issue5
