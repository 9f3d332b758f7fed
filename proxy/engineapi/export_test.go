package engineapi

// LentRequests returns how many requests s decoded from lent buffers.
func LentRequests(s *Server) int64 { return s.lender.Lent() }

// InPlacePutArgs encodes a Put call's arguments as the Go client writes
// them (putsock_fuzz_test.go).
var InPlacePutArgs = inPlaceArgs

// ValuelessRequest is a Put call's request field with no value, then the
// arguments' stop (putsock_fuzz_test.go).
var ValuelessRequest = valuelessRequest
