//go:build race

package evict_test

// prefixRaceEnabled trims the trace simulations under the race detector,
// which slows them about tenfold.
const prefixRaceEnabled = true
